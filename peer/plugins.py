"""The four registries (rules, TPMs, CRSs, attacks) in one place: building a client's rule or
a Byzantine client's attack from a scenario, and listing what is registered.

A rule, TPM, CRS or attack is one class registered by name (see
:mod:`peer.registry`); its constructor's parameters are its settings. This module
adds what the running system knows: :func:`build_rule_from` and :func:`build_attack_from`
pass the supplied values (a client's number of Byzantine neighbours, the learning rate, a
seed, the number of clients, the TPM and CRS objects) to the constructors that take them.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dfedrw.peer.aggregation.crs import CRS_REGISTRY
from dfedrw.peer.registry import Registry, Setting
from dfedrw.peer.aggregation.rules import RULE_REGISTRY, takes_tpm_and_crs
from dfedrw.peer.aggregation.tpm import TPM_REGISTRY
from dfedrw.peer.attacks import ATTACK_REGISTRY
from dfedrw.peer.attacks.base import UNDECLARED

if TYPE_CHECKING:
    from dfedrw.peer.config import AggregationConfig, AttackConfig, Scenario

__all__ = [
    "REGISTRIES",
    "build_attack",
    "build_attack_from",
    "build_client_rule",
    "build_rule_from",
    "describe_text",
    "list_registered",
    "render_markdown",
    "sync_readme",
]

# Plural kind (as `dfedrw list` and the registry markers of docs/reference.md name it) -> registry.
REGISTRIES: dict[str, Registry] = {
    "rules": RULE_REGISTRY,
    "tpms": TPM_REGISTRY,
    "crs": CRS_REGISTRY,
    "attacks": ATTACK_REGISTRY,
}

# Where each kind's settings table lives in a scenario ({name}: the class's name or import path).
SETTINGS_TABLE = {
    "rules": "aggregation.{name}",
    "tpms": "aggregation.tpm_params.{name}",
    "crs": "aggregation.crs_params.{name}",
    "attacks": "attack.{name}",
}


def build_rule_from(cfg: AggregationConfig, *, num_byzantine: int, lr: float, seed: int, total_rounds: int = 0) -> Any:
    """The rule ``cfg`` names, with its settings; the TPM and CRS are built only for a rule
    that takes them (DFedReweighting). Raises ``ValueError`` from the classes."""
    supplied: dict[str, Any] = {"num_byzantine": num_byzantine, "lr": lr, "seed": seed, "total_rounds": total_rounds}
    if takes_tpm_and_crs(cfg.rule):
        supplied["tpm"] = TPM_REGISTRY.build(cfg.tpm, cfg.params("tpm"))
        supplied["crs"] = CRS_REGISTRY.build(cfg.crs, cfg.params("crs"))
    return RULE_REGISTRY.build(cfg.rule, cfg.params("rule"), supplied)


def build_attack_from(cfg: AttackConfig, *, num_clients: int, num_byzantine: int, **knowledge: Any) -> Any:
    """The attack ``cfg`` names, with its settings; ``knowledge`` (``defence``,
    ``attacker_data``, ``lr``, ``total_rounds``) goes to a constructor that declares it.
    Raises ``ValueError`` for ``"none"``."""
    if cfg.name == "none":
        raise ValueError("attack.name='none' has no Byzantine behaviour")
    return ATTACK_REGISTRY.build(cfg.name, cfg.params(), {"num_clients": num_clients, "num_byzantine": num_byzantine, **knowledge})


def build_client_rule(scenario: Scenario, client: int, num_byzantine: int, lr: float, seed: int) -> Any:
    """Client ``client``'s rule: [aggregation] with its [peers.K.aggregation] overrides."""
    return build_rule_from(
        scenario.aggregation_for(client), num_byzantine=num_byzantine, lr=lr, seed=seed, total_rounds=scenario.rounds
    )


def build_attack(scenario: Scenario, num_clients: int, num_byzantine: int, **knowledge: Any) -> Any:
    """The scenario's attack, as a Byzantine client runs it (``knowledge``: see
    :func:`build_attack_from`)."""
    return build_attack_from(
        scenario.attack, num_clients=num_clients, num_byzantine=num_byzantine,
        lr=scenario.train.lr, total_rounds=scenario.rounds, round_window=scenario.network.round_window, **knowledge,
    )


# ---------------------------------------------------------------------------- listing


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

    return _MARKER.sub(replace, text)


def sync_readme(path: str | Path, *, check: bool = False) -> bool:
    """Regenerate the registry tables of a markdown file (the project's are in
    docs/reference.md) in place; with ``check`` only report. Returns True when the file was
    already up to date."""
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
    built-in and installed plugins, with its settings, defaults and docstring summary.

    ``modules`` are imported first (a module may register classes with ``REGISTRY.register``);
    ``plugins`` are import paths ``module:Class`` of ``kind`` to describe as well (they cannot
    be discovered otherwise). Raises ``ValueError`` for an unknown kind or a bad plugin.
    """
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
