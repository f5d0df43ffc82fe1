"""The [aggregation] and [attack] sections of a scenario: which rule, TPM, CRS and attack, each
class's settings tables, how they are parsed (old flat keys included), checked and written back."""

from __future__ import annotations
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from dfedrw.peer.quote import shown
from dfedrw.peer.checked import Checked
from dfedrw.peer.registry import Registry
from dfedrw.peer.attacks.base import AttackerData, threat_model_of
from dfedrw.peer.kinds.registries import ATTACK_REGISTRY
from dfedrw.peer.config.checks import ScenarioError
from dfedrw.peer.config.legacy import LEGACY, set_legacy
from dfedrw.peer.config.tables import (
    KIND_REGISTRY, Params, SettingsTables, origin_of, resolve_class, settings_tables, table_path, thaw, toml_key, toml_value,
)
from dfedrw.peer.config.checks import MAX_CLIENTS, MAX_ROUNDS, check_choice_of, check_flag, check_in_range, coerce_value

SCORE_LIES = ("none", "frame", "praise", "frame_one", "invert")  # attack.scores
STRIKES = ("schedule", "trusted")  # attack.strike


@dataclass(frozen=True)
class AttackConfig:
    """``name``: ``"none"``, a registered attack or ``module:Class``; ``attack_params``: the
    settings tables ``[attack.NAME]`` (every one given is checked, the named one is used)."""

    name: str = "none"
    attack_params: Params = ()
    # The Byzantine clients act as one group: each round they pool the honest models they
    # received over their own authenticated channel and agree one plan before they send.
    colluding: bool = False
    # The attack window: rounds start .. stop - 1 (stop = 0: to the last round); outside it each
    # Byzantine client sends the mean of the honest models it knows (a free-rider that harms no
    # one), so a backdoor's durability can be measured.
    start: int = 0
    stop: int = 0
    # On-off within the window (period = 0: attack every round of it): of each `period` rounds
    # from `start`, the first `on` attack and the others behave as outside the window, so a
    # defence that keeps trust over rounds is tested against an attacker that earns it back.
    period: int = 0
    on: int = 0
    # The scores the Byzantine clients report with their models (peer/round/byzantine.py,
    # reported_scores): "none", "frame" (every honest neighbour far worse than themselves),
    # "praise" (themselves far better than every honest one), "frame_one" (one honest neighbour
    # far worse than everyone), "invert" (both at once).
    scores: str = "none"
    # When they attack within the window: "schedule" (every round of it, or its on-off parts);
    # "trusted" (reputation then strike, peer/round/byzantine.py, Standing): a client behaves
    # until the scores its honest neighbours report (network.share_scores) ranked it trusted in
    # `trusted_rounds` rounds in a row, then attacks for as long as they go on doing so.
    strike: str = "schedule"
    trusted_rounds: int = 5
    # Not part of the identity: where the config came from, for messages.
    prefix: str = field(default="attack", compare=False, repr=False)
    origins: Params = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        check_flag(f"{self.prefix}.colluding", self.colluding)
        check_choice_of(f"{self.prefix}.scores", self.scores, SCORE_LIES)
        check_in_range(f"{self.prefix}.start", self.start, 0, MAX_ROUNDS)
        check_in_range(f"{self.prefix}.stop", self.stop, 0, MAX_ROUNDS)
        if self.stop and self.stop <= self.start:
            raise ScenarioError(f"{self.prefix}.stop={self.stop} must be after {self.prefix}.start={self.start} (or 0: to the last round)")
        check_in_range(f"{self.prefix}.period", self.period, 0, MAX_ROUNDS)
        check_in_range(f"{self.prefix}.on", self.on, 0, MAX_ROUNDS - 1)
        if self.on and not self.period:
            raise ScenarioError(f"{self.prefix}.period=0 with {self.prefix}.on={self.on}: set the period whose first {self.prefix}.on rounds attack")
        if self.period == 1:
            raise ScenarioError(f"{self.prefix}.period=1 must be at least 2: a round that attacks and one that does not")
        if self.period and not 1 <= self.on < self.period:
            raise ScenarioError(f"{self.prefix}.on={self.on}: the rounds of each period of {self.period} that attack, from 1 to {self.period - 1}")
        check_choice_of(f"{self.prefix}.strike", self.strike, STRIKES)
        check_in_range(f"{self.prefix}.trusted_rounds", self.trusted_rounds, 1, MAX_ROUNDS)
        if self.strike == "schedule" and self.trusted_rounds != AttackConfig.trusted_rounds:
            raise ScenarioError(f"{self.prefix}.trusted_rounds={self.trusted_rounds} is read only with {self.prefix}.strike = \"trusted\"")
        if self.strike == "trusted" and self.period:
            raise ScenarioError(
                f"{self.prefix}.strike = \"trusted\" with {self.prefix}.period={self.period}: an attacker strikes on the calendar "
                f"(period, on) or when it is trusted, not both; set one"
            )
        if self.name != "none":
            cls = resolve_class("attack", self.name, f"{self.prefix}.name")
            model = threat_model_of(cls)
            if model is not None and model.colludes and not self.colluding:
                raise ScenarioError(
                    f"{self.prefix}.name={shown(self.name)} is an attack of colluding clients: set {self.prefix}.colluding = true"
                )

    def attacks_in(self, r: int) -> bool:
        """Whether round ``r`` lies in the attack window, and in an "on" part of it (with
        ``strike = "trusted"`` the client attacks in such a round only when trusted then)."""
        return self.start <= r and (not self.stop or r < self.stop) and (not self.period or (r - self.start) % self.period < self.on)

    def params(self, name: str | None = None) -> dict[str, Any]:
        """The settings of attack ``name`` (default: the one in use) that differ from its defaults."""
        return dict(thaw(self.attack_params).get(self.name if name is None else name, {}))

    def key(self, name: str, setting: str | None = None) -> str:
        """The scenario key that set ``setting`` of ``name`` (or of its table)."""
        table = table_path(self.prefix, "attack", name)
        if setting is None:
            return table
        return origin_of(self.origins, "attack", name, setting) or f"{table}.{setting}"


