"""Scenario configuration: frozen dataclasses loaded from TOML, overridable with ``key=value``.

A scenario file has the sections below (every key optional; defaults in the dataclasses):

    seed, rounds
    [data]        name, dir, partition, aux_fraction, local_test_size, labelskew_assign
    [train]       model, hidden, lr, batch_size, local_steps, init
    [topology]    kind, rho, file, honest, byzantine
    [attack]      name, std, center, scale, z
    [aggregation] rule, tpm, crs, temperature, accuracy_scale, loss_clip_weighting,
                  clip_threshold, tpm_accuracy_weight, tpm_loss_weight, dfedavg_weighting,
                  assumed_byzantine, multi_krum_m, flame_noise, balance_gamma, balance_kappa,
                  balance_alpha, q
    [network]     transport, host, round_timeout, round_window, max_missed_rounds,
                  connect_timeout, chunk_bytes, max_message_bytes
    [eval]        every
    [checkpoint]  every
    [peers.K.aggregation]  per-client overrides of any [aggregation] key for client K

Unknown keys and bad values raise :class:`ScenarioError` naming the key and the valid choices.
TOML has no null, so "unset" string options use the empty string.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import tomli_w

DATASETS = ("digits", "fashion-mnist", "mnist")
MODELS = ("softmax_regression", "mlp")
TOPOLOGIES = ("erdos_renyi", "ring", "complete", "edgelist")
ATTACKS = ("none", "gaussian", "sign_flip", "alie")
RULES = (
    "dfedreweighting",
    "dfedavg",
    "median",
    "trimmed_mean",
    "krum",
    "multi_krum",
    "geometric_median",
    "flame",
    "balance",
    "qfdfl",
    "acc_above_mean",
)
TPMS = ("accuracy", "loss", "combined")
CRSS = ("softmax", "loss_clip_mean", "acc_clip_mean", "proportional", "clip")
# "torch" (torch.distributed point-to-point) is valid only for clients started by torchrun.
TRANSPORTS = ("grpc", "inproc", "torch")


class ScenarioError(ValueError):
    """A scenario file or override is invalid; the message names the key and the fix."""


def _choice(key: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ScenarioError(f"{key}={value!r} is not valid; choose one of: {', '.join(choices)}")


def _positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok or (isinstance(value, float) and not math.isfinite(value)):
        bound = ">= 0" if allow_zero else "> 0"
        raise ScenarioError(f"{key}={value!r} must be a finite number {bound}")


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

    def __post_init__(self) -> None:
        _choice("data.name", self.name, DATASETS)
        _choice("data.labelskew_assign", self.labelskew_assign, ("cyclic", "random"))
        p = self.partition
        kind, _, arg = p.partition(":")
        if kind == "iid" and not arg:
            pass
        elif kind == "dirichlet" and arg:
            try:
                alpha = float(arg)
            except ValueError:
                alpha = -1.0
            if not (alpha > 0 and math.isfinite(alpha)):
                raise ScenarioError(f"data.partition={p!r}: dirichlet:ALPHA needs ALPHA > 0")
        elif kind == "labelskew" and arg:
            if not arg.isdigit() or int(arg) < 1:
                raise ScenarioError(f"data.partition={p!r}: labelskew:H needs an integer H >= 1")
        else:
            raise ScenarioError(
                f"data.partition={p!r} is not valid; use iid, dirichlet:ALPHA or labelskew:H"
            )
        if not 0 < self.aux_fraction <= 1:
            raise ScenarioError(f"data.aux_fraction={self.aux_fraction!r} must be in (0, 1]")
        _positive("data.local_test_size", self.local_test_size)


@dataclass(frozen=True)
class TrainConfig:
    model: str = "softmax_regression"
    hidden: int = 64
    lr: float = 0.01
    batch_size: int = 32
    local_steps: int = 1
    # "shared": every client starts from the same seeded initialisation (the usual DFL set-up);
    # "per_client": each client draws its own; "zeros": all parameters start at 0.
    init: str = "shared"

    def __post_init__(self) -> None:
        _choice("train.model", self.model, MODELS)
        _choice("train.init", self.init, ("shared", "per_client", "zeros"))
        _positive("train.hidden", self.hidden)
        _positive("train.lr", self.lr)
        _positive("train.batch_size", self.batch_size)
        _positive("train.local_steps", self.local_steps)


@dataclass(frozen=True)
class TopologyConfig:
    kind: str = "erdos_renyi"
    rho: float = 0.7
    file: str = ""
    honest: int = 10
    byzantine: int = 0

    def __post_init__(self) -> None:
        _choice("topology.kind", self.kind, TOPOLOGIES)
        if not 0 < self.rho <= 1:
            raise ScenarioError(f"topology.rho={self.rho!r} must be in (0, 1]")
        if self.honest < 1:
            raise ScenarioError(f"topology.honest={self.honest!r} must be >= 1")
        _positive("topology.byzantine", self.byzantine, allow_zero=True)
        if self.kind == "edgelist" and not self.file:
            raise ScenarioError("topology.kind='edgelist' needs topology.file (an edge-list path)")

    @property
    def num_clients(self) -> int:
        return self.honest + self.byzantine


@dataclass(frozen=True)
class AttackConfig:
    name: str = "none"
    std: float = 30.0            # gaussian
    center: str = "received_mean"  # gaussian: "received_mean" or "zero"
    scale: float = -10.0         # sign_flip
    z: float | str = "auto"      # alie: a number, or "auto" for the ALIE paper's z_max

    def __post_init__(self) -> None:
        _choice("attack.name", self.name, ATTACKS)
        _choice("attack.center", self.center, ("received_mean", "zero"))
        _positive("attack.std", self.std, allow_zero=True)
        if isinstance(self.z, str) and self.z != "auto":
            raise ScenarioError(f"attack.z={self.z!r} must be a number or 'auto'")


@dataclass(frozen=True)
class AggregationConfig:
    rule: str = "dfedreweighting"
    tpm: str = "loss"
    crs: str = "loss_clip_mean"
    temperature: float = 0.1
    # Multiplies accuracy before the softmax: 1 treats accuracy as a fraction, 100 as percent.
    # Percent is what reproduces the paper's fairness table at its temperatures (docs/results).
    accuracy_scale: float = 100.0
    loss_clip_weighting: str = "proportional"
    clip_threshold: float = 1.0
    tpm_accuracy_weight: float = 0.5
    tpm_loss_weight: float = 0.5
    dfedavg_weighting: str = "data_size"
    # What robust rules (trimmed_mean, krum, multi_krum) are told about the number of Byzantine
    # neighbours: -1 = the client's true count (an oracle the experimenter has), else this number.
    assumed_byzantine: int = -1
    multi_krum_m: int = 0  # 0: C - f
    flame_noise: float = 0.001
    flame_cluster_on: str = "updates"
    balance_gamma: float = 2.0
    balance_kappa: float = 1.0
    balance_alpha: float = 0.1
    q: float = 0.1  # q-FDFL

    def __post_init__(self) -> None:
        _choice("aggregation.rule", self.rule, RULES)
        if self.assumed_byzantine < -1:
            raise ScenarioError(f"aggregation.assumed_byzantine={self.assumed_byzantine} must be -1 (true count) or >= 0")
        _positive("aggregation.multi_krum_m", self.multi_krum_m, allow_zero=True)
        _positive("aggregation.flame_noise", self.flame_noise, allow_zero=True)
        _choice("aggregation.flame_cluster_on", self.flame_cluster_on, ("updates", "models"))
        _positive("aggregation.balance_gamma", self.balance_gamma)
        _positive("aggregation.balance_kappa", self.balance_kappa, allow_zero=True)
        if not 0 <= self.balance_alpha <= 1:
            raise ScenarioError(f"aggregation.balance_alpha={self.balance_alpha} must be in [0, 1]")
        _positive("aggregation.q", self.q, allow_zero=True)
        _choice("aggregation.tpm", self.tpm, TPMS)
        _choice("aggregation.crs", self.crs, CRSS)
        _choice(
            "aggregation.loss_clip_weighting",
            self.loss_clip_weighting,
            ("proportional", "inverse", "uniform"),
        )
        _choice("aggregation.dfedavg_weighting", self.dfedavg_weighting, ("data_size", "uniform"))
        _positive("aggregation.temperature", self.temperature)
        _positive("aggregation.accuracy_scale", self.accuracy_scale)
        _positive("aggregation.clip_threshold", self.clip_threshold)


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

    def __post_init__(self) -> None:
        _choice("network.transport", self.transport, TRANSPORTS)
        _choice("network.tls", self.tls, ("mutual", "off"))
        _positive("network.round_timeout", self.round_timeout)
        _positive("network.round_window", self.round_window)
        _positive("network.max_missed_rounds", self.max_missed_rounds)
        _positive("network.connect_timeout", self.connect_timeout)
        _positive("network.chunk_bytes", self.chunk_bytes)
        _positive("network.max_message_bytes", self.max_message_bytes)


@dataclass(frozen=True)
class EvalConfig:
    # Evaluate local and global test accuracy every N rounds (and always after the last); 0 = end only.
    every: int = 50

    def __post_init__(self) -> None:
        _positive("eval.every", self.every, allow_zero=True)


@dataclass(frozen=True)
class CheckpointConfig:
    # Each client saves its state (model, round, optimizer and RNG state, counters) into its
    # results folder every N rounds, and a client started again with the same id resumes from
    # it; 0 = off (a client started again starts over).
    every: int = 50

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or isinstance(self.every, bool) or not 0 <= self.every <= 10_000_000:
            raise ScenarioError(f"checkpoint.every={self.every!r} must be an integer in 0..10000000 (0 = no checkpoints)")


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
    # Client id -> aggregation overrides (keys of [aggregation]).
    peers: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _positive("rounds", self.rounds)
        if self.seed < 0:
            raise ScenarioError(f"seed={self.seed!r} must be >= 0")
        n = self.topology.num_clients
        for k, over in self.peers.items():
            if not 0 <= k < n:
                raise ScenarioError(f"peers.{k}: no such client; ids are 0..{n - 1}")
            # Build once so a bad override fails at load time, not inside client k.
            self.aggregation_for(k)
        if self.topology.byzantine and self.attack.name == "none":
            raise ScenarioError(
                f"topology.byzantine={self.topology.byzantine} but attack.name='none'; "
                f"choose an attack ({', '.join(ATTACKS[1:])}) or set topology.byzantine=0"
            )

    @property
    def num_clients(self) -> int:
        return self.topology.num_clients

    def aggregation_for(self, client: int) -> AggregationConfig:
        """The aggregation settings of one client: [aggregation] with its [peers.K] overrides."""
        over = dict(self.peers.get(client, {}))
        prefix = f"peers.{client}.aggregation"
        _check_keys(prefix, over, AggregationConfig)
        return dataclasses.replace(
            self.aggregation,
            **{k: _coerce(f"{prefix}.{k}", v, _field_type(AggregationConfig, k)) for k, v in over.items()},
        )


_SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "train": TrainConfig,
    "topology": TopologyConfig,
    "attack": AttackConfig,
    "aggregation": AggregationConfig,
    "network": NetworkConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
}
_TOP_SCALARS = ("seed", "rounds")


def _field_type(cls: type, name: str) -> str:
    return {f.name: f.type for f in fields(cls)}[name]


def _check_keys(prefix: str, table: Mapping[str, Any], cls: type) -> None:
    valid = [f.name for f in fields(cls)]
    for key in table:
        if key not in valid:
            raise ScenarioError(f"unknown key '{prefix}.{key}'; valid keys: {', '.join(valid)}")


def _coerce(key: str, value: Any, type_name: str) -> Any:
    """Check a TOML value against a field's annotated type (annotations are strings here)."""
    t = str(type_name)
    if isinstance(value, bool) and t != "bool":
        raise ScenarioError(f"{key}={value!r}: expected {t}, got a boolean")
    if t == "int":
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, int):
            raise ScenarioError(f"{key}={value!r}: expected an integer")
        return value
    if t == "float":
        if not isinstance(value, (int, float)):
            raise ScenarioError(f"{key}={value!r}: expected a number")
        return float(value)
    if t == "str":
        if not isinstance(value, str):
            raise ScenarioError(f"{key}={value!r}: expected a string")
        return value
    if t == "float | str":
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            return value
        raise ScenarioError(f"{key}={value!r}: expected a number or a string")
    return value


