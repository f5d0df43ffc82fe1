"""``--set KEY=VALUE``: a TOML dotted key and a value read as TOML, applied to a raw scenario table."""

from __future__ import annotations
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any
from dfedrw.peer.config.checks import ScenarioError, check_nesting, too_deep
from dfedrw.peer.quote import shown


def _key_path(key: str) -> list[str] | None:
    """The parts of a TOML dotted key (``attack."mylab:MyAttack".k`` -> ``[attack,
    mylab:MyAttack, k]``: quoted parts may hold dots), or None if ``key`` is not one."""
    try:
        table: Any = tomllib.loads(f"{key} = 0")
    except (tomllib.TOMLDecodeError, RecursionError):
        # What stands before an "=" that is not the key's may open arrays thousands deep.
        return None
    path = []
    while isinstance(table, dict) and len(table) == 1:
        (part, table), = table.items()
        path.append(part)
    return path if table == 0 and path else None


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the key is a TOML dotted key (a part in quotes may hold dots or
    ``=``), the value is read as TOML (numbers, booleans, strings) or taken verbatim."""
    for at, char in enumerate(text):
        if char != "=":
            continue
        path = _key_path(text[:at].strip())
        if path is not None:
            value = text[at + 1 :].strip()
            try:
                parsed = tomllib.loads(f"v = {value}")["v"]
            except tomllib.TOMLDecodeError:
                parsed = value
            except RecursionError:
                raise too_deep(f"override {shown(text)}") from None
            return path, parsed
    raise ScenarioError(f"override {shown(text)} must look like key=value, e.g. rounds=100 or attack.\"mylab:MyAttack\".k=2")


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply dotted ``key=value`` overrides to a raw scenario table (returns a new table). A key
    or value that nests the table past :data:`~peer.config.checks.MAX_NESTING` is refused."""
    check_nesting("scenario", raw)
    out = deep_copy(raw)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ScenarioError(f"override {shown(text)}: {shown(part)} is not a table")
            node = child
        node[path[-1]] = value
        check_nesting(f"override {shown(text)}", out)
    return out


def deep_copy(table: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``table`` and of every table in it (recursive: its callers check its nesting first)."""
    return {k: deep_copy(v) if isinstance(v, Mapping) else v for k, v in table.items()}