@dataclass(frozen=True)
class AggregationConfig:
    """``rule``, ``tpm``, ``crs``: registered names or ``module:Class``; ``*_params``: the
    settings tables ``[aggregation.RULE]``, ``[aggregation.tpm_params.TPM]``,
    ``[aggregation.crs_params.CRS]`` (every one given is checked, the named ones are used)."""

    rule: str = "dfedreweighting"
    tpm: str = "loss"
    crs: str = "loss_clip_mean"
    # The number of Byzantine neighbours rules taking num_byzantine (trimmed_mean, krum, ...) are
    # told: -1 = the client's true count (an oracle the experimenter has), else this number.
    assumed_byzantine: int = -1
    rule_params: Params = ()
    tpm_params: Params = ()
    crs_params: Params = ()
    # Not part of the identity: where the config came from, for messages.
    prefix: str = field(default="aggregation", compare=False, repr=False)
    origins: Params = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        for kind in ("rule", "tpm", "crs"):
            resolve_class(kind, getattr(self, kind), f"{self.prefix}.{kind}")
        if isinstance(self.assumed_byzantine, bool) or not isinstance(self.assumed_byzantine, int):
            raise ScenarioError(f"{self.prefix}.assumed_byzantine={shown(self.assumed_byzantine)}: expected an integer")
        check_in_range(f"{self.prefix}.assumed_byzantine", self.assumed_byzantine, -1, MAX_CLIENTS)

    def tables(self, kind: str) -> dict[str, dict[str, Any]]:
        return thaw(getattr(self, f"{kind}_params"))

    def params(self, kind: str, name: str | None = None) -> dict[str, Any]:
        """The settings of the ``kind`` ("rule", "tpm", "crs") class ``name`` (default: the one
        in use) that differ from its defaults."""
        return dict(self.tables(kind).get(getattr(self, kind) if name is None else name, {}))

    def key(self, kind: str, name: str, setting: str | None = None) -> str:
        """The scenario key that set ``setting`` of ``name`` (or of its table)."""
        table = table_path(self.prefix, kind, name)
        if setting is None:
            return table
        return origin_of(self.origins, kind, name, setting) or f"{table}.{setting}"


AGGREGATION_KEYS = ("rule", "tpm", "crs", "assumed_byzantine")


