"""The sections of a scenario besides [aggregation] and [attack] (:mod:`peer.config.aggregation`),
each a frozen dataclass checked in ``__post_init__`` (each class's settings tables against its
registry), which :mod:`peer.config.scenario` puts together into a ``Scenario``."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dfedrw.peer.quote import shown
from dfedrw.peer.config.checks import (
    MAX_ABS_VALUE_LIMIT, MAX_CLIENTS, MAX_EDGES, MAX_MAGNITUDE, MAX_ROUNDS, MAX_SECONDS, ScenarioError, check_choice_of, check_flag,
    check_in_range, coerce_value,
)
from dfedrw.peer.config.tables import Params, checked_params, resolve_class, toml_key
from dfedrw.peer.learning.datasets import dataset_layout, natural_groups_error
from dfedrw.peer.registry import Setting, settings_of
from dfedrw.peer.graph.schedule import SCHEDULE_REGISTRY
from dfedrw.peer.graph.topology import TOPOLOGY_REGISTRY
from dfedrw.peer.transport.compression import COMPRESSION_REGISTRY
from dfedrw.peer.transport.kinds import TRANSPORT_REGISTRY
from dfedrw.topologies import PLACEMENTS


@dataclass(frozen=True)
class DataConfig:
    name: str = "digits"
    dir: str = ""
    partition: str = "iid"
    aux_fraction: float = 0.1
    local_test_size: int = 1000
    # labelskew:H: "cyclic" (each class held by equally many clients) or "random" (each draws H).
    labelskew_assign: str = "cyclic"
    # Each local step's minibatch augmented (images only): "none", "crop" (padded by
    # augment_padding zeros and cropped back at a random offset) or "crop_flip" (then mirrored
    # with probability 1/2), drawn from each client's own seeded generator.
    augment: str = "none"
    augment_padding: int = 4
    # The settings tables [data.NAME] (every one given is checked, the named one is used).
    params: Params = ()

    def __post_init__(self) -> None:
        settings = checked_params("dataset", self.name, self.params, "data.name")
        try:
            source = dataset_layout(self.name, settings, self.dir)
        except ValueError as exc:
            raise ScenarioError(f"[data.{toml_key(self.name)}]: {' '.join(str(exc).split())}") from None
        check_choice_of("data.labelskew_assign", self.labelskew_assign, ("cyclic", "random"))
        check_choice_of("data.augment", self.augment, ("none", "crop", "crop_flip"))
        check_in_range("data.augment_padding", self.augment_padding, 0, 64)
        if self.augment != "none":
            from dfedrw.peer.learning.datasets import input_shape_of

            shape = input_shape_of(source)
            if len(shape) != 3:
                raise ScenarioError(f"data.augment={shown(self.augment)} needs images; data.name={shown(self.name)} declares input_shape = {shape}")
        p = self.partition
        kind, _, arg = p.partition(":")
        if kind == "iid" and arg in ("", "balanced"):
            pass
        elif p == "natural":
            # A set that does not say whether it has groups is found out when it is loaded.
            if getattr(source, "natural_groups", None) is False:
                raise ScenarioError(natural_groups_error(source))
        elif kind == "dirichlet" and arg:
            try:
                alpha = float(arg)
            except ValueError:
                alpha = -1.0
            if not (0 < alpha <= MAX_MAGNITUDE):
                raise ScenarioError(f"data.partition={shown(p)}: dirichlet:ALPHA needs 0 < ALPHA <= {MAX_MAGNITUDE:g}")
        elif kind == "labelskew" and arg:
            if not arg.isdigit() or not 1 <= int(arg) <= 1_000_000:
                raise ScenarioError(f"data.partition={shown(p)}: labelskew:H needs an integer H in [1, 1_000_000]")
        else:
            raise ScenarioError(
                f"data.partition={shown(p)} is not valid; use iid, iid:balanced, dirichlet:ALPHA, labelskew:H or natural"
            )
        check_in_range("data.aux_fraction", self.aux_fraction, 0.0, 1.0, open_lo=True)
        # Capped by the test set's size when drawn; the bound only refuses nonsense.
        check_in_range("data.local_test_size", self.local_test_size, 1, 10_000_000)


@dataclass(frozen=True)
class TrainConfig:
    model: str = "softmax_regression"
    hidden: int = 64
    lr: float = 0.01
    batch_size: int = 32
    local_steps: int = 1
    # > 0: each round that many passes over the client's shard instead of local_steps.
    local_epochs: float = 0.0
    # SGD with momentum and weight decay as torch.optim.SGD's; the momentum buffer stays local.
    momentum: float = 0.0
    weight_decay: float = 0.0
    # lr by round: "constant", "step" (times lr_gamma every lr_step rounds), "cosine" (towards 0).
    lr_schedule: str = "constant"
    lr_gamma: float = 0.1
    lr_step: int = 100
    # "shared": every client starts from the same seeded initialisation (the usual DFL set-up);
    # "per_client": each client draws its own; "zeros": all parameters start at 0.
    init: str = "shared"
    # Each client's compute speed in (0, 1]: at speed s a client takes 1/s times as long over its
    # local steps and its aggregation (scoring included) as this machine does, waiting the
    # difference out after each; 1 = as fast as the machine runs it. [peers.K] speed overrides it.
    speed: float = 1.0
    # Uneven speeds: 0 = every client at train.speed; s in (0, 1) = each client's speed drawn
    # uniformly from [speed * (1 - s), speed], seeded by the run's seed and the client's id.
    speed_spread: float = 0.0
    # The settings tables [train.NAME] of models (every one given is checked, the named one is used).
    model_params: Params = ()

    def __post_init__(self) -> None:
        checked_params("model", self.model, self.model_params, "train.model")
        check_choice_of("train.init", self.init, ("shared", "per_client", "zeros"))
        # 65536 hidden units on 784 inputs is already ~200 MB of parameters per message.
        check_in_range("train.hidden", self.hidden, 1, 65_536)
        check_in_range("train.lr", self.lr, 0.0, MAX_MAGNITUDE, open_lo=True)
        check_in_range("train.batch_size", self.batch_size, 1, 1_000_000)
        check_in_range("train.local_steps", self.local_steps, 1, 10_000)
        check_in_range("train.local_epochs", self.local_epochs, 0.0, 1_000.0)
        check_in_range("train.momentum", self.momentum, 0.0, 1.0, open_hi=True)
        check_in_range("train.weight_decay", self.weight_decay, 0.0, MAX_MAGNITUDE)
        check_choice_of("train.lr_schedule", self.lr_schedule, ("constant", "step", "cosine"))
        check_in_range("train.lr_gamma", self.lr_gamma, 0.0, 1.0, open_lo=True)
        check_in_range("train.lr_step", self.lr_step, 1, MAX_ROUNDS)
        check_in_range("train.speed", self.speed, 0.0, 1.0, open_lo=True)
        check_in_range("train.speed_spread", self.speed_spread, 0.0, 1.0, open_hi=True)

    def lr_at(self, r: int, rounds: int) -> float:
        """The learning rate of round ``r`` of ``rounds`` (:func:`peer.learning.training.learning_rate`)."""
        return _learning_rate()(self.lr, self.lr_schedule, r, rounds, gamma=self.lr_gamma, step=self.lr_step)


def check_model(train: TrainConfig, data: DataConfig) -> None:
    """Refuse, in one line at load time, a model that does not fit the data set's shape, building
    neither (see :func:`~dfedrw.peer.learning.models.check_model_fits`)."""
    from dfedrw.peer.learning.datasets import input_shape_of
    from dfedrw.peer.learning.models import check_model_fits

    source = dataset_layout(data.name, settings_of(data.params, data.name), data.dir)
    try:
        check_model_fits(
            train.model, int(source.num_features), int(source.num_classes), hidden=train.hidden, input_shape=input_shape_of(source),
            params=settings_of(train.model_params, train.model),
        )
    except ValueError as exc:
        raise ScenarioError(f"train.model={shown(train.model)} with data.name={shown(data.name)}: {' '.join(str(exc).split())}") from None


@dataclass(frozen=True)
class TopologyConfig:
    kind: str = "erdos_renyi"
    rho: float = 0.7
    file: str = ""
    honest: int = 10
    byzantine: int = 0
    # The settings tables [topology.NAME] (every one given is checked, the named one is used).
    params: Params = ()
    # A graph that changes from round to round (peer/graph/schedule.py): "" keeps the graph of
    # `kind` every round; a schedule draws each round's graph over it (same Byzantine ids).
    schedule: str = ""
    # The settings tables [topology.schedule_params.NAME] of schedules.
    schedule_params: Params = ()
    # Where the Byzantine clients sit: "random" (seeded, before the graph is drawn) or, on the
    # drawn graph (the base graph under a schedule), the most central nodes by "degree",
    # "betweenness" or "eigenvector" centrality, or the least central by degree ("leaf").
    placement: str = "random"

    def __post_init__(self) -> None:
        checked_params("topology", self.kind, self.params, "topology.kind")
        self._check_schedule()
        check_choice_of("topology.placement", self.placement, PLACEMENTS)
        check_in_range("topology.rho", self.rho, 0.0, 1.0, open_lo=True)
        check_in_range("topology.honest", self.honest, 1, MAX_CLIENTS)
        check_in_range("topology.byzantine", self.byzantine, 0, MAX_CLIENTS - 1)
        if self.num_clients > MAX_CLIENTS:
            raise ScenarioError(
                f"topology.honest + topology.byzantine = {self.num_clients} clients; at most {MAX_CLIENTS:_}"
            )
        density = {"erdos_renyi": self.rho, "complete": 1.0}.get(self.kind, 0.0)
        edges = density * self.num_clients * (self.num_clients - 1) / 2  # expected; 0 for the kinds not listed
        if edges > MAX_EDGES:
            raise ScenarioError(
                f"topology.kind={shown(self.kind)} with {self.num_clients:_} clients{f' and rho={self.rho}' if self.kind == 'erdos_renyi' else ''} "
                f"has about {edges:.2g} edges, each a model sent both ways every round; at most {MAX_EDGES:.0e}: "
                "use a sparse graph: topology.kind = \"ring\", or \"erdos_renyi\" with a small topology.rho"
            )
        if not self.file and any(p.name == "file" and p.default is Setting.REQUIRED for p in TOPOLOGY_REGISTRY.parameters(self.kind)):
            raise ScenarioError(f"topology.kind={shown(self.kind)} needs topology.file (an edge-list path)")
        if self.file and not TOPOLOGY_REGISTRY.takes(self.kind, "file"):
            raise ScenarioError(f"topology.file={shown(self.file)} is only read by a topology that takes a file (edgelist), not {shown(self.kind)}")

    def _check_schedule(self) -> None:
        if not isinstance(self.schedule, str):
            raise ScenarioError(f"topology.schedule={shown(self.schedule)}: expected a string")
        # Every table given is checked (the key only names where they sit), the named one used.
        where = "topology.schedule_params.NAME"
        if not self.schedule:
            checked_params("schedule", "redraw", self.schedule_params, where)
            return
        resolve_class("schedule", self.schedule, "topology.schedule")
        settings = checked_params("schedule", self.schedule, self.schedule_params, where)
        # Built with a placeholder graph and Byzantine ids (drawn later): a bad setting fails here.
        import networkx as nx

        supplied = {"num_clients": self.num_clients, "byzantine": frozenset(), "seed": 0, "rho": self.rho, "base": nx.empty_graph(self.num_clients)}
        try:
            SCHEDULE_REGISTRY.build(self.schedule, settings, supplied)
        except ValueError as exc:
            raise ScenarioError(f"topology.schedule={shown(self.schedule)}: {' '.join(str(exc).split())}") from None

    @property
    def num_clients(self) -> int:
        return self.honest + self.byzantine


# The round protocols (network.protocol): with a barrier per round, or asynchronous gossip.
PROTOCOLS = ("sync", "async")


@dataclass(frozen=True)
class NetworkConfig:
    transport: str = "grpc"
    host: str = "127.0.0.1"
    # Seconds a client waits for its neighbours' round-t models before aggregating what it has.
    round_timeout: float = 10.0
    # How many rounds ahead of the receiver a message may be and still be buffered.
    round_window: int = 2
    # After this many consecutive missed deadlines a neighbour is presumed gone and no longer
    # waited for (its messages are still accepted if it comes back).
    max_missed_rounds: int = 2
    # Seconds a neighbour's rounds may stand still (stopped or hung) before a client that stopped
    # waiting for it no longer keeps within round_window rounds of it (peer/client/presence.py).
    stall_timeout: float = 60.0
    connect_timeout: float = 120.0
    chunk_bytes: int = 1 << 20
    max_message_bytes: int = 256 << 20
    # "mutual": every gRPC connection is mutual TLS with the run's own certificates, a message's
    # sender the client its certificate names; "off" (debugging only): plaintext, ids unchecked.
    tls: str = "mutual"
    # Largest parameter magnitude a received model may hold; a message with a larger value is
    # rejected as implausible (finite but huge values would otherwise wreck any averaging rule).
    max_abs_value: float = 1e6
    # Seconds an incoming call may carry no chunk before the receiver ends it, freeing its slot
    # (honest calls carry a message a round); a sender whose call idled half this long opens anew.
    idle_call_timeout: float = 60.0
    # Push/PushOne calls a sender may hold open at once besides its Exchange call (more: refused).
    calls_per_sender: int = 2
    # With a topology schedule a client connects to a peer on first sending to it and closes a
    # channel idle this many seconds (a fixed graph's channels stay open all run).
    idle_channel_timeout: float = 120.0
    # The transports' settings tables [network.NAME] (every one given is checked, the named used).
    transport_params: Params = ()
    # How a model is encoded on the wire (peer/transport/compression.py): "none" (raw float32),
    # "int8" (stochastic rounding), "topk" (the largest differences, with error feedback).
    compression: str = "none"
    # The settings tables [network.compression_params.NAME] of compressions.
    compression_params: Params = ()
    # "sync": rounds with a barrier (a client waits for its neighbours' round-t models, up to
    # round_timeout); "async": gossip without one (peer/client/asynchronous.py), each client at
    # its own speed aggregating the newest model it holds from each neighbour.
    protocol: str = "sync"
    # "async": a held model older than this many of the receiver's steps is skipped (0: never).
    max_staleness: int = 0
    # Honest clients send with each model their rule's scores of the round before (docs/security.md).
    share_scores: bool = False

    def __post_init__(self) -> None:
        settings = checked_params("transport", self.transport, self.transport_params, "network.transport")
        try:
            TRANSPORT_REGISTRY.build(self.transport, settings)
        except ValueError as exc:
            raise ScenarioError(f"[network.{toml_key(self.transport)}]: {' '.join(str(exc).split())}") from None
        if not isinstance(self.compression, str):
            raise ScenarioError(f"network.compression={shown(self.compression)}: expected a string")
        resolve_class("compression", self.compression, "network.compression")
        settings = checked_params("compression", self.compression, self.compression_params, "network.compression_params.NAME")
        try:
            COMPRESSION_REGISTRY.build(self.compression, settings)
        except ValueError as exc:
            raise ScenarioError(f"[network.compression_params.{toml_key(self.compression)}]: {' '.join(str(exc).split())}") from None
        check_in_range("network.max_abs_value", self.max_abs_value, 0.0, MAX_ABS_VALUE_LIMIT, open_lo=True)
        check_choice_of("network.tls", self.tls, ("mutual", "off"))
        if not self.host or any(c.isspace() or c in "/[]" for c in self.host):
            raise ScenarioError(f"network.host={shown(self.host)}: expected an address or host name to listen on, e.g. 127.0.0.1, 0.0.0.0 or ::1")
        check_in_range("network.round_timeout", self.round_timeout, 0.0, MAX_SECONDS, open_lo=True)
        check_in_range("network.round_window", self.round_window, 1, 1000)
        check_in_range("network.max_missed_rounds", self.max_missed_rounds, 1, 1_000_000)
        check_in_range("network.stall_timeout", self.stall_timeout, 0.0, MAX_SECONDS, open_lo=True)
        check_in_range("network.connect_timeout", self.connect_timeout, 0.0, MAX_SECONDS, open_lo=True)
        # gRPC message limits are int32: a chunk plus its framing must stay well below 2 GiB.
        check_in_range("network.chunk_bytes", self.chunk_bytes, 1 << 10, 64 << 20)
        check_in_range("network.max_message_bytes", self.max_message_bytes, 1 << 10, 1 << 30)
        check_in_range("network.idle_call_timeout", self.idle_call_timeout, 0.0, MAX_SECONDS, open_lo=True)
        check_in_range("network.calls_per_sender", self.calls_per_sender, 1, 64)
        check_in_range("network.idle_channel_timeout", self.idle_channel_timeout, 0.0, MAX_SECONDS, open_lo=True)
        check_flag("network.share_scores", self.share_scores)
        check_choice_of("network.protocol", self.protocol, PROTOCOLS)
        check_in_range("network.max_staleness", self.max_staleness, 0, MAX_ROUNDS)
        if self.max_staleness and self.protocol != "async":
            raise ScenarioError(f"network.max_staleness={self.max_staleness} applies to asynchronous gossip only: set network.protocol = \"async\"")

    @property
    def asynchronous(self) -> bool:
        """Whether clients gossip without a round barrier (``protocol = "async"``)."""
        return self.protocol == "async"


@dataclass(frozen=True)
class EvalConfig:
    # Evaluate local and global test accuracy every N rounds (and always after the last); 0 = end only.
    every: int = 50

    def __post_init__(self) -> None:
        check_in_range("eval.every", self.every, 0, MAX_ROUNDS)


@dataclass(frozen=True)
class CheckpointConfig:
    # Every N rounds each client saves its state (model, round, optimizer and RNG state, counters)
    # to its results folder and a restart with its id resumes from it; 0 = off (it starts over).
    every: int = 50

    def __post_init__(self) -> None:
        check_in_range("checkpoint.every", self.every, 0, MAX_ROUNDS)


ENGINES = ("clients", "batched")
# How the batched engine runs many models that have no layer plan (FlatModel.LAYOUTS, or the pick).
ENGINE_LAYOUTS = ("auto", "loop", "vmap")


@dataclass(frozen=True)
class EngineConfig:
    """How a run is computed; not part of what the experiment is (a run's identity leaves it out).

    ``clients``: every client is its own :class:`~dfedrw.peer.client.client.Client`, a process, a
    thread or a torchrun rank as ``network.transport`` says: the deployment and the parity
    reference. ``batched``: one process holds every honest client's model in one tensor and runs
    each round for all at once (no network; deadlines and lost messages on a simulated clock when
    [links], slow clients or [clock] make time matter), calling the same rule and attack classes;
    for experiments (sweeps use it unless a sweep names an engine). ``device``: where the models
    compute ("cpu", "cuda" or "cuda:N"): the batched engine's tensor of models, or each client's
    model and data (under torchrun each rank takes a GPU of its own node when there is one).
    ``threads``: the CPU threads torch may use (its products are small: on a busy machine more
    threads wait on each other more than they help). ``layout``: how the batched engine runs many
    models without a layer plan (the convolutional ones): ``loop`` (one after the other), ``vmap``
    (``torch.func.vmap``: each layer one grouped call for every model), or ``auto`` (the CPU takes
    ``loop``, measured the faster there; another device times both before the first round and
    keeps the faster); the run's summary says which it used.
    """

    name: str = "clients"
    device: str = "cpu"
    threads: int = 1
    layout: str = "auto"

    def __post_init__(self) -> None:
        check_choice_of("engine.name", self.name, ENGINES)
        check_choice_of("engine.layout", self.layout, ENGINE_LAYOUTS)
        check_in_range("engine.threads", self.threads, 1, 1024)
        if not (self.device == "cpu" or self.device == "cuda" or (self.device.startswith("cuda:") and self.device[5:].isdigit())):
            raise ScenarioError(f"engine.device={shown(self.device)}: expected 'cpu', 'cuda' or 'cuda:N'")


LINK_GENERATORS = ("none", "distance")
# ((sender, receiver), ((setting, value), ...)) per directed link given its own settings, sorted.
LinkPairs = tuple[tuple[tuple[int, int], tuple[tuple[str, float], ...]], ...]
LINK_FIELDS = ("latency", "jitter", "bandwidth", "loss")
# Bits per second: far past any link; keeps transfer times finite.
MAX_BANDWIDTH = 1e15


def check_link(prefix: str, latency: float, jitter: float, bandwidth: float, loss: float) -> None:
    """One link's settings: seconds, seconds, bits per second (0: unlimited), a probability."""
    check_in_range(f"{prefix}.latency", latency, 0.0, MAX_SECONDS)
    check_in_range(f"{prefix}.jitter", jitter, 0.0, MAX_SECONDS)
    check_in_range(f"{prefix}.bandwidth", bandwidth, 0.0, MAX_BANDWIDTH)
    check_in_range(f"{prefix}.loss", loss, 0.0, 1.0, open_hi=True)


@dataclass(frozen=True)
class LinksConfig:
    """Emulated links, applied by each sender in user space (:mod:`peer.transport.links`): every
    message waits on its directed link for its transfer (``size / bandwidth``, one message at a
    time per link) and then ``latency`` plus a normal draw of std ``jitter`` (never below 0),
    and is lost with probability ``loss``; every draw seeded by (seed, sender, receiver).

    ``latency`` (s), ``jitter`` (s), ``bandwidth`` (bits per second, 0 = unlimited) and ``loss``
    hold for every link; ``generator = "distance"`` puts the clients at seeded random points of the
    unit square and adds ``latency_per_unit`` seconds per unit of distance to each link's latency;
    ``pairs`` overrides single directed links: ``"I-J" = {latency = ..., ...}`` (from client I to
    J; add "J-I" for both ways). The defaults emulate nothing: a run is as without [links].
    """

    latency: float = 0.0
    jitter: float = 0.0
    bandwidth: float = 0.0
    loss: float = 0.0
    generator: str = "none"
    latency_per_unit: float = 0.0
    pairs: LinkPairs = ()

    def __post_init__(self) -> None:
        check_link("links", self.latency, self.jitter, self.bandwidth, self.loss)
        check_choice_of("links.generator", self.generator, LINK_GENERATORS)
        check_in_range("links.latency_per_unit", self.latency_per_unit, 0.0, MAX_SECONDS)
        if self.latency_per_unit and self.generator != "distance":
            raise ScenarioError(
                f"links.latency_per_unit={shown(self.latency_per_unit)} is read only by links.generator = \"distance\" "
                f"(links.generator={shown(self.generator)})"
            )
        for (src, dst), values in self.pairs:
            settings = dict(values)
            merged = {k: settings.get(k, getattr(self, k)) for k in LINK_FIELDS}
            check_link(f"links.pairs.\"{src}-{dst}\"", **merged)

    @property
    def lossy(self) -> bool:
        """Whether a link may lose a message."""
        return self.loss > 0 or any(dict(values).get("loss", 0.0) > 0 for _, values in self.pairs)

    @property
    def emulates(self) -> bool:
        """Whether any message waits or may be lost (False: the links are left alone)."""
        if self.latency or self.jitter or self.bandwidth or self.loss or self.latency_per_unit:
            return True
        return any(v for _, values in self.pairs for _, v in values)

    def pair_table(self) -> dict[str, dict[str, float]]:
        """``pairs`` as the TOML table it was given as."""
        return {f"{src}-{dst}": dict(values) for (src, dst), values in self.pairs}


def parse_link_pairs(value: Any) -> LinkPairs:
    """``[links.pairs]``: ``"I-J" = {latency = 0.2, ...}`` per directed link, checked and sorted."""
    where = "links.pairs"
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where} must be a table of \"I-J\" = {{latency = ..., bandwidth = ...}}")
    out = []
    for key, table in value.items():
        parts = str(key).split("-")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ScenarioError(f"{where}: {shown(key)}: expected \"I-J\", the ids of the sending and the receiving client")
        src, dst = int(parts[0]), int(parts[1])
        if src == dst:
            raise ScenarioError(f"{where}: {shown(key)}: a link joins two different clients")
        if not isinstance(table, Mapping) or not table:
            raise ScenarioError(f"{where}.\"{key}\" must be a table of some of: {', '.join(LINK_FIELDS)}")
        for k in table:
            if k not in LINK_FIELDS:
                raise ScenarioError(f"unknown key '{where}.\"{key}\".{k}'; valid keys: {', '.join(LINK_FIELDS)}")
        values = tuple(sorted((k, coerce_value(f"{where}.\"{key}\".{k}", v, "float")) for k, v in table.items()))
        out.append(((src, dst), values))
    return tuple(sorted(out))


@dataclass(frozen=True)
class ClockConfig:
    """What a round's computing costs on the batched engine's simulated clock, in seconds of a
    client at speed 1 (a client at ``speed`` s takes 1/s times as long): ``step_seconds`` its local
    steps, ``aggregate_seconds`` its aggregation (scoring included); a Byzantine client trains
    nothing and crafts at once. The client engine measures its own compute and ignores both. The
    defaults cost nothing: a scenario without this section is what it was."""

    step_seconds: float = 0.0
    aggregate_seconds: float = 0.0

    def __post_init__(self) -> None:
        check_in_range("clock.step_seconds", self.step_seconds, 0.0, MAX_SECONDS)
        check_in_range("clock.aggregate_seconds", self.aggregate_seconds, 0.0, MAX_SECONDS)


@functools.cache
def _learning_rate():
    """:func:`peer.learning.training.learning_rate`, imported once, on first use (no torch here)."""
    from dfedrw.peer.learning.training import learning_rate

    return learning_rate