def scenario_from_dict(raw: Mapping[str, Any]) -> Scenario:
    """Build and validate a :class:`Scenario` from a parsed TOML table."""
    valid_top = [*_TOP_SCALARS, *_SECTIONS, "peers"]
    for key in raw:
        if key not in valid_top:
            raise ScenarioError(f"unknown key '{key}'; valid top-level keys: {', '.join(valid_top)}")
    kwargs: dict[str, Any] = {}
    for key in _TOP_SCALARS:
        if key in raw:
            kwargs[key] = _coerce(key, raw[key], "int")
    for name, cls in _SECTIONS.items():
        table = raw.get(name, {})
        if not isinstance(table, Mapping):
            raise ScenarioError(f"'{name}' must be a table, got {table!r}")
        _check_keys(name, table, cls)
        kwargs[name] = cls(**{k: _coerce(f"{name}.{k}", v, _field_type(cls, k)) for k, v in table.items()})
    peers: dict[int, dict[str, Any]] = {}
    for key, table in dict(raw.get("peers", {})).items():
        try:
            client = int(key)
        except (TypeError, ValueError):
            raise ScenarioError(f"peers.{key}: client ids are integers") from None
        if not isinstance(table, Mapping) or set(table) - {"aggregation"}:
            raise ScenarioError(f"peers.{key}: only an 'aggregation' table may be overridden per client")
        peers[client] = dict(table.get("aggregation", {}))
    kwargs["peers"] = peers
    try:
        return Scenario(**kwargs)
    except TypeError as exc:  # pragma: no cover - defensive, keys are checked above
        raise ScenarioError(str(exc)) from None


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """The resolved scenario as a TOML-ready table (round-trips through scenario_from_dict)."""
    out: dict[str, Any] = {"seed": scenario.seed, "rounds": scenario.rounds}
    for name in _SECTIONS:
        out[name] = dataclasses.asdict(getattr(scenario, name))
    if scenario.peers:
        out["peers"] = {str(k): {"aggregation": dict(v)} for k, v in sorted(scenario.peers.items())}
    return out


