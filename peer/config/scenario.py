"""Scenario configuration: frozen dataclasses loaded from TOML, overridable with ``key=value``.

A scenario file has the sections below (every key optional; defaults in the dataclasses):

    seed, rounds
    [data]        name, dir, partition, aux_fraction, local_test_size, labelskew_assign
    [train]       model, hidden, lr, batch_size, local_steps, init
    [topology]    kind, rho, file, honest, byzantine, schedule, placement
                  [topology.NAME]  [topology.schedule_params.SCHEDULE]
    [attack]      name                       [attack.NAME]  the attack's settings
    [aggregation] rule, tpm, crs, assumed_byzantine
                  [aggregation.RULE]  [aggregation.tpm_params.TPM]  [aggregation.crs_params.CRS]
    [network]     transport, host, round_timeout, round_window, max_missed_rounds,
                  connect_timeout, chunk_bytes, max_message_bytes, idle_channel_timeout, compression,
                  protocol (sync, async), max_staleness, ...
                  [network.TRANSPORT]  [network.compression_params.COMPRESSION]
    [links]       latency, jitter, bandwidth, loss, generator, latency_per_unit
                  [links.pairs] "I-J" = {latency = ..., ...}  one directed link's own settings
    [clock]       step_seconds, aggregate_seconds   (the batched engine's simulated compute)
    [eval]        every
    [checkpoint]  every
    [engine]      name (clients, batched), device, threads
    [peers.K.aggregation]  per-client overrides of any [aggregation] key or table for client K
    [peers.K] speed        client K's compute speed (train.speed for the others)

A rule, TPM, CRS or attack is a class registered by name (peer/registry.py) or an import path
``module:Class``; its constructor's parameters are its settings, set in its own table
(``[aggregation.balance] gamma = 2``, ``[attack.alie] z = 1.5``) and checked by the class when the
scenario loads, so a bad value fails with one line in every entry point. The old flat keys
(``aggregation.balance_gamma``, ``attack.std``, ...: :mod:`peer.config.legacy`) are still read,
and a run's identity (:func:`scenario_changes`) is written with them where they exist, so old
runs keep their folder hashes.

Unknown keys and bad values raise :class:`ScenarioError` naming the key and the valid choices.
The sections other than [aggregation] and [attack] are :mod:`peer.config.sections`'s, settings
tables :mod:`peer.config.tables`'s, ``--set`` :mod:`peer.config.overrides`'s. Every number has a
checked range (NaN and infinity are refused), far beyond any useful experiment, so that a typo
fails at load with one line instead of exhausting memory, overflowing gRPC's int32 message limits
or running for ever. TOML has no null, so "unset" string options use the empty string.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import tomli_w

from dfedrw.peer.kinds.registries import ATTACK_REGISTRY
from dfedrw.peer.config.checks import ScenarioError
from dfedrw.peer.config.legacy import LEGACY_AGGREGATION_ORDER, legacy_view
from dfedrw.peer.config.overrides import apply_overrides, deep_copy
from dfedrw.peer.config.aggregation import (
    AggregationConfig, AttackConfig, aggregation_table, attack_head, attack_table, check_aggregation, check_attack, parse_aggregation, parse_attack,
)
from dfedrw.peer.config.tables import KIND_REGISTRY, Params, SettingsTables, parse_class_tables, settings_tables, toml_key
from dfedrw.peer.config.sections import (  # noqa: F401 - the sections are named from here too
    ENGINES, CheckpointConfig, ClockConfig, DataConfig, EngineConfig, EvalConfig, LinksConfig, NetworkConfig, TopologyConfig, TrainConfig,
    check_model, parse_link_pairs,
)
from dfedrw.peer.kinds.table import KINDS
from dfedrw.peer.config.checks import MAX_ROUNDS, check_in_range, check_nesting, coerce_value, parse_toml
from dfedrw.peer.quote import shown


# Set while :func:`load_validated` reads a scenario that was validated before: its checks are not run again.
_VALIDATED: contextvars.ContextVar[bool] = contextvars.ContextVar("scenario_validated", default=False)


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
    links: LinksConfig = field(default_factory=LinksConfig)
    clock: ClockConfig = field(default_factory=ClockConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    # Client id -> aggregation overrides (keys of [aggregation]).
    peers: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    # Client id -> its own compute speed ([peers.K] speed; the others run at train.speed).
    speeds: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # [peers.K] overrides, parsed once: client id -> its aggregation settings.
        object.__setattr__(self, "_aggregations", {k: self._parse_peer(k) for k in self.peers if 0 <= k < self.topology.num_clients})
        if not _VALIDATED.get():
            self.validate()

    def _parse_peer(self, client: int) -> AggregationConfig:
        over = self.peers.get(client)
        return parse_aggregation(f"peers.{client}.aggregation", over, self.aggregation) if over else self.aggregation

    def validate(self) -> None:
        """The whole scenario's checks: its ranges, its clients, every rule's and the attack's
        settings (checked without building them) and the model against the data (run when a
        scenario is made, except by :func:`load_validated`). Raises :class:`ScenarioError`."""
        check_in_range("rounds", self.rounds, 1, MAX_ROUNDS)
        # TOML integers are int64; numpy and torch seeds take any of the non-negative ones.
        check_in_range("seed", self.seed, 0, 2**63 - 1)
        n = self.topology.num_clients
        configs = {self.aggregation: None}
        for k, over in self.peers.items():
            if not 0 <= k < n:
                raise ScenarioError(f"peers.{k}: no such client; ids are 0..{n - 1}")
            configs.setdefault(self.aggregation_for(k), None)
        for k, speed in self.speeds.items():
            if not 0 <= k < n:
                raise ScenarioError(f"peers.{k}: no such client; ids are 0..{n - 1}")
            check_in_range(f"peers.{k}.speed", speed, 0.0, 1.0, open_lo=True)
        for (src, dst), _ in self.links.pairs:
            if not (src < n and dst < n):
                raise ScenarioError(f"links.pairs.\"{src}-{dst}\": no such client; ids are 0..{n - 1}")
        if self.topology.byzantine and self.attack.name == "none":
            raise ScenarioError(
                f"topology.byzantine={self.topology.byzantine} but attack.name='none'; "
                f"choose an attack ({', '.join(ATTACK_REGISTRY.names())}) or set topology.byzantine=0"
            )
        check_model(self.train, self.data)
        if self.network.asynchronous and self.attack.colluding:
            raise ScenarioError("attack.colluding: colluders pool the models of a round, and network.protocol = \"async\" has no rounds")
        if self.attack.strike == "trusted" and not self.network.share_scores:
            raise ScenarioError(
                "attack.strike = \"trusted\": an attacker reads its standing in the scores its neighbours report; set network.share_scores = true"
            )
        for cfg in configs:
            told = cfg.assumed_byzantine if cfg.assumed_byzantine >= 0 else self.topology.byzantine
            check_aggregation(cfg, num_byzantine=told, lr=self.train.lr, seed=0, total_rounds=self.rounds)
        check_attack(
            self.attack, num_clients=n, num_byzantine=self.topology.byzantine, lr=self.train.lr, total_rounds=self.rounds,
            round_window=self.network.round_window,
        )

    @property
    def num_clients(self) -> int:
        return self.topology.num_clients

    def speed_of(self, client: int) -> float:
        """Client ``client``'s speed: [peers.K] speed, else train.speed or its speed_spread draw."""
        if client in self.speeds:
            return self.speeds[client]
        t = self.train
        if not t.speed_spread:
            return t.speed
        digest = hashlib.blake2b(f"speed/{self.seed}/{client}".encode(), digest_size=8).digest()
        unit = int.from_bytes(digest, "big") / 2**64  # uniform in [0, 1), the same on every platform
        return t.speed * (1.0 - t.speed_spread * unit)

    @property
    def paced(self) -> bool:
        """Whether any client runs slower than the machine (a speed below 1, or speeds drawn)."""
        return self.train.speed < 1.0 or self.train.speed_spread > 0 or any(v < 1.0 for v in self.speeds.values())

    @property
    def clocked(self) -> bool:
        """Whether time changes what happens: links that cost something, slow clients, or
        compute set on the batched engine's clock ([clock]); a batched run then keeps one."""
        return self.links.emulates or self.paced or self.clock != ClockConfig()

    def aggregation_for(self, client: int) -> AggregationConfig:
        """Client ``client``'s aggregation settings: [aggregation] with its [peers.K] overrides."""
        return self._aggregations.get(client, self.aggregation)


_SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "train": TrainConfig,
    "topology": TopologyConfig,
    "attack": AttackConfig,
    "aggregation": AggregationConfig,
    "network": NetworkConfig,
    "links": LinksConfig,
    "clock": ClockConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
    "engine": EngineConfig,
}
_TOP_SCALARS = ("seed", "rounds")
# Section -> (kind, field holding its settings tables [SECTION.NAME]) of the sections that choose
# a class by name; [aggregation] and [attack] have their own parsers (peer/config/aggregation.py).
_CLASS_TABLES = {k.section: (k.name, k.field) for k in KINDS if not k.nested}



def _field_type(cls: type, name: str) -> str:
    return {f.name: f.type for f in fields(cls)}[name]


def _check_keys(prefix: str, table: Mapping[str, Any], cls: type) -> None:
    valid = [f.name for f in fields(cls)]
    for key in table:
        if key not in valid:
            raise ScenarioError(f"unknown key '{prefix}.{key}'; valid keys: {', '.join(valid)}")


# Sections holding a nested kind's settings tables besides their own class's (the aggregation
# section's are parsed with it): [topology.schedule_params.NAME], [network.compression_params.NAME].
_NESTED_TABLES = {
    k.section: [(j.name, j.field) for j in KINDS if j.nested and j.section == k.section] for k in KINDS if k.section != "aggregation"
}


