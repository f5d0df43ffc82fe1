"""Per-class settings tables of a scenario: a rule's, TPM's, CRS's or attack's settings as
``[aggregation.NAME]``, ``[aggregation.tpm_params.NAME]``, ``[aggregation.crs_params.NAME]`` or
``[attack.NAME]``, checked against the class's constructor (its registry) while a scenario is
parsed, and kept frozen (hashable, only values that differ from the class's defaults)."""

from __future__ import annotations
from collections.abc import Mapping
from typing import Any
from dfedrw.peer.registry import Registry
from dfedrw.peer.plugins import ATTACK_REGISTRY, CRS_REGISTRY, RULE_REGISTRY, TPM_REGISTRY
from dfedrw.peer.config_checks import ScenarioError


# A class's settings table, frozen so the configs stay hashable: ((class name, ((setting,
# value), ...)), ...), both levels sorted. It holds only values that differ from the class's
# defaults, so equal settings compare equal however they were written.
Params = tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]


KIND_REGISTRY: dict[str, Registry] = {"rule": RULE_REGISTRY, "tpm": TPM_REGISTRY, "crs": CRS_REGISTRY, "attack": ATTACK_REGISTRY}


def table_path(prefix: str, kind: str, name: str) -> str:
    """The scenario key of a class's settings table, e.g. ``aggregation.crs_params.softmax``."""
    if kind in ("tpm", "crs"):
        return f"{prefix}.{kind}_params.{toml_key(name)}"
    return f"{prefix}.{toml_key(name)}"


def toml_key(name: str) -> str:
    return name if name.replace("_", "").replace("-", "").isalnum() else f'"{name}"'


def freeze(tables: Mapping[str, Mapping[str, Any]]) -> Params:
    return tuple(sorted((name, tuple(sorted(t.items()))) for name, t in tables.items() if t))


def thaw(params: Params) -> dict[str, dict[str, Any]]:
    return {name: dict(items) for name, items in params}


def frozen_value(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(frozen_value(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((k, frozen_value(v)) for k, v in value.items()))
    return value


def toml_value(value: Any) -> Any:
    return [toml_value(v) for v in value] if isinstance(value, tuple) else value


def default_of(kind: str, name: str, setting: str) -> Any:
    for s in KIND_REGISTRY[kind].settings(name):
        if s.name == setting:
            return None if s.default is s.REQUIRED else s.default
    return None


def resolve_class(kind: str, name: Any, key: str) -> type:
    if not isinstance(name, str):
        raise ScenarioError(f"{key}={name!r}: expected a string")
    try:
        return KIND_REGISTRY[kind].resolve(name)
    except ValueError as exc:
        raise ScenarioError(f"{key}={name!r}: {exc}") from None


class SettingsTables:
    """Mutable settings tables of one config while it is parsed: kind -> name -> setting -> value,
    and which scenario key set each value (for messages)."""

    def __init__(self, params: Mapping[str, Params], origins: Params) -> None:
        self.tables = {kind: thaw(p) for kind, p in params.items()}
        self.origins = {tuple(k.split("\0")): dict(v)["key"] for k, v in origins} if origins else {}

    def set(self, kind: str, name: str, setting: str, value: Any, key: str, *, unset: bool = False) -> None:
        registry = KIND_REGISTRY[kind]
        if not isinstance(setting, str):
            raise ScenarioError(f"{key}: setting names are strings")
        table = self.tables.setdefault(kind, {}).setdefault(name, {})
        if unset:
            table.pop(setting, None)
            return
        try:
            value = registry.coerce(name, setting, value)
        except ValueError as exc:
            raise ScenarioError(f"{key}={value!r}: {exc}") from None
        value = frozen_value(value)
        default = default_of(kind, name, setting)
        if value == default and type(value) is type(default):
            table.pop(setting, None)
        else:
            table[setting] = value
            self.origins[(kind, name, setting)] = key

    def table(self, kind: str, name: str, values: Any, key: str) -> None:
        resolve_class(kind, name, key)
        if not isinstance(values, Mapping):
            raise ScenarioError(f"{key} must be a table of {name!r}'s settings, got {values!r}")
        for setting, value in values.items():
            self.set(kind, name, setting, value, f"{key}.{setting}")

    def frozen(self, kind: str) -> Params:
        return freeze(self.tables.get(kind, {}))

    def frozen_origins(self) -> Params:
        return tuple(sorted(("\0".join(k), (("key", v),)) for k, v in self.origins.items()))


def origin_of(origins: Params, kind: str, name: str, setting: str) -> str | None:
    for k, v in origins:
        if k == "\0".join((kind, name, setting)):
            return dict(v)["key"]
    return None


def settings_tables(params: Params) -> dict[str, dict[str, Any]]:
    return {name: {k: toml_value(v) for k, v in items} for name, items in params}
