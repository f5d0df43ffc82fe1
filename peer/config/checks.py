"""The checks every scenario key goes through: the error they raise (one line naming the key and
what it accepts), choices, ranges and their limits, and a TOML value coerced to a field's type;
and TOML text read with its nesting bounded."""

from __future__ import annotations
import math
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any
from dfedrw.peer.quote import shown


class ScenarioError(ValueError):
    """A scenario file or override is invalid; the message names the key and the fix."""


def check_choice_of(key: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ScenarioError(f"{key}={shown(value)} is not valid; choose one of: {', '.join(choices)}")


def check_flag(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ScenarioError(f"{key}={shown(value)}: expected true or false")


def bound_text(x: float) -> str:
    return f"{x:_}" if isinstance(x, int) else f"{x:g}"


def check_in_range(key: str, value: float, lo: float, hi: float, *, open_lo: bool = False, open_hi: bool = False) -> None:
    """Refuse ``value`` outside ``[lo, hi]`` (an open end with ``open_lo`` / ``open_hi``), NaN and infinity."""
    finite = not isinstance(value, float) or math.isfinite(value)
    above = value > lo if open_lo else value >= lo
    below = value < hi if open_hi else value <= hi
    if not (finite and above and below):
        interval = f"{'(' if open_lo else '['}{bound_text(lo)}, {bound_text(hi)}{')' if open_hi else ']'}"
        what = "an integer" if isinstance(value, int) else "a finite number"
        raise ScenarioError(f"{key}={shown(value)} must be {what} in {interval}")


# Limits shared by several keys. Clients are OS processes with a gRPC server each, so a few
# thousand is already far past what one machine or a compose cluster can hold; the batched
# engine, whose memory grows with clients x parameters only, goes to tens of thousands.
MAX_CLIENTS = 65_536
# Edges of a drawn graph, each a model sent both ways every round. Past it a dense graph of many
# clients (Erdos-Renyi at the default rho, or complete) takes minutes and gigabytes to draw.
MAX_EDGES = 10_000_000


MAX_ROUNDS = 10_000_000


# No learning rate, noise scale or coefficient comes near it; it only keeps arithmetic finite.
MAX_MAGNITUDE = 1e6


MAX_SECONDS = 86_400.0


# Just under float32's largest finite value (3.4e38).
MAX_ABS_VALUE_LIMIT = 3e38


def coerce_value(key: str, value: Any, type_name: str) -> Any:
    """Check a TOML value against a field's annotated type (annotations are strings here)."""
    t = str(type_name)
    if isinstance(value, bool) and t != "bool":
        raise ScenarioError(f"{key}={shown(value)}: expected {t}, got a boolean")
    if t == "int":
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, int):
            raise ScenarioError(f"{key}={shown(value)}: expected an integer")
        return value
    if t == "float":
        if not isinstance(value, (int, float)):
            raise ScenarioError(f"{key}={shown(value)}: expected a number")
        return float(value)
    if t == "str":
        if not isinstance(value, str):
            raise ScenarioError(f"{key}={shown(value)}: expected a string")
        return value
    if t == "float | str":
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            return value
        raise ScenarioError(f"{key}={shown(value)}: expected a number or a string")
    return value


# Deeper tables and arrays are refused where TOML is read: a scenario or grid needs a handful of
# levels (a list in [peers.K.aggregation.crs_params.NAME] is at the sixth), and past a few hundred
# the parser and every walk of a table run out of stack (a RecursionError, not a message).
MAX_NESTING = 32


def too_deep(where: str, at: str = "") -> ScenarioError:
    """The error of a table nested past :data:`MAX_NESTING` (``at``: the dotted path where it did)."""
    place = f" at {shown(at)}" if at else ""
    return ScenarioError(f"{where}: tables and arrays nested more than {MAX_NESTING} deep{place}; no scenario or grid needs more than a handful")


def check_nesting(where: str, table: Mapping[str, Any]) -> None:
    """Refuse ``table`` if tables and arrays in it nest more than :data:`MAX_NESTING` deep. The walk
    keeps its own stack, so a table nested thousands deep is measured, not recursed into."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(table, ())]
    while stack:
        node, path = stack.pop()
        if len(path) > MAX_NESTING:
            raise too_deep(where, "".join(path).lstrip("."))
        items = ((f".{k}", v) for k, v in node.items()) if isinstance(node, Mapping) else ((f"[{i}]", v) for i, v in enumerate(node))
        for part, child in items:
            if isinstance(child, (Mapping, list, tuple)):
                stack.append((child, (*path, part)))


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """``text`` read as TOML, refused with a :class:`ScenarioError` naming ``where`` when it is
    not TOML or nests past :data:`MAX_NESTING`."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{where}: not valid TOML: {exc}") from None
    except RecursionError:
        # Arrays and inline tables are parsed by recursion: a few hundred levels exhaust the stack.
        raise too_deep(where) from None
    check_nesting(where, raw)
    return raw