def _nested_tables(kind: str, where: str, value: Any) -> Params:
    """``[WHERE.NAME]`` tables of a nested kind, frozen (each checked against its class)."""
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where} must be a table of {kind} settings tables, e.g. [{where}.{KIND_REGISTRY[kind].names()[0]}]")
    tables = SettingsTables({}, ())
    for name, values in value.items():
        tables.table(kind, name, values, f"{where}.{toml_key(name)}")
    return tables.frozen(kind)


def scenario_from_dict(raw: Mapping[str, Any]) -> Scenario:
    """Build and validate a :class:`Scenario` from a parsed TOML table."""
    check_nesting("scenario", raw)
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
            raise ScenarioError(f"'{name}' must be a table, got {shown(table)}")
        if name == "aggregation":
            kwargs[name] = parse_aggregation(name, table)
            continue
        if name == "attack":
            kwargs[name] = parse_attack(name, table)
            continue
        tables: dict[str, Any] = {}
        nested = _NESTED_TABLES.get(name, [])
        for kind, field in nested:
            if field in table:
                table = dict(table)
                tables[field] = _nested_tables(kind, f"{name}.{field}", table.pop(field))
        if name == "links" and "pairs" in table:
            table = dict(table)
            tables["pairs"] = parse_link_pairs(table.pop("pairs"))
        if name in _CLASS_TABLES:
            kind, params_field = _CLASS_TABLES[name]
            fields_ = [f.name for f in fields(cls) if f.name not in (params_field, *(field for _, field in nested))]
            table, tables[params_field] = parse_class_tables(name, table, fields_, kind)
        _check_keys(name, table, cls)
        kwargs[name] = cls(**{k: coerce_value(f"{name}.{k}", v, _field_type(cls, k)) for k, v in table.items()}, **tables)
    peers: dict[int, dict[str, Any]] = {}
    speeds: dict[int, float] = {}
    for key, table in dict(raw.get("peers", {})).items():
        try:
            client = int(key)
        except (TypeError, ValueError):
            raise ScenarioError(f"peers.{key}: client ids are integers") from None
        if not isinstance(table, Mapping) or set(table) - {"aggregation", "speed"}:
            raise ScenarioError(f"peers.{key}: only an 'aggregation' table and 'speed' may be set per client")
        if "speed" in table:
            speeds[client] = coerce_value(f"peers.{key}.speed", table["speed"], "float")
        if "aggregation" not in table:
            continue
        over = table["aggregation"]
        if not isinstance(over, Mapping):
            raise ScenarioError(f"'peers.{key}.aggregation' must be a table, got {shown(over)}")
        peers[client] = deep_copy(over)
    kwargs["peers"] = peers
    kwargs["speeds"] = speeds
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
        elif name == "links":
            # Written only when it emulates something: a scenario without it is written as before.
            links = scenario.links
            if links != LinksConfig():
                out[name] = {k: v for k, v in dataclasses.asdict(links).items() if k != "pairs"}
                if links.pairs:
                    out[name]["pairs"] = links.pair_table()
        elif name == "clock":
            if scenario.clock != ClockConfig():  # written only when set, as [links]
                out[name] = dataclasses.asdict(scenario.clock)
        else:
            out[name] = dataclasses.asdict(getattr(scenario, name))
            if name in _CLASS_TABLES:
                # Only the tables given: a scenario without any is written as before.
                out[name].update(settings_tables(out[name].pop(_CLASS_TABLES[name][1])))
            if name == "topology":
                # Written only when set: a fixed graph with random placement is written as before.
                schedule, tables = out[name].pop("schedule"), out[name].pop("schedule_params")
                if schedule:
                    out[name]["schedule"] = schedule
                if tables:
                    out[name]["schedule_params"] = settings_tables(tables)
                if out[name]["placement"] == "random":
                    del out[name]["placement"]
            if name == "network":
                # Written only when set: a scenario without compression is written as before.
                compression, tables = out[name].pop("compression"), out[name].pop("compression_params")
                if compression != "none":
                    out[name]["compression"] = compression
                if tables:
                    out[name]["compression_params"] = settings_tables(tables)
                for key, default in (("protocol", "sync"), ("max_staleness", 0)):  # as compression
                    if out[name][key] == default:
                        del out[name][key]
    if scenario.peers or scenario.speeds:
        peers: dict[str, dict[str, Any]] = {}
        for k in sorted({*scenario.peers, *scenario.speeds}):
            entry = peers[str(k)] = {}
            if k in scenario.speeds:
                entry["speed"] = scenario.speeds[k]
            if k in scenario.peers:
                entry["aggregation"] = deep_copy(scenario.peers[k])
        out["peers"] = peers
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
    head = attack_head(att)
    out["attack"] = legacy_view("attack", head, ("std", "center", "scale", "z"), {"attack": att.attack_params})
    return out