def parse_aggregation(prefix: str, table: Mapping[str, Any], base: AggregationConfig | None = None) -> AggregationConfig:
    """An [aggregation] table (or a [peers.K.aggregation] override of ``base``)."""
    if not isinstance(table, Mapping):
        raise ScenarioError(f"'{prefix}' must be a table, got {shown(table)}")
    base = base or AggregationConfig()
    tables = SettingsTables({k: getattr(base, f"{k}_params") for k in ("rule", "tpm", "crs")}, base.origins)
    scalars: dict[str, Any] = {}
    for key, value in table.items():
        where = f"{prefix}.{key}"
        if key in ("rule", "tpm", "crs"):
            if not isinstance(value, str):
                raise ScenarioError(f"{where}={shown(value)}: expected a string")
            scalars[key] = value
        elif key == "assumed_byzantine":
            scalars[key] = coerce_value(where, value, "int")
        elif key in ("tpm_params", "crs_params"):
            kind = key.partition("_")[0]
            if not isinstance(value, Mapping):
                raise ScenarioError(f"{where} must be a table of {kind} settings tables, e.g. [{where}.NAME]")
            for name, values in value.items():
                tables.table(kind, name, values, f"{where}.{toml_key(name)}")
        else:
            _class_table_or_legacy(tables, "aggregation", prefix, key, value, "rule", [*AGGREGATION_KEYS, "tpm_params", "crs_params"])
    return dataclasses.replace(
        base,
        **scalars,
        rule_params=tables.frozen("rule"),
        tpm_params=tables.frozen("tpm"),
        crs_params=tables.frozen("crs"),
        prefix=prefix,
        origins=tables.frozen_origins(),
    )


def _class_table_or_legacy(tables: SettingsTables, section: str, prefix: str, key: str, value: Any, kind: str, valid: list[str]) -> None:
    """A key of ``[section]`` (at ``prefix``) that is none of its own: an earlier version's flat
    key, or the settings table of a ``kind`` class, else an error naming the valid keys."""
    where = f"{prefix}.{key}"
    legacy = [k.partition(".")[2] for k in LEGACY if k.startswith(f"{section}.")]
    registry = KIND_REGISTRY[kind]
    if key in legacy:
        set_legacy(tables, f"{section}.{key}", value, where)
    elif isinstance(value, Mapping) and (key in registry or ":" in key):
        tables.table(kind, key, value, f"{prefix}.{toml_key(key)}")
    else:
        article = "an" if kind[0] in "aeiou" else "a"
        raise ScenarioError(
            f"unknown key '{where}'; valid keys: {', '.join(valid)}, {article} {kind}'s settings table "
            f"({', '.join(registry.names())} or 'module:Class'), or an earlier version's {', '.join(legacy)}"
        )


def parse_attack(prefix: str, table: Mapping[str, Any]) -> AttackConfig:
    if not isinstance(table, Mapping):
        raise ScenarioError(f"'{prefix}' must be a table, got {shown(table)}")
    tables = SettingsTables({}, ())
    name: Any = AttackConfig.name
    colluding = AttackConfig.colluding
    scores: Any = AttackConfig.scores
    strike: Any = AttackConfig.strike
    window = {
        "start": AttackConfig.start, "stop": AttackConfig.stop, "period": AttackConfig.period, "on": AttackConfig.on,
        "trusted_rounds": AttackConfig.trusted_rounds,
    }
    for key, value in table.items():
        where = f"{prefix}.{key}"
        if key == "name":
            if not isinstance(value, str):
                raise ScenarioError(f"{where}={shown(value)}: expected a string")
            name = value
        elif key == "colluding":
            check_flag(where, value)
            colluding = value
        elif key == "scores":
            scores = value
        elif key == "strike":
            strike = value
        elif key in window:
            window[key] = coerce_value(where, value, "int")
        else:
            _class_table_or_legacy(tables, "attack", prefix, key, value, "attack", ["name", "colluding", "scores", "strike", *window])
    return AttackConfig(
        name=name, attack_params=tables.frozen("attack"), colluding=colluding, scores=scores, strike=strike, **window, prefix=prefix,
        origins=tables.frozen_origins(),
    )


def _checked(registry: Registry, name: str, params: Mapping[str, Any], supplied: Mapping[str, Any], key: Any) -> None:
    """``registry.check`` with a class's ValueError turned into one ScenarioError line naming
    the key that set the offending value (``key(setting)``; ``key(None)`` is the table)."""
    try:
        return registry.check(name, params, supplied)
    except ValueError as exc:
        message = " ".join(str(exc).split())
    for setting, value in params.items():
        try:
            registry.check(name, {setting: value}, supplied)
        except ValueError:
            raise ScenarioError(f"{key(setting)}={shown(toml_value(value))}: {message}") from None
    raise ScenarioError(f"{key(None)}: {message}")


