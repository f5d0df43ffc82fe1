"""A grid file: its format, its checks, and the points it expands to (see :mod:`experiments.sweep`
for the format in full and what a sweep does with the points)."""

from __future__ import annotations
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
import tomli_w
from dfedrw.peer.config.scenario import ScenarioError
from dfedrw.peer.config.checks import parse_toml
from dfedrw.peer.config.overrides import parse_override
from dfedrw.peer.quote import shown


GRID_KEYS = ("base", "set", "axes", "variants", "exclude", "report")


VARIANT_KEYS = ("label", "set")


class SweepError(ValueError):
    """A grid file or a point of it is invalid; the message names the problem and the fix."""


@dataclass(frozen=True)
class AxisValue:
    label: str
    overrides: tuple[str, ...]
    # The TOML value of a plain axis; a variant's label.
    raw: Any


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[AxisValue, ...]
    variant: bool = False

    @property
    def labels(self) -> list[str]:
        return [v.label for v in self.values]


@dataclass(frozen=True)
class Grid:
    path: Path
    base: Path | None
    fixed: tuple[str, ...]
    axes: tuple[Axis, ...]
    excludes: tuple[Mapping[str, Any], ...] = ()
    report: Mapping[str, Any] | None = None

    def axis_labels(self) -> dict[str, list[str]]:
        """Axis name -> its value labels, in grid order."""
        return {a.name: a.labels for a in self.axes}


@dataclass(frozen=True)
class Point:
    labels: Mapping[str, str]
    overrides: tuple[str, ...]

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.labels.items()) or "(the base scenario)"


def toml_value(value: Any) -> str:
    """``value`` written as a TOML value, so that ``key=<it>`` parses back to the same value."""
    return tomli_w.dumps({"v": value}).strip()[len("v = "):]


def _label(value: Any) -> str:
    return value if isinstance(value, str) else toml_value(value)


def _string_list(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SweepError(f"{where} must be a list of \"key=value\" strings, got {shown(value)}")
    for text in value:
        try:
            parse_override(text)
        except ScenarioError as exc:
            raise SweepError(f"{where}: {exc}") from None
    return tuple(value)


def load_grid(path: str | Path) -> Grid:
    """Read and check a grid file (the module docstring describes the format)."""
    path = Path(path).resolve()
    try:
        raw = parse_toml(path.read_text(encoding="utf-8-sig"), str(path))  # a byte-order mark is not TOML: dropped
    except FileNotFoundError:
        raise SweepError(f"grid file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise SweepError(f"{path}: not valid TOML: {exc}") from None
    except ScenarioError as exc:
        raise SweepError(str(exc)) from None
    if not raw:
        raise SweepError(f"{path}: an empty grid; give it a base, set, [axes] or [[variants.NAME]] (see `dfedrw sweep --help`)")
    for key in raw:
        if key not in GRID_KEYS:
            raise SweepError(f"{path}: unknown key '{key}'; valid keys: {', '.join(GRID_KEYS)}")

    base = None
    if raw.get("base"):
        if not isinstance(raw["base"], str):
            raise SweepError(f"{path}: base must be a path string, got {shown(raw['base'])}")
        base = (path.parent / raw["base"]).resolve()
        if not base.is_file():
            raise SweepError(f"{path}: base scenario file {'is a folder' if base.is_dir() else 'not found'}: {base}")
    fixed = _string_list(f"{path}: set", raw.get("set", []))
    fixed_keys: dict[str, str] = {}  # key -> its entry in set (the last, as --set takes them)
    for entry in fixed:
        try:
            fixed_keys[".".join(parse_override(entry)[0])] = entry
        except ValueError:
            continue  # a malformed entry is refused, naming it, when the points are resolved

    axes: list[Axis] = []
    plain = raw.get("axes", {})
    if not isinstance(plain, Mapping):
        raise SweepError(f"{path}: [axes] must be a table of key = [values]")
    for name, values in plain.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{path}: axis '{name}' needs a non-empty list of values, got {shown(values)}")
        if name in fixed_keys:
            raise SweepError(f"{path}: {name} is an axis and is also in set ({shown(fixed_keys[name])}), which the axis overrides at every point; drop one")
        entries = []
        for v in values:
            if not isinstance(v, (str, int, float, bool)):
                raise SweepError(f"{path}: axis '{name}': value {shown(v)} must be a string, number or boolean")
            entries.append(AxisValue(_label(v), (f"{name}={toml_value(v)}",), v))
        axes.append(Axis(name, tuple(entries)))

    variants = raw.get("variants", {})
    if not isinstance(variants, Mapping):
        raise SweepError(f"{path}: variants must be tables of [[variants.NAME]] entries")
    for name, entries in variants.items():
        if name in plain:
            raise SweepError(f"{path}: '{name}' is both an axis and a variant axis; rename one")
        if not isinstance(entries, list) or not entries or not all(isinstance(e, Mapping) for e in entries):
            raise SweepError(f"{path}: variants.{name} must be a list of [[variants.{name}]] tables")
        values = []
        for i, entry in enumerate(entries):
            where = f"{path}: variants.{name}[{i}]"
            for key in entry:
                if key not in VARIANT_KEYS:
                    raise SweepError(f"{where}: unknown key '{key}'; valid keys: {', '.join(VARIANT_KEYS)}")
            label = entry.get("label")
            if not isinstance(label, str) or not label:
                raise SweepError(f"{where}: needs a label string")
            values.append(AxisValue(label, _string_list(f"{where}.set", entry.get("set", [])), label))
        axes.append(Axis(name, tuple(values), variant=True))

    for axis in axes:
        seen = set()
        for label in axis.labels:
            if label in seen:
                raise SweepError(f"{path}: axis '{axis.name}' has the value '{label}' twice")
            seen.add(label)

    names = [a.name for a in axes]
    excludes = raw.get("exclude", [])
    if not isinstance(excludes, list) or not all(isinstance(e, Mapping) for e in excludes):
        raise SweepError(f"{path}: exclude must be a list of [[exclude]] tables")
    for i, ex in enumerate(excludes):
        if not ex:
            raise SweepError(f"{path}: exclude[{i}] is empty; it would remove every point")
        for key in ex:
            if key not in names:
                raise SweepError(f"{path}: exclude[{i}]: unknown axis '{key}'; axes: {', '.join(names)}")

    report = raw.get("report")
    if report is not None and not isinstance(report, Mapping):
        raise SweepError(f"{path}: [report] must be a table")
    return Grid(path, base, fixed, tuple(axes), tuple(excludes), report)


def _matches(value: AxisValue, wanted: Any) -> bool:
    options = wanted if isinstance(wanted, list) else [wanted]
    return any(w == value.raw or (isinstance(w, str) and w == value.label) for w in options)


def expand(grid: Grid) -> list[Point]:
    """Every point of the grid: the product of its axes (first axis slowest), less the excluded."""
    points = []
    for combo in itertools.product(*(a.values for a in grid.axes)):
        chosen = dict(zip((a.name for a in grid.axes), combo))
        if any(all(_matches(chosen[k], v) for k, v in ex.items()) for ex in grid.excludes):
            continue
        plain = [o for a in grid.axes if not a.variant for o in chosen[a.name].overrides]
        bundles = [o for a in grid.axes if a.variant for o in chosen[a.name].overrides]
        points.append(Point({k: v.label for k, v in chosen.items()}, (*grid.fixed, *plain, *bundles)))
    return points