def scenario_changes(scenario: Scenario) -> dict[str, Any]:
    """Only the settings that differ from the built-in defaults, as a nested table.

    A run's identity: it stays the same when a later version adds a key whose default keeps
    the old behaviour, so finished runs stay valid across such versions.
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

    return diff(scenario_to_dict(scenario), scenario_to_dict(Scenario()))


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as TOML (numbers, booleans, strings) or taken verbatim."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ScenarioError(f"override {text!r} must look like key=value, e.g. rounds=100")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return key.split("."), parsed


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply dotted ``key=value`` overrides to a raw scenario table (returns a new table)."""
    out = _deep_copy(raw)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ScenarioError(f"override {text!r}: '{part}' is not a table")
            node = child
        node[path[-1]] = value
    return out


def _deep_copy(table: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in table.items()}


DEFAULT_SCENARIO = Path(__file__).resolve().parent / "scenarios" / "default.toml"


def load_scenario(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Scenario:
    """Read a scenario TOML file (the built-in default when ``path`` is None) and apply overrides."""
    source = Path(path) if path else DEFAULT_SCENARIO
    try:
        raw = tomllib.loads(source.read_text())
    except FileNotFoundError:
        raise ScenarioError(f"scenario file not found: {source}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: not valid TOML: {exc}") from None
    return scenario_from_dict(apply_overrides(raw, overrides))


def dump_scenario(scenario: Scenario, path: str | Path) -> None:
    Path(path).write_text(tomli_w.dumps(scenario_to_dict(scenario)))
