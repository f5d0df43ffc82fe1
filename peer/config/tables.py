"""Per-class settings tables of a scenario (``[aggregation.NAME]``, ``[attack.NAME]``, ...: each
kind's place is in :data:`~dfedrw.peer.kinds.table.KINDS`), checked against the class's
constructor (its registry) while a scenario is parsed, and kept frozen (hashable, only values
that differ from the class's defaults)."""

from __future__ import annotations
from collections.abc import Mapping, Sequence
from typing import Any
from dfedrw.peer.quote import shown
from dfedrw.peer.config.checks import ScenarioError
from dfedrw.peer.kinds.table import KINDS, by_name
from dfedrw.peer.registry import Registry


# A class's settings table, frozen so the configs stay hashable: ((class name, ((setting, value),
# ...)), ...), both levels sorted, only non-default values: equal settings compare equal.
Params = tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]


# Kind -> its registry (peer/kinds/table.py declares the kinds).
KIND_REGISTRY: dict[str, Registry] = {k.name: k.registry for k in KINDS}


def table_path(prefix: str, kind: str, name: str) -> str:
    """The scenario key of a class's settings table, e.g. ``aggregation.crs_params.softmax``."""
    return by_name[kind].table_path(toml_key(name), prefix)


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
        raise ScenarioError(f"{key}={shown(name)}: expected a string")
    try:
        return KIND_REGISTRY[kind].resolve(name)
    except ValueError as exc:
        raise ScenarioError(f"{key}={shown(name)}: {exc}") from None


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
            raise ScenarioError(f"{key}={shown(value)}: {exc}") from None
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
            raise ScenarioError(f"{key} must be a table of {shown(name)}'s settings, got {shown(values)}")
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


def parse_class_tables(section: str, table: Mapping[str, Any], fields: Sequence[str], kind: str) -> tuple[dict[str, Any], Params]:
    """A section whose class is chosen by one of its keys (``[data]``'s ``name``, ``[train]``'s
    ``model``, ``[topology]``'s ``kind``, ``[network]``'s ``transport``): (its plain keys, the
    frozen settings tables ``[SECTION.NAME]`` it gives). An unknown key names the valid ones."""
    registry = KIND_REGISTRY[kind]
    tables = SettingsTables({}, ())
    plain: dict[str, Any] = {}
    for key, value in table.items():
        if key in fields:
            plain[key] = value
        elif isinstance(value, Mapping) and isinstance(key, str) and (key in registry or ":" in key):
            tables.table(kind, key, value, f"{section}.{toml_key(key)}")
        else:
            raise ScenarioError(
                f"unknown key '{section}.{key}'; valid keys: {', '.join(fields)}, "
                f"or a {kind}'s settings table ({', '.join(registry.names())} or 'module:Name')"
            )
    return plain, tables.frozen(kind)


def checked_params(kind: str, name: str, params: Params, key: str) -> dict[str, Any]:
    """The settings of class ``name`` from a frozen table, each checked against its constructor
    (a bad name or key raises :class:`ScenarioError` naming ``key``)."""
    resolve_class(kind, name, key)
    tables = SettingsTables({kind: params}, ())
    for table_name, values in thaw(params).items():
        resolve_class(kind, table_name, f"{key.rpartition('.')[0]}.{toml_key(table_name)}")
        for setting, value in values.items():
            tables.set(kind, table_name, setting, value, f"{key.rpartition('.')[0]}.{toml_key(table_name)}.{setting}")
    return {k: toml_value(v) for k, v in thaw(params).get(name, {}).items()}
