"""Running things from a test and waiting on them: polling for a condition, a console that
prints nowhere, a command run to completion in its own session, a scenario as torchrun workers,
one scenario as gRPC processes, on threads and in the batched engine, and their weights compared
round for round."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from rich.console import Console

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def wait_for(predicate: Callable[[], object], timeout: float, what: str, step: float = 0.2, detail: Callable[[], str] | None = None) -> None:
    """Polls ``predicate`` every ``step`` seconds until it is true; fails naming ``what`` (and
    ``detail()``, if given) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}" + (f"\n{detail()}" if detail else ""))


def quiet_console() -> Console:
    """A rich Console that prints nowhere."""
    return Console(file=open(os.devnull, "w"))


def run_job(cmd: list, *, cwd, timeout: float, env: dict | None = None) -> tuple[int, str]:
    """Run ``cmd`` (e.g. a torchrun job) in its own session to completion, bounded by
    ``timeout`` seconds; the whole session is killed if it outlives it. Returns (exit status,
    stdout and stderr together)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return proc.returncode, output


def torchrun_scenario(scenario, out: Path, *args: str, timeout: float = 300) -> tuple[int, str]:
    """``scenario`` (written next to ``out`` as scenario.toml) run as torchrun workers, one per
    client, into ``out``, with more launcher ``args``; (exit status, output). Skips the test
    where no torchrun stands next to this interpreter."""
    import pytest

    from dfedrw.peer.config.scenario import dump_scenario

    if not TORCHRUN.exists():
        pytest.skip(f"torchrun not found next to {sys.executable}")
    scenario_file = out.parent / "scenario.toml"
    dump_scenario(scenario, scenario_file)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [
        str(TORCHRUN), "--standalone", "--nproc-per-node", str(scenario.num_clients), "-m", "dfedrw.launch.torchrun",
        "--scenario", str(scenario_file), "--out", str(out), *args,
    ]
    return run_job(cmd, cwd=REPO, env=env, timeout=timeout)


def three_ways(make: Callable[..., object], settings: tuple[str, ...], root) -> tuple[dict, dict, dict]:
    """The scenario ``make(*settings, ...)`` run as gRPC processes, on threads (the in-process
    transport) and in the batched engine, into ``root``/grpc, /inproc and /batched; their summaries."""
    from dfedrw.launch.runner import run_scenario

    quiet = quiet_console()
    ways = ("network.transport=grpc", "network.transport=inproc", "engine.name=batched")
    return tuple(run_scenario(make(*settings, way), root / way.split("=")[1], console=quiet)[1] for way in ways)


def weights_agree(root, k: int, rounds: int) -> list[dict]:
    """Client ``k``'s round records as processes under ``root`` (run by :func:`three_ways`),
    checked to give round for round the weights of threads (the in-process transport is
    bit-identical: within 1e-9) and of the batched engine (within the parity tolerance of
    tests/integration/test_engine_parity.py, 1e-5), every neighbour heard."""
    from dfedrw.peer.results.records import read_rounds

    processes, threads, rows = (read_rounds(root / d, k) for d in ("grpc", "inproc", "batched"))
    assert len(processes) == len(threads) == len(rows) == rounds
    for p, t, b in zip(processes, threads, rows):
        assert p["missing"] == [] and p["weights"].keys() == t["weights"].keys() == b["weights"].keys()
        assert all(abs(p["weights"][s] - t["weights"][s]) <= 1e-9 for s in p["weights"])
        assert all(abs(p["weights"][s] - b["weights"][s]) <= 1e-5 for s in p["weights"])
    return processes