def scenario_changes(scenario: Scenario) -> dict[str, Any]:
    """Only the settings that differ from the built-in defaults, as a nested table: a run's
    identity, unchanged (and finished runs valid) when a new key's default keeps the old
    behaviour. Settings that had a flat key (:data:`LEGACY`) are written with it, so an old
    scenario keeps its identity byte for byte."""

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
        text = source.read_text(encoding="utf-8-sig")  # a byte-order mark is not TOML: dropped
    except FileNotFoundError:
        raise ScenarioError(f"scenario file not found: {source}") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{source}: not valid TOML: {exc}") from None
    raw = parse_toml(text, str(source))
    return scenario_from_dict(apply_overrides(raw, overrides))


def dump_scenario(scenario: Scenario, path: str | Path) -> str:
    """Write the resolved scenario as TOML; returns the SHA-256 of the bytes written (what
    :func:`load_validated` takes to read them back unchecked)."""
    data = tomli_w.dumps(scenario_to_dict(scenario)).encode()
    Path(path).write_bytes(data)
    return hashlib.sha256(data).hexdigest()


# Environment variable: the SHA-256 of the scenario a launcher validated (:func:`load_validated`).
SCENARIO_DIGEST_ENV = "DFEDRW_SCENARIO_SHA256"


def load_validated(path: str | Path, digest: str) -> Scenario:
    """The scenario a launcher validated and wrote with :func:`dump_scenario` (``digest``: what
    that returned), read without its checks, which its client processes need not run again; a
    file whose bytes are not the ones the launcher wrote is refused."""
    source = Path(path)
    try:
        data = source.read_bytes()
    except FileNotFoundError:
        raise ScenarioError(f"scenario file not found: {source}") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise ScenarioError(f"{source}: not the scenario its launcher validated (its SHA-256 differs from the one the launcher gave)")
    token = _VALIDATED.set(True)
    try:
        return scenario_from_dict(parse_toml(data.decode(), str(source)))
    finally:
        _VALIDATED.reset(token)
