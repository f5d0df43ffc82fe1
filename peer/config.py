"""Scenario configuration: frozen dataclasses loaded from TOML, overridable with ``key=value``.

A scenario file has the sections below (every key optional; defaults in the dataclasses):

    seed, rounds
    [data]        name, dir, partition, aux_fraction, local_test_size, labelskew_assign
    [train]       model, hidden, lr, batch_size, local_steps, init
    [topology]    kind, rho, file, honest, byzantine, schedule
                  [topology.NAME]  [topology.schedule_params.SCHEDULE]
    [attack]      name                       [attack.NAME]  the attack's settings
    [aggregation] rule, tpm, crs, assumed_byzantine
                  [aggregation.RULE]  [aggregation.tpm_params.TPM]  [aggregation.crs_params.CRS]
    [network]     transport, host, round_timeout, round_window, max_missed_rounds,
                  connect_timeout, chunk_bytes, max_message_bytes, idle_channel_timeout, ...
    [eval]        every
    [checkpoint]  every
    [engine]      name (clients, batched), device, threads
    [peers.K.aggregation]  per-client overrides of any [aggregation] key or table for client K

A rule, TPM, CRS or attack is a class registered by name (peer/registry.py) or an
import path ``module:Class``; its constructor's parameters are its settings, set in its own
table (``[aggregation.balance] gamma = 2``, ``[attack.alie] z = 1.5``) and checked by the class.
Loading a scenario builds every rule, TPM, CRS and attack it configures once, so a bad value
fails here with one line, in every entry point. The flat keys of earlier versions
(``aggregation.balance_gamma``, ``attack.std``, ...: :mod:`peer.config_legacy`) are still read,
and a scenario's identity (:func:`scenario_changes`) is written with them where they exist, so runs
of earlier versions keep their folder hashes.

Unknown keys and bad values raise :class:`ScenarioError` naming the key and the valid choices.
Each class's settings table is parsed by :mod:`peer.config_tables`; ``--set`` by :mod:`peer.overrides`.
Every number has a checked range (NaN and infinity are refused): the bounds are far beyond any
useful experiment and are there so that a typo fails at load with one line instead of
exhausting memory, overflowing gRPC's int32 message limits or running for ever.
TOML has no null, so "unset" string options use the empty string.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import tomli_w

from dfedrw.peer.plugins import ATTACK_REGISTRY
from dfedrw.peer.config_checks import ScenarioError
from dfedrw.peer.config_legacy import LEGACY_AGGREGATION_ORDER, legacy_view
from dfedrw.peer.overrides import apply_overrides, deep_copy
from dfedrw.peer.config_aggregation import (
    AggregationConfig, AttackConfig, aggregation_table, attack_table, check_aggregation, check_attack, parse_aggregation, parse_attack,
)
from dfedrw.peer.config_tables import Params, SettingsTables, checked_params, parse_class_tables, resolve_class, settings_tables, toml_key
from dfedrw.peer.datasets import build_dataset, natural_groups_error
from dfedrw.peer.kinds import KINDS
from dfedrw.peer.registry import Setting, settings_of
from dfedrw.peer.schedule import SCHEDULE_REGISTRY
from dfedrw.peer.topology import TOPOLOGY_REGISTRY
from dfedrw.peer.transports import TRANSPORT_REGISTRY
from dfedrw.peer.config_checks import (
    MAX_ABS_VALUE_LIMIT, MAX_CLIENTS, MAX_EDGES, MAX_MAGNITUDE, MAX_ROUNDS, MAX_SECONDS, check_choice_of, check_in_range, coerce_value,
)



@dataclass(frozen=True)
class DataConfig:
    name: str = "digits"
    dir: str = ""
    partition: str = "iid"
    aux_fraction: float = 0.1
    local_test_size: int = 1000
    # How labelskew:H gives classes to clients: "cyclic" (every class held by the same number
    # of clients) or "random" (each client draws H classes).
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
            source = build_dataset(self.name, settings, self.dir)
        except ValueError as exc:
            raise ScenarioError(f"[data.{toml_key(self.name)}]: {' '.join(str(exc).split())}") from None
        check_choice_of("data.labelskew_assign", self.labelskew_assign, ("cyclic", "random"))
        check_choice_of("data.augment", self.augment, ("none", "crop", "crop_flip"))
        check_in_range("data.augment_padding", self.augment_padding, 0, 64)
        if self.augment != "none":
            from dfedrw.peer.datasets import input_shape_of

            shape = input_shape_of(source)
            if len(shape) != 3:
                raise ScenarioError(f"data.augment={self.augment!r} needs images; data.name={self.name!r} declares input_shape = {shape}")
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
                raise ScenarioError(f"data.partition={p!r}: dirichlet:ALPHA needs 0 < ALPHA <= {MAX_MAGNITUDE:g}")
        elif kind == "labelskew" and arg:
            if not arg.isdigit() or not 1 <= int(arg) <= 1_000_000:
                raise ScenarioError(f"data.partition={p!r}: labelskew:H needs an integer H in [1, 1_000_000]")
        else:
            raise ScenarioError(
                f"data.partition={p!r} is not valid; use iid, iid:balanced, dirichlet:ALPHA, labelskew:H or natural"
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
    # The learning rate by round: "constant", "step" (times lr_gamma every lr_step rounds) or
    # "cosine" (from lr down towards 0 over the rounds).
    lr_schedule: str = "constant"
    lr_gamma: float = 0.1
    lr_step: int = 100
    # "shared": every client starts from the same seeded initialisation (the usual DFL set-up);
    # "per_client": each client draws its own; "zeros": all parameters start at 0.
    init: str = "shared"
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

    def lr_at(self, r: int, rounds: int) -> float:
        """The learning rate of round ``r`` of ``rounds`` (:func:`peer.training.learning_rate`)."""
        from dfedrw.peer.training import learning_rate

        return learning_rate(self.lr, self.lr_schedule, r, rounds, gamma=self.lr_gamma, step=self.lr_step)


def check_model(train: TrainConfig, data: DataConfig) -> None:
    """Build the model on the meta device (no memory, no initialisation) for the data set's
    shape, so that a model that does not fit the data fails at load time, in one line."""
    import torch

    from dfedrw.peer.datasets import input_shape_of
    from dfedrw.peer.models import make_model

    source = build_dataset(data.name, settings_of(data.params, data.name), data.dir)
    try:
        with torch.device("meta"):
            make_model(
                train.model, int(source.num_features), int(source.num_classes), hidden=train.hidden, input_shape=input_shape_of(source),
                params=settings_of(train.model_params, train.model),
            )
    except ValueError as exc:
        raise ScenarioError(f"train.model={train.model!r} with data.name={data.name!r}: {' '.join(str(exc).split())}") from None


@dataclass(frozen=True)
class TopologyConfig:
    kind: str = "erdos_renyi"
    rho: float = 0.7
    file: str = ""
    honest: int = 10
    byzantine: int = 0
    # The settings tables [topology.NAME] (every one given is checked, the named one is used).
    params: Params = ()
    # A graph that changes from round to round (peer/schedule.py): "" keeps the graph of
    # `kind` every round; a schedule draws each round's graph over it (same Byzantine ids).
    schedule: str = ""
    # The settings tables [topology.schedule_params.NAME] of schedules.
    schedule_params: Params = ()

    def __post_init__(self) -> None:
        checked_params("topology", self.kind, self.params, "topology.kind")
        self._check_schedule()
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
                f"topology.kind={self.kind!r} with {self.num_clients:_} clients{f' and rho={self.rho}' if self.kind == 'erdos_renyi' else ''} "
                f"has about {edges:.2g} edges, each a model sent both ways every round; at most {MAX_EDGES:.0e}: "
                "use a sparse graph: topology.kind = \"ring\", or \"erdos_renyi\" with a small topology.rho"
            )
        if not self.file and any(p.name == "file" and p.default is Setting.REQUIRED for p in TOPOLOGY_REGISTRY.parameters(self.kind)):
            raise ScenarioError(f"topology.kind={self.kind!r} needs topology.file (an edge-list path)")
        if self.file and not TOPOLOGY_REGISTRY.takes(self.kind, "file"):
            raise ScenarioError(f"topology.file={self.file!r} is only read by a topology that takes a file (edgelist), not {self.kind!r}")

    def _check_schedule(self) -> None:
        if not isinstance(self.schedule, str):
            raise ScenarioError(f"topology.schedule={self.schedule!r}: expected a string")
        # Every table given is checked (the key only names where they sit), the named one used.
        where = "topology.schedule_params.NAME"
        if not self.schedule:
            checked_params("schedule", "redraw", self.schedule_params, where)
            return
        resolve_class("schedule", self.schedule, "topology.schedule")
        settings = checked_params("schedule", self.schedule, self.schedule_params, where)
        # Built once with placeholders for the graph and the Byzantine ids, which are drawn
        # later: a bad setting fails here, with one line.
        import networkx as nx

        supplied = {"num_clients": self.num_clients, "byzantine": frozenset(), "seed": 0, "rho": self.rho, "base": nx.empty_graph(self.num_clients)}
        try:
            SCHEDULE_REGISTRY.build(self.schedule, settings, supplied)
        except ValueError as exc:
            raise ScenarioError(f"topology.schedule={self.schedule!r}: {' '.join(str(exc).split())}") from None

    @property
    def num_clients(self) -> int:
        return self.honest + self.byzantine


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
    connect_timeout: float = 120.0
    chunk_bytes: int = 1 << 20
    max_message_bytes: int = 256 << 20
    # "mutual": every gRPC connection is mutual TLS with the run's own certificates, and a
    # message's sender is the client its certificate names. "off": plaintext, any process can
    # claim any id; for debugging only.
    tls: str = "mutual"
    # Largest parameter magnitude a received model may hold; a message with a larger value is
    # rejected as implausible (finite but huge values would otherwise wreck any averaging rule).
    max_abs_value: float = 1e6
    # Seconds an incoming call may carry no chunk before the receiver ends it (freeing its slot).
    # An honest neighbour's call carries a message every round; a sender whose call was idle
    # for half this long opens a new one for its next message.
    idle_call_timeout: float = 60.0
    # Open Push/PushOne calls a receiver allows each sender at once (besides its one Exchange
    # call); a call beyond is refused at once.
    calls_per_sender: int = 2
    # With a topology schedule, a client connects to a peer when it first sends to it and
    # closes a channel that carried nothing for this many seconds (a fixed graph's channels
    # stay open all run).
    idle_channel_timeout: float = 120.0
    # The settings tables [network.NAME] of transports (every one given is checked, the named
    # one is used).
    transport_params: Params = ()

    def __post_init__(self) -> None:
        settings = checked_params("transport", self.transport, self.transport_params, "network.transport")
        try:
            TRANSPORT_REGISTRY.build(self.transport, settings)
        except ValueError as exc:
            raise ScenarioError(f"[network.{toml_key(self.transport)}]: {' '.join(str(exc).split())}") from None
        check_in_range("network.max_abs_value", self.max_abs_value, 0.0, MAX_ABS_VALUE_LIMIT, open_lo=True)
        check_choice_of("network.tls", self.tls, ("mutual", "off"))
        if not self.host or any(c.isspace() or c in "/[]" for c in self.host):
            raise ScenarioError(f"network.host={self.host!r}: expected an address or host name to listen on, e.g. 127.0.0.1, 0.0.0.0 or ::1")
        check_in_range("network.round_timeout", self.round_timeout, 0.0, MAX_SECONDS, open_lo=True)
        check_in_range("network.round_window", self.round_window, 1, 1000)
        check_in_range("network.max_missed_rounds", self.max_missed_rounds, 1, 1_000_000)
        check_in_range("network.connect_timeout", self.connect_timeout, 0.0, MAX_SECONDS, open_lo=True)
        # gRPC message limits are int32: a chunk plus its framing must stay well below 2 GiB.
        check_in_range("network.chunk_bytes", self.chunk_bytes, 1 << 10, 64 << 20)
        check_in_range("network.max_message_bytes", self.max_message_bytes, 1 << 10, 1 << 30)
        check_in_range("network.idle_call_timeout", self.idle_call_timeout, 0.0, MAX_SECONDS, open_lo=True)
        check_in_range("network.calls_per_sender", self.calls_per_sender, 1, 64)
        check_in_range("network.idle_channel_timeout", self.idle_channel_timeout, 0.0, MAX_SECONDS, open_lo=True)


@dataclass(frozen=True)
class EvalConfig:
    # Evaluate local and global test accuracy every N rounds (and always after the last); 0 = end only.
    every: int = 50

    def __post_init__(self) -> None:
        check_in_range("eval.every", self.every, 0, MAX_ROUNDS)


@dataclass(frozen=True)
class CheckpointConfig:
    # Each client saves its state (model, round, optimizer and RNG state, counters) into its
    # results folder every N rounds, and a client started again with the same id resumes from
    # it; 0 = off (a client started again starts over).
    every: int = 50

    def __post_init__(self) -> None:
        check_in_range("checkpoint.every", self.every, 0, MAX_ROUNDS)


ENGINES = ("clients", "batched")


@dataclass(frozen=True)
class EngineConfig:
    """How a run is computed; not part of what the experiment is (a run's identity leaves it out).

    ``clients``: every client is its own :class:`~dfedrw.peer.node.Client`, a process, a thread
    or a torchrun rank as ``network.transport`` says: the deployment and the parity reference.
    ``batched``: one process holds every honest client's model in one tensor and runs each
    round for all of them at once (no network, no deadlines), calling the same rule and attack
    classes; for experiments (sweeps use it unless a sweep names an engine).
    ``device``: where the batched engine computes ("cpu", "cuda" or "cuda:N"). ``threads``:
    the CPU threads it lets torch use (its products are small: on a busy machine more threads
    wait on each other more than they help).
    """

    name: str = "clients"
    device: str = "cpu"
    threads: int = 1

    def __post_init__(self) -> None:
        check_choice_of("engine.name", self.name, ENGINES)
        check_in_range("engine.threads", self.threads, 1, 1024)
        if not (self.device == "cpu" or self.device == "cuda" or (self.device.startswith("cuda:") and self.device[5:].isdigit())):
            raise ScenarioError(f"engine.device={self.device!r}: expected 'cpu', 'cuda' or 'cuda:N'")


@dataclass(frozen=True)
class Scenario:
    seed: int = 43
    rounds: int = 200
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    # Client id -> aggregation overrides (keys of [aggregation]).
    peers: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_in_range("rounds", self.rounds, 1, MAX_ROUNDS)
        # TOML integers are int64; numpy and torch seeds take any of the non-negative ones.
        check_in_range("seed", self.seed, 0, 2**63 - 1)
        n = self.topology.num_clients
        configs = {self.aggregation: None}
        for k, over in self.peers.items():
            if not 0 <= k < n:
                raise ScenarioError(f"peers.{k}: no such client; ids are 0..{n - 1}")
            configs.setdefault(self.aggregation_for(k), None)
        if self.topology.byzantine and self.attack.name == "none":
            raise ScenarioError(
                f"topology.byzantine={self.topology.byzantine} but attack.name='none'; "
                f"choose an attack ({', '.join(ATTACK_REGISTRY.names())}) or set topology.byzantine=0"
            )
        check_model(self.train, self.data)
        # Build every distinct rule and the attack once, with placeholders for what the running
        # system supplies, so a bad setting fails at load time, not inside client k.
        # The rule of [aggregation] is the first built: it stands for the defence an attack is told.
        rules = []
        for cfg in configs:
            told = cfg.assumed_byzantine if cfg.assumed_byzantine >= 0 else self.topology.byzantine
            rules.append(check_aggregation(cfg, num_byzantine=told, lr=self.train.lr, seed=0, total_rounds=self.rounds))
        defence = rules[0]
        check_attack(
            self.attack, num_clients=n, num_byzantine=self.topology.byzantine, lr=self.train.lr, total_rounds=self.rounds, defence=defence,
            round_window=self.network.round_window,
        )

    @property
    def num_clients(self) -> int:
        return self.topology.num_clients

    def aggregation_for(self, client: int) -> AggregationConfig:
        """The aggregation settings of one client: [aggregation] with its [peers.K] overrides."""
        over = self.peers.get(client)
        if not over:
            return self.aggregation
        return parse_aggregation(f"peers.{client}.aggregation", over, self.aggregation)


_SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "train": TrainConfig,
    "topology": TopologyConfig,
    "attack": AttackConfig,
    "aggregation": AggregationConfig,
    "network": NetworkConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
    "engine": EngineConfig,
}
_TOP_SCALARS = ("seed", "rounds")
# Sections that choose a class by name and hold its settings tables [SECTION.NAME]:
# section -> (the kind of class, the field holding the tables). [aggregation] and [attack]
# are among them but have parsers of their own (peer/config_aggregation.py).
_CLASS_TABLES = {k.section: (k.name, k.field) for k in KINDS if not k.nested}



def _field_type(cls: type, name: str) -> str:
    return {f.name: f.type for f in fields(cls)}[name]


def _check_keys(prefix: str, table: Mapping[str, Any], cls: type) -> None:
    valid = [f.name for f in fields(cls)]
    for key in table:
        if key not in valid:
            raise ScenarioError(f"unknown key '{prefix}.{key}'; valid keys: {', '.join(valid)}")


def _schedule_tables(value: Any) -> Params:
    """``[topology.schedule_params.NAME]`` tables, frozen (each checked against its class)."""
    where = "topology.schedule_params"
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where} must be a table of schedule settings tables, e.g. [{where}.redraw]")
    tables = SettingsTables({}, ())
    for name, values in value.items():
        tables.table("schedule", name, values, f"{where}.{toml_key(name)}")
    return tables.frozen("schedule")


def scenario_from_dict(raw: Mapping[str, Any]) -> Scenario:
    """Build and validate a :class:`Scenario` from a parsed TOML table."""
    valid_top = [*_TOP_SCALARS, *_SECTIONS, "peers"]
    for key in raw:
        if key not in valid_top:
            raise ScenarioError(f"unknown key '{key}'; valid top-level keys: {', '.join(valid_top)}")
    kwargs: dict[str, Any] = {}
    for key in _TOP_SCALARS:
        if key in raw:
            kwargs[key] = coerce_value(key, raw[key], "int")
    for name, cls in _SECTIONS.items():
        table = raw.get(name, {})
        if not isinstance(table, Mapping):
            raise ScenarioError(f"'{name}' must be a table, got {table!r}")
        if name == "aggregation":
            kwargs[name] = parse_aggregation(name, table)
            continue
        if name == "attack":
            kwargs[name] = parse_attack(name, table)
            continue
        tables: dict[str, Any] = {}
        if name == "topology" and "schedule_params" in table:
            table = dict(table)
            tables["schedule_params"] = _schedule_tables(table.pop("schedule_params"))
        if name in _CLASS_TABLES:
            kind, params_field = _CLASS_TABLES[name]
            fields_ = [f.name for f in fields(cls) if f.name not in (params_field, "schedule_params")]
            table, tables[params_field] = parse_class_tables(name, table, fields_, kind)
        _check_keys(name, table, cls)
        kwargs[name] = cls(**{k: coerce_value(f"{name}.{k}", v, _field_type(cls, k)) for k, v in table.items()}, **tables)
    peers: dict[int, dict[str, Any]] = {}
    for key, table in dict(raw.get("peers", {})).items():
        try:
            client = int(key)
        except (TypeError, ValueError):
            raise ScenarioError(f"peers.{key}: client ids are integers") from None
        if not isinstance(table, Mapping) or set(table) - {"aggregation"}:
            raise ScenarioError(f"peers.{key}: only an 'aggregation' table may be overridden per client")
        over = table.get("aggregation", {})
        if not isinstance(over, Mapping):
            raise ScenarioError(f"'peers.{key}.aggregation' must be a table, got {over!r}")
        peers[client] = deep_copy(over)
    kwargs["peers"] = peers
    try:
        return Scenario(**kwargs)
    except TypeError as exc:  # pragma: no cover - defensive, keys are checked above
        raise ScenarioError(str(exc)) from None


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """The resolved scenario as a TOML-ready table (round-trips through scenario_from_dict)."""
    out: dict[str, Any] = {"seed": scenario.seed, "rounds": scenario.rounds}
    for name in _SECTIONS:
        if name == "aggregation":
            out[name] = aggregation_table(scenario.aggregation)
        elif name == "attack":
            out[name] = attack_table(scenario.attack)
        else:
            out[name] = dataclasses.asdict(getattr(scenario, name))
            if name in _CLASS_TABLES:
                # Only the tables given: a scenario without any is written as before.
                out[name].update(settings_tables(out[name].pop(_CLASS_TABLES[name][1])))
            if name == "topology":
                # Written only when set: a scenario with a fixed graph is written as before.
                schedule, tables = out[name].pop("schedule"), out[name].pop("schedule_params")
                if schedule:
                    out[name]["schedule"] = schedule
                if tables:
                    out[name]["schedule_params"] = settings_tables(tables)
    if scenario.peers:
        out["peers"] = {str(k): {"aggregation": deep_copy(v)} for k, v in sorted(scenario.peers.items())}
    return out


def _identity_dict(scenario: Scenario) -> dict[str, Any]:
    """:func:`scenario_to_dict` with [aggregation] and [attack] in the legacy flat form, and
    without [engine] (how a run is computed is not what it is)."""
    out = scenario_to_dict(scenario)
    del out["engine"]
    agg = scenario.aggregation
    view = legacy_view(
        "aggregation", {"rule": agg.rule, "tpm": agg.tpm, "crs": agg.crs}, LEGACY_AGGREGATION_ORDER,
        {"rule": agg.rule_params, "tpm": agg.tpm_params, "crs": agg.crs_params},
    )
    # assumed_byzantine sat between dfedavg_weighting and multi_krum_m.
    ordered = {k: view[k] for k in ("rule", "tpm", "crs")}
    for key in LEGACY_AGGREGATION_ORDER:
        ordered[key] = agg.assumed_byzantine if key == "assumed_byzantine" else view[key]
    ordered.update({k: v for k, v in view.items() if k not in ordered})
    out["aggregation"] = ordered
    att = scenario.attack
    head = {"name": att.name, **({"colluding": True} if att.colluding else {})}
    out["attack"] = legacy_view("attack", head, ("std", "center", "scale", "z"), {"attack": att.attack_params})
    return out


def scenario_changes(scenario: Scenario) -> dict[str, Any]:
    """Only the settings that differ from the built-in defaults, as a nested table.

    A run's identity: it stays the same when a later version adds a key whose default keeps
    the old behaviour, so finished runs stay valid across such versions. Settings that had a
    flat key in earlier versions (:data:`LEGACY`) are written with it, so a scenario that
    earlier versions could express keeps its identity byte for byte.
    """

    def diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in a.items():
            base = b.get(key)
            if isinstance(value, Mapping) and isinstance(base, Mapping):
                sub = diff(value, base)
                if sub:
                    out[key] = sub
            elif value != base or key not in b:
                out[key] = value
        return out

    return diff(_identity_dict(scenario), _identity_dict(Scenario()))


DEFAULT_SCENARIO = Path(__file__).resolve().parent / "scenarios" / "default.toml"


def load_scenario(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Scenario:
    """Read a scenario TOML file (the built-in default when ``path`` is None) and apply overrides."""
    source = Path(path) if path else DEFAULT_SCENARIO
    try:
        raw = tomllib.loads(source.read_text(encoding="utf-8-sig"))  # a byte-order mark is not TOML: dropped
    except FileNotFoundError:
        raise ScenarioError(f"scenario file not found: {source}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{source}: not valid TOML: {exc}") from None
    return scenario_from_dict(apply_overrides(raw, overrides))


def dump_scenario(scenario: Scenario, path: str | Path) -> None:
    Path(path).write_text(tomli_w.dumps(scenario_to_dict(scenario)))