def check_aggregation(cfg: AggregationConfig, *, num_byzantine: int, lr: float, seed: int = 0, total_rounds: int = 0) -> None:
    """Check every rule, TPM and CRS ``cfg`` configures (its own and every settings table given),
    with stand-ins for what the running system supplies, so a bad setting fails with one line
    naming its key; no built-in class is built (:meth:`Registry.check`, :func:`_scoring_parts`)."""
    supplied: dict[str, Any] = {"num_byzantine": num_byzantine, "lr": lr, "seed": seed, "total_rounds": total_rounds}
    for kind in ("tpm", "crs", "rule"):
        registry = KIND_REGISTRY[kind]
        for name in dict.fromkeys([getattr(cfg, kind), *cfg.tables(kind)]):
            given = {**supplied, **_scoring_parts(cfg, name, supplied)} if kind == "rule" else supplied
            _checked(registry, name, cfg.params(kind, name), given, lambda s, k=kind, n=name: cfg.key(k, n, s))


def _scoring_parts(cfg: AggregationConfig, rule: str, supplied: Mapping[str, Any]) -> dict[str, Any]:
    """The TPM and CRS rule ``rule`` is given while checked: None for a ``Checked`` class (they
    are supplied objects), else the ones in use, built (a plugin's rule is built to be checked)."""
    cls = KIND_REGISTRY["rule"].resolve(rule)
    if isinstance(cls, type) and issubclass(cls, Checked):
        return {"tpm": None, "crs": None}
    return {kind: KIND_REGISTRY[kind].build(getattr(cfg, kind), cfg.params(kind, getattr(cfg, kind)), supplied) for kind in ("tpm", "crs")}


def check_attack(
    cfg: AttackConfig, *, num_clients: int, num_byzantine: int, lr: float = 0.01, total_rounds: int = 0, defence: Any = None,
    round_window: int = 2,
) -> None:
    """Check the attack in use (when there are Byzantine clients) and every settings table given
    (see :meth:`Registry.check`), with stand-ins for what only a running Byzantine client has: a
    data sample that loads nothing (an attack touches its data in its rounds, not when built) and
    ``defence`` (the honest clients' rule where the caller has one, else None)."""
    names = dict.fromkeys([*([cfg.name] if cfg.name != "none" else []), *thaw(cfg.attack_params)])
    knowledge = {"lr": lr, "total_rounds": total_rounds, "defence": defence, "attacker_data": _NO_DATA, "round_window": round_window}
    for name in names:
        active = name == cfg.name and num_byzantine > 0
        # A table of an attack not in use is checked with counts every attack accepts.
        supplied = {"num_clients": num_clients, "num_byzantine": num_byzantine} if active else {"num_clients": max(num_clients, 3), "num_byzantine": 1}
        _checked(ATTACK_REGISTRY, name, cfg.params(name), {**supplied, **knowledge}, lambda s, n=name: cfg.key(n, s))


def _no_data(*_: Any) -> Any:
    raise RuntimeError("an attack's data sample is loaded by the running Byzantine client, not when a scenario is checked")


_NO_DATA = AttackerData(_no_data, _no_data, num_classes=2, description="none while the scenario is checked")


def aggregation_table(cfg: AggregationConfig) -> dict[str, Any]:
    out: dict[str, Any] = {k: getattr(cfg, k) for k in AGGREGATION_KEYS}
    out.update(settings_tables(cfg.rule_params))
    for kind in ("tpm", "crs"):
        tables = settings_tables(getattr(cfg, f"{kind}_params"))
        if tables:
            out[f"{kind}_params"] = tables
    return out


def attack_table(cfg: AttackConfig) -> dict[str, Any]:
    return {**attack_head(cfg), **settings_tables(cfg.attack_params)}


def attack_head(cfg: AttackConfig) -> dict[str, Any]:
    """The attack's name and the settings of its own section that differ from their defaults
    (colluding, the window, the scores): runs without them keep their files and identities."""
    return {
        "name": cfg.name,
        **({"colluding": True} if cfg.colluding else {}),
        **({"start": cfg.start} if cfg.start != AttackConfig.start else {}),
        **({"stop": cfg.stop} if cfg.stop != AttackConfig.stop else {}),
        **({"period": cfg.period, "on": cfg.on} if cfg.period != AttackConfig.period else {}),
        **({"scores": cfg.scores} if cfg.scores != AttackConfig.scores else {}),
        **({"strike": cfg.strike} if cfg.strike != AttackConfig.strike else {}),
        **({"trusted_rounds": cfg.trusted_rounds} if cfg.trusted_rounds != AttackConfig.trusted_rounds else {}),
    }
