"""The project as the compose image installs it: the wheel that ``scripts/build_wheelhouse.sh
--project-only`` builds, installed with no index and no dependencies into a fresh virtual
environment, must hold every module of the source tree and run the ``dfedrw`` program and the
README's torchrun line away from the source tree.

The dependencies (torch, grpc, ...) come from the test's own interpreter through a path file:
a plain path, so the source tree's editable install (a finder a ``.pth`` file starts) is not
active there and every ``dfedrw`` module must come from the wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.support.runs import run_job

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NOT_PACKAGED = {"tests"}  # top-level Python packages of the repository that are not part of the wheel


def source_modules() -> list[str]:
    """Every module of the source tree's top-level packages, as ``dfedrw.*`` names, read off the
    folders (not off pyproject.toml, which is what is being checked)."""
    names = []
    for top in sorted(p for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name not in NOT_PACKAGED):
        for path in sorted(top.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join(("dfedrw", *parts)))
    return names


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python of a fresh venv with the project wheel alone installed, the wheel's path)."""
    base = tmp_path_factory.mktemp("installed")
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build_wheelhouse.sh"), "--project-only", str(base / "wheelhouse")],
        env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=600,
    )
    assert built.returncode == 0, f"build_wheelhouse.sh --project-only failed:\n{built.stderr[-3000:]}"
    (wheel,) = (base / "wheelhouse").glob("dfedrw-*.whl")
    venv.create(base / "venv", with_pip=True)
    python = base / "venv" / "bin" / "python"
    done = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True)
    (Path(site.stdout.strip()) / "dfedrw_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, wheel


def test_the_wheel_holds_every_module_of_the_source_tree(installed, tmp_path):
    python, wheel = installed
    expected = source_modules()
    assert "dfedrw.experiments.cli" in expected and "dfedrw.peer.client.client" in expected

    names = zipfile.ZipFile(wheel).namelist()
    # One import name, nothing generic at the top level (PyPI has distributions named peer,
    # launch, proto and topologies).
    assert {n.split("/")[0] for n in names} == {"dfedrw", "-".join(wheel.name.split("-")[:2]) + ".dist-info"}
    assert "dfedrw/peer/config/scenarios/default.toml" in names
    in_wheel = {
        ".".join(Path(n).with_suffix("").parts).removesuffix(".__init__")
        for n in names if n.endswith(".py")
    }
    assert sorted(set(expected) - in_wheel) == [], "modules of the source tree missing from the wheel"

    # Each one imports from the installed wheel (not from the source tree), away from it.
    probe = (
        "import importlib, json, sys, sysconfig\n"
        "site = sysconfig.get_paths()['purelib']\n"
        "bad = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        m = importlib.import_module(name)\n"
        "        if not m.__file__.startswith(site):\n"
        "            bad[name] = 'from ' + m.__file__\n"
        "    except Exception as exc:\n"
        "        bad[name] = f'{type(exc).__name__}: {exc}'\n"
        "print(json.dumps(bad))\n"
    )
    out = subprocess.run([python, "-c", probe, *expected], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {}


def test_the_dfedrw_program_runs_from_the_installed_wheel(installed, tmp_path):
    python, _ = installed
    program = python.parent / "dfedrw"
    assert program.exists(), "the wheel installs no `dfedrw` program"
    listed = subprocess.run([program, "list", "attacks"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "gaussian" in listed.stdout and "sign_flip" in listed.stdout
    # The built-in default scenario is package data: `dfedrw run` finds it.
    ran = subprocess.run(
        [program, "run", "--set", "rounds=3", "--set", "topology.honest=3", "--set", "topology.byzantine=1",
         "--set", "network.transport=inproc", "--out", str(tmp_path / "run")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["honest_completed"] == 3 and summary["failed_peers"] == []


TORCHRUN_SCENARIO = """\
seed = 43
rounds = 5

[data]
name = "digits"

[topology]
honest = 2
byzantine = 1

[attack]
name = "gaussian"

[eval]
every = 0

[network]
round_timeout = 10
"""


def test_the_readme_torchrun_line_runs_from_the_installed_wheel(installed, tmp_path):
    """README: ``torchrun --standalone --nproc-per-node N -m dfedrw.launch.torchrun --scenario S
    --out DIR``, with the wheel's modules (torchrun is ``python -m torch.distributed.run``)."""
    python, _ = installed
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(TORCHRUN_SCENARIO)
    cmd = [
        python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
        "-m", "dfedrw.launch.torchrun", "--scenario", str(scenario), "--out", str(tmp_path / "out"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    rc, output = run_job(cmd, cwd=tmp_path, env=env, timeout=240)
    assert rc == 0, output[-4000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["launcher"] == "torchrun" and summary["failed_peers"] == []
    assert all(p["completed"] and p["rounds_done"] == 5 for p in summary["peers"].values())
    assert summary["tls"] == "mutual"
