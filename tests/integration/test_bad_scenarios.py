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
    import dfedrw.peer.client.client
    from dfedrw import peer
    def no_client(*args, **kwargs):
        raise AssertionError("dfedrw peer got as far as starting its client")

    monkeypatch.setattr(peer.client.client, "run_grpc_client", no_client)
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
