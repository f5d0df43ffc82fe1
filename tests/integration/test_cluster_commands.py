"""The cluster commands' one-line refusals that need a socket or a process: an address where
no Ray cluster answers, and ``dfedrw slurm`` with fewer tasks than clients."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from dfedrw.experiments.sweep_ray import _answers


def test_an_address_where_nothing_answers_is_told_at_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    start = time.monotonic()
    why = _answers(f"127.0.0.1:{port}", 5.0)
    assert why is not None and "nothing answers there" in why and time.monotonic() - start < 5
    assert _answers("no-port-here", 5.0) == "not an address of the form HOST:PORT"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert _answers(f"ray://127.0.0.1:{server.getsockname()[1]}", 5.0) is None


def test_fewer_tasks_than_clients_is_refused_in_one_line_by_the_command(tmp_path):
    done = subprocess.run([sys.executable, "-m", "dfedrw.launch.cli", "slurm", "--out", str(tmp_path / "job"), "--ntasks", "5"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--ntasks 5 is fewer than the scenario's 12 clients" in done.stderr
    assert not (tmp_path / "job").exists()
