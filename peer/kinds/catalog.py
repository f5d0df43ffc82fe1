"""Every registry listed: ``dfedrw list`` and the generated tables of docs/reference.md, for
each kind of :mod:`peer.kinds.table` (rules, TPMs, CRSs, attacks, data sets, models, topologies,
schedules and transports: each a :class:`~dfedrw.peer.registry.Registry`)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dfedrw.peer.attacks.base import UNDECLARED
from dfedrw.peer.kinds.table import KINDS
from dfedrw.peer.registry import Registry, Setting

__all__ = ["REGISTRIES", "SETTINGS_TABLE", "describe_text", "list_registered", "render_markdown", "render_readme", "sync_readme"]

# Plural kind (as `dfedrw list` and the registry markers of docs/reference.md name it) -> registry.
REGISTRIES: dict[str, Registry] = {k.plural: k.registry for k in KINDS}

# Where each kind's settings table lives in a scenario ({name}: the class's name or import path).
SETTINGS_TABLE: dict[str, str] = {k.plural: k.table_path("{name}") for k in KINDS}


def _default_text(setting: Setting) -> str:
    if setting.default is Setting.REQUIRED:
        return "(required)"
    if setting.default is None:
        return "unset"
    if isinstance(setting.default, str):
        return f'"{setting.default}"'
    return repr(setting.default)


def _rows(kind: str, names: Iterable[str] | None, builtin_only: bool) -> list[dict[str, Any]]:
    registry = REGISTRIES[kind]
    if names is None:
        names = registry.builtin_names() if builtin_only else registry.names()
    return registry.describe(names)


def describe_text(kind: str, names: Iterable[str] | None = None, *, builtin_only: bool = False) -> str:
    """Plain text for ``dfedrw list``: every name with its settings, defaults and summary."""
    lines = [f"{kind} (settings in [{SETTINGS_TABLE[kind].format(name='NAME')}]):"]
    for row in _rows(kind, names, builtin_only):
        lines.append(f"  {row['name']}  ({row['cls']})")
        if row["doc"]:
            lines.append(f"      {row['doc']}")
        for s in row["settings"]:
            kind_text = f": {s.annotation}" if s.annotation else ""
            lines.append(f"      {s.name}{kind_text} = {_default_text(s)}")
        if row["supplied"]:
            lines.append(f"      given by the running system: {', '.join(row['supplied'])}")
        if kind == "attacks":
            lines.append(f"      threat model: {row['threat'] or UNDECLARED}")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(kind: str, names: Iterable[str] | None = None, *, builtin_only: bool = True) -> str:
    """The reference table of one kind (as docs/reference.md shows it), rendered from its registry."""
    table = SETTINGS_TABLE[kind]
    threat = kind == "attacks"
    lines = [
        f"| name | settings (`[{table.format(name='NAME')}]`), defaults | given by the run | what it is |" + (" threat model |" if threat else ""),
        "|---|---|---|---|" + ("---|" if threat else ""),
    ]
    for row in _rows(kind, names, builtin_only):
        settings = ", ".join(f"`{s.name}` = {_default_text(s)}" for s in row["settings"]) or "—"
        supplied = ", ".join(f"`{n}`" for n in row["supplied"]) or "—"
        doc = row["doc"].replace("``", "`")
        line = f"| `{row['name']}` | {_cell(settings)} | {supplied} | {_cell(doc)} |"
        if threat:
            line += f" {_cell(row['threat'] or UNDECLARED)} |"
        lines.append(line)
    return "\n".join(lines)


_MARKER = re.compile(r"(<!-- registry:(\w+) -->\n)(.*?)(<!-- /registry:\2 -->)", re.S)


def render_readme(text: str) -> str:
    """``text`` with every ``<!-- registry:KIND -->`` ... ``<!-- /registry:KIND -->`` block
    replaced by the table :func:`render_markdown` gives for KIND."""

    def replace(match: re.Match[str]) -> str:
        kind = match.group(2)
        if kind not in REGISTRIES:
            raise ValueError(f"marker registry:{kind}: no such registry; use {', '.join(REGISTRIES)}")
        return f"{match.group(1)}{render_markdown(kind)}\n{match.group(4)}"

    opened = re.findall(r"^<!-- registry:(\w+) -->$", text, re.M)  # markers are lines of their own
    closed = re.findall(r"^<!-- /registry:(\w+) -->$", text, re.M)
    if not opened:
        raise ValueError("no <!-- registry:KIND --> marker: nothing to rewrite (the project's tables are in docs/reference.md)")
    if sorted(opened) != sorted(closed):
        unclosed = sorted(set(opened) - set(closed)) or sorted(set(closed) - set(opened)) or opened
        raise ValueError(f"registry markers without their pair: {', '.join(unclosed)} (each <!-- registry:KIND --> ends at <!-- /registry:KIND -->)")
    return _MARKER.sub(replace, text)


def sync_readme(path: str | Path, *, check: bool = False) -> bool:
    """Regenerate the registry tables of a markdown file (e.g. docs/reference.md) in place; with
    ``check`` only report. True when the file was already up to date."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    fresh = render_readme(text)
    if fresh != text and not check:
        path.write_text(fresh, encoding="utf-8")
    return fresh == text


def list_registered(
    kind: str | None = None, *, plugins: Iterable[str] = (), modules: Iterable[str] = (), markdown: bool = False
) -> str:
    """What ``dfedrw list`` prints: every registered name of ``kind`` (all kinds when None),
    built-in and installed plugins, with its settings, defaults and docstring summary. ``modules``
    are imported first (one may register classes); ``plugins``: import paths ``module:Class`` of
    ``kind`` to describe as well (they cannot be discovered otherwise). Raises ``ValueError`` for
    an unknown kind or a bad plugin."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - reported in one line
            raise ValueError(f"--module {module}: cannot import: {type(exc).__name__}: {' '.join(str(exc).split())}") from None
    plugins = list(plugins)
    if kind is not None and kind not in REGISTRIES:
        raise ValueError(f"no such kind {kind!r}; choose one of: {', '.join(REGISTRIES)}")
    if plugins and kind is None:
        raise ValueError(f"--plugin needs a kind: dfedrw list {{{','.join(REGISTRIES)}}} --plugin module:Class")
    kinds = [kind] if kind else list(REGISTRIES)
    parts = []
    for k in kinds:
        names = REGISTRIES[k].names() + [p for p in plugins if k == kind]
        for p in plugins:
            REGISTRIES[k].resolve(p)
        parts.append(render_markdown(k, names) if markdown else describe_text(k, names))
    return "\n\n".join(parts)
