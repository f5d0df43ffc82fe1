"""examples/plugins as real client processes: the Byzantine processes run the outside attack and
the honest ones weight with the outside CRS, under `dfedrw run` and under torchrun.

The module reaches every process as it would for a user: examples/plugins on PYTHONPATH,
inherited by the clients from the launcher.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.support.runs import run_job

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "examples" / "plugins"
SCENARIO = PLUGINS / "scenario.toml"
TORCHRUN = Path(sys.executable).with_name("torchrun")
ROUNDS = 30
TIMEOUT = 300


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(PLUGINS)]),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
    }


def _run(cmd: list[str]) -> tuple[int, str, float]:
    """Run a launcher to completion (bounded, see run_job); also returns how long it took."""
    start = time.monotonic()
    rc, output = run_job(cmd, cwd=ROOT, timeout=TIMEOUT, env=_env())
    return rc, output, time.monotonic() - start


def _check_results(out: Path, output: str) -> None:
    """The run finished; Byzantine clients ran ScaledMean, honest ones LowestK (k = 3)."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_peers"] == [] and not summary["interrupted"], output[-3000:]
    roles = {int(k): p["role"] for k, p in summary["peers"].items()}
    byzantine = sorted(k for k, r in roles.items() if r == "byzantine")
    assert len(roles) == 10 and len(byzantine) == 2
    pids = {p["pid"] for p in summary["peers"].values()}
    assert len(pids) == 10 and os.getpid() not in pids  # one process per client
    assert all(p["completed"] and p["rounds_done"] == ROUNDS for p in summary["peers"].values())

    for k in byzantine:  # each Byzantine process's own record names the outside attack
        record = json.loads((out / "peers" / f"{k}.json").read_text())
        assert record["attack"] == "mylab_plugins:ScaledMean", record
        sent = [json.loads(line) for line in (out / "peers" / f"{k}.jsonl").read_text().splitlines()]
        assert len(sent) == ROUNDS and all(r["bytes_sent"] > 0 for r in sent[1:])

    weighted = 0
    for k, role in roles.items():
        if role != "honest":
            continue
        record = json.loads((out / "peers" / f"{k}.json").read_text())
        assert record["aggregation"]["crs"] == "mylab_plugins:LowestK", record["aggregation"]
        assert record["aggregation"]["tpm"] == "loss"
        for line in (out / "peers" / f"{k}.jsonl").read_text().splitlines():
            weights = json.loads(line).get("weights") or {}
            if not weights:
                continue
            weighted += 1
            used = [w for w in weights.values() if w > 0]
            # LowestK: at most k = 3 candidates, equal shares (a softmax would give everyone some).
            assert 0 < len(used) <= 3 and max(used) - min(used) < 1e-5, (k, weights)
            # The scaled-mean models (factor -3) score worst: attackers get nothing.
            assert all(weights.get(str(b), 0.0) == 0.0 for b in byzantine), (k, weights)
    assert weighted >= 8 * (ROUNDS - 2)
    assert summary["byzantine_weight_share"] == 0


def test_dfedrw_run_processes_use_the_outside_classes(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "dfedrw.launch.cli", "run", str(SCENARIO), "--set", f"rounds={ROUNDS}", "--out", str(out)]
    rc, output, seconds = _run(cmd)
    assert rc == 0, output[-3000:]
    print(f"dfedrw run: 10 client processes, {ROUNDS} rounds in {seconds:.1f} s")
    assert json.loads((out / "pids.json").read_text())  # launched as processes by LocalRun
    _check_results(out, output)


def test_torchrun_ranks_use_the_outside_classes(tmp_path):
    if not TORCHRUN.exists():
        pytest.skip(f"torchrun not found next to {sys.executable}")
    out = tmp_path / "torchrun"
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "10", "-m", "dfedrw.launch.torchrun", "--scenario", str(SCENARIO), "--set", f"rounds={ROUNDS}", "--out", str(out)]
    rc, output, seconds = _run(cmd)
    assert rc == 0, output[-3000:]
    print(f"torchrun: 10 ranks, {ROUNDS} rounds in {seconds:.1f} s")
    _check_results(out, output)
