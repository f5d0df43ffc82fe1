"""The built wheel installs one import name, ``dfedrw``, and nothing generic at the top level
(PyPI has distributions named peer, launch, proto and topologies)."""

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_installs_under_dfedrw_only(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("dfedrw-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"dfedrw", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    assert "dfedrw/peer/scenarios/default.toml" in names and "dfedrw/peer/transport/pb/peer_pb2.py" in names

    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    installed = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    # Away from the source tree; a module that needs only the standard library.
    probe = (
        "import importlib.util as u, dfedrw.peer.transport.ratelog as r; "
        "print(r.__file__); print([m for m in ('peer', 'launch', 'experiments', 'topologies', 'proto') if u.find_spec(m)])"
    )
    out = subprocess.run([python, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    path, generic = out.stdout.splitlines()
    assert "site-packages/dfedrw/peer/transport/ratelog.py" in path
    assert generic == "[]"
