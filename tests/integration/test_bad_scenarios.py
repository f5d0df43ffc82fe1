"""Bad scenarios, each refused before any client starts by every entry point, in one line.

The entry points are ``dfedrw run``, ``dfedrw peer`` (also as ``python -m dfedrw.peer``, a process of its
own), ``dfedrw compose`` and ``dfedrw sweep --dry-run``. Each must exit with code 2 and print
exactly one line on stderr, ``dfedrw: ...`` naming the scenario key, and must leave nothing
behind: no client started, no results or compose folder written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dfedrw.experiments.cli import main as dfedrw_main
from dfedrw.peer import cli as peer_cli

ROOT = Path(__file__).resolve().parents[2]

# The outside modules the plugin cases name (written into a folder on sys.path / PYTHONPATH).
PLUGIN_MODULES = {
    "dfedrw_badplug.py": (
        "class NoCall:\n"
        '    """Has settings but no __call__: neither an attack nor a CRS."""\n'
        "    def __init__(self, k: int = 1):\n"
        "        self.k = k\n"
    ),
    "dfedrw_brokenplug.py": 'raise RuntimeError("this module fails at import")\n',
}

# (case id, overrides, the scenario key the one line must name). Every case starts from a
# scenario that would run (digits, one Gaussian attacker) and breaks one thing.
BASE = ["data.name=digits", "rounds=2", "topology.honest=3", "topology.byzantine=1", "attack.name=gaussian"]
CASES = [
    ("unknown-rule", ["aggregation.rule=nosuch_rule"], "aggregation.rule"),
    ("unknown-rule-setting", ["aggregation.rule=geometric_median", "aggregation.geometric_median.nosuch=1"], "aggregation.geometric_median.nosuch"),
    ("rule-setting-out-of-range", ["aggregation.rule=centered_clipping", "aggregation.centered_clipping.tau=-1"], "aggregation.centered_clipping.tau"),
    ("attack-std-zero", ["attack.std=0"], "attack.std"),
    ("bad-partition", ["data.partition=dirichlet:x"], "data.partition"),
    ("host-with-spaces", ["network.host='not a host'"], "network.host"),
    ("dense-graph-of-many-clients", ["topology.honest=65000"], "topology.kind='erdos_renyi' with 65_001 clients and rho=0.7"),
    ("unknown-key", ["topology.rhoo=0.5"], "topology.rhoo"),
    ("unknown-plugin-module", ["attack.name=dfedrw_nosuch_module:Attack"], "attack.name"),
    ("plugin-module-fails-import", ["attack.name=dfedrw_brokenplug:Attack"], "attack.name"),
    ("plugin-class-missing", ["aggregation.crs=dfedrw_badplug:Missing"], "aggregation.crs"),
    ("plugin-class-without-call", ["aggregation.crs=dfedrw_badplug:NoCall"], "aggregation.crs"),
    ("model-does-not-fit-the-data", ["train.model=lenet5"], "train.model='lenet5' with data.name='digits': lenet5 needs images at least 12x12"),
]
IDS = [c[0] for c in CASES]


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("badplugins")
    for name, text in PLUGIN_MODULES.items():
        (folder / name).write_text(text)
    return folder


@pytest.fixture(autouse=True)
def _isolated(plugin_dir, monkeypatch):
    """The plugin folder importable; the signal handlers `run` and `sweep` install, restored."""
    monkeypatch.syspath_prepend(str(plugin_dir))
    for name in ("dfedrw_badplug", "dfedrw_brokenplug"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in handlers.items():
        signal.signal(s, h)


def _sets(overrides: list[str]) -> list[str]:
    return [a for o in [*BASE, *overrides] for a in ("--set", o)]


def _one_line(err: str, key: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("dfedrw:"), err
    assert key in lines[0], (key, err)
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(("overrides", "key"), [c[1:] for c in CASES], ids=IDS)
def test_run_refuses(overrides, key, tmp_path, capsys, monkeypatch):
    import dfedrw.launch.runner
    from dfedrw import launch
    def no_clients(*args, **kwargs):
        raise AssertionError("dfedrw run got as far as starting clients")

    monkeypatch.setattr(launch.runner, "run_scenario", no_clients)
    out = tmp_path / "out"
    assert dfedrw_main(["run", *_sets(overrides), "--out", str(out)]) == 2
    _one_line(capsys.readouterr().err, key)
    assert not out.exists()  # no pids.json, logs/ or peers/


@pytest.mark.parametrize(("overrides", "key"), [c[1:] for c in CASES], ids=IDS)
def test_peer_refuses(overrides, key, tmp_path, capsys, monkeypatch):
    import dfedrw.peer.client.process
    from dfedrw import peer
    def no_client(*args, **kwargs):
        raise AssertionError("dfedrw peer got as far as starting its client")

    monkeypatch.setattr(peer.client.process, "run_grpc_client", no_client)
    out = tmp_path / "out"
    argv = ["peer", "--scenario", str(_default_scenario(tmp_path)), "--id", "0", "--peer", "1=127.0.0.1:1", "--out", str(out)]
    assert peer_cli.main([*argv, *_sets(overrides)]) == 2
    _one_line(capsys.readouterr().err, key)
    assert not out.exists()


@pytest.mark.parametrize(("overrides", "key"), [c[1:] for c in CASES], ids=IDS)
def test_compose_refuses(overrides, key, tmp_path, capsys):
    out = tmp_path / "cluster"
    assert dfedrw_main(["compose", *_sets(overrides), "--out", str(out)]) == 2
    _one_line(capsys.readouterr().err, key)
    assert not (out / "docker-compose.yml").exists()
    assert not out.exists()


@pytest.mark.parametrize(("overrides", "key"), [c[1:] for c in CASES], ids=IDS)
def test_sweep_dry_run_refuses(overrides, key, tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    quoted = ", ".join(f'"{o}"' for o in [*BASE, "network.transport=inproc", *overrides])
    grid.write_text(f"set = [{quoted}]\n\n[axes]\nseed = [43, 44]\n")
    out = tmp_path / "sweep"
    assert dfedrw_main(["sweep", str(grid), "--out", str(out), "--dry-run"]) == 2
    _one_line(capsys.readouterr().err, key)
    assert not (out / "runs").exists()


def _default_scenario(tmp_path: Path) -> Path:
    """A scenario file for `peer`, which needs one: the built-in default, written out."""
    from dfedrw.peer.config.scenario import dump_scenario, load_scenario

    path = tmp_path / "default.toml"
    dump_scenario(load_scenario(None), path)
    return path


@pytest.mark.parametrize("case", ["attack-std-zero", "plugin-class-without-call"])
def test_peer_process_refuses(case, tmp_path, plugin_dir):
    """``python -m dfedrw.peer``, a process of its own: one line, exit 2, before it listens."""
    overrides, key = next(c[1:] for c in CASES if c[0] == case)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(plugin_dir)]))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "dfedrw.peer", "--scenario", str(_default_scenario(tmp_path)), "--id", "0",
         "--peer", "1=127.0.0.1:1", "--out", str(out), *_sets(overrides)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    _one_line(proc.stderr, key)
    assert not out.exists()


# -- input too deep or too long, from a file, --set or a grid: one line, exit 2 ----------------

DEPTH = 3000
NESTED_ARRAY = "[" * DEPTH + "]" * DEPTH
DOTTED_KEY = ".".join(["a"] * 1200)
HUGE = "x" * 5_000_000
# The longest line allowed: "dfedrw: " and a message cut to peer.quote.MESSAGE_CHARS, with the
# count of what was left out.
LONGEST_LINE = 2_100

# (case id, the scenario file's text or None, --set overrides, what the one line must say)
TOO_MUCH = [
    ("nested-array", f"zz = {NESTED_ARRAY}\n", [], "nested more than 32 deep"),
    ("dotted-header", f"[{DOTTED_KEY}]\n", [], "nested more than 32 deep"),
    ("set-nested-array", None, [f"rounds={NESTED_ARRAY}"], "nested more than 32 deep"),
    ("set-dotted-key", None, [f"peers.1.aggregation.{DOTTED_KEY}=1"], "nested more than 32 deep"),
    ("huge-value", f'rounds = "{HUGE}"\n', [], "(5_000_000 characters): expected an integer"),
    ("set-huge-class-setting", None, [f'attack.alie.z="{HUGE}"'], "must be a real number"),
    ("huge-key", f'"{HUGE}" = 1\n', [], "characters left out"),
]
TOO_MUCH_IDS = [c[0] for c in TOO_MUCH]


def _bounded_line(err: str, words: str) -> str:
    line = _one_line(err, words)
    assert len(line) <= LONGEST_LINE, len(line)
    return line


@pytest.mark.parametrize(("text", "overrides", "words"), [c[1:] for c in TOO_MUCH], ids=TOO_MUCH_IDS)
def test_run_refuses_input_too_deep_or_too_long(text, overrides, words, tmp_path, capsys):
    scenario = []
    if text is not None:
        (tmp_path / "s.toml").write_text(text)
        scenario = [str(tmp_path / "s.toml")]
    out = tmp_path / "out"
    assert dfedrw_main(["run", *scenario, *(a for o in overrides for a in ("--set", o)), "--out", str(out)]) == 2
    _bounded_line(capsys.readouterr().err, words)
    assert not out.exists()


@pytest.mark.parametrize(("grid", "words"), [
    (f"[report]\nx = {NESTED_ARRAY}\n", "grid.toml: tables and arrays nested more than 32 deep"),
    (f"[{'.'.join(['report'] * 1200)}]\n", "grid.toml: tables and arrays nested more than 32 deep at 'report.report"),
    ('base = "s.toml"\n[axes]\nseed = [1, 2]\n', "s.toml: tables and arrays nested more than 32 deep"),
    (f'set = ["rounds={NESTED_ARRAY}"]\n', "nested more than 32 deep"),
    (f'[axes]\nrounds = ["{HUGE}"]\n', "(5_000_000 characters): expected an integer"),
], ids=["nested-array", "dotted-header", "nested-base", "set-nested-array", "huge-axis-value"])
def test_sweep_refuses_a_grid_too_deep_or_too_long(grid, words, tmp_path, capsys):
    (tmp_path / "s.toml").write_text(f"zz = {NESTED_ARRAY}\n")
    (tmp_path / "grid.toml").write_text(grid)
    out = tmp_path / "sweep"
    assert dfedrw_main(["sweep", str(tmp_path / "grid.toml"), "--out", str(out), "--dry-run"]) == 2
    _bounded_line(capsys.readouterr().err, words)
    assert not (out / "runs").exists()


def test_the_dfedrw_process_refuses_input_too_deep(tmp_path):
    """The ``dfedrw`` program as a process of its own, at Python's own recursion limit."""
    (tmp_path / "s.toml").write_text(f"zz = {NESTED_ARRAY}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "dfedrw.experiments.cli", "run", str(tmp_path / "s.toml"), "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    _bounded_line(proc.stderr, "nested more than 32 deep")
    assert not (tmp_path / "out").exists()
