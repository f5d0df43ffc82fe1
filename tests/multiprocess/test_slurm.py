"""``dfedrw slurm``: the script it writes runs the default scenario's 10 honest + 2 Byzantine
clients as 12 Slurm tasks over mutual TLS on a one-node Slurm cluster the test starts
(tests/support/slurm_lab.py), with the summary ``dfedrw run`` gives; a client's step cancelled
with ``scancel`` is a failed client in the summary while the others finish."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import slurm_lab

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(slurm_lab.unusable_reason() is not None, reason=str(slurm_lab.unusable_reason())),
]

DFEDRW = [sys.executable, "-m", "dfedrw.launch.cli"]


@pytest.fixture(scope="module")
def lab():
    with slurm_lab.SlurmLab() as lab:
        yield lab


def _job(tmp_path: Path, name: str, *sets: str) -> Path:
    out = tmp_path / name
    done = subprocess.run([*DFEDRW, "slurm", "--out", str(out), *(x for s in sets for x in ("--set", s))], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "12 clients as 12 Slurm tasks: submit with `sbatch" in done.stdout
    return out


@pytest.mark.timeout(900)
def test_the_script_runs_the_clients_as_slurm_tasks_with_the_summary_dfedrw_run_gives(lab, tmp_path):
    job_dir = _job(tmp_path, "job", "rounds=150")
    keys = sorted(p.name for p in (job_dir / "certs").iterdir())
    assert "ca.pem" in keys and "client-11.key" in keys and "ca.key" not in keys
    assert all((job_dir / "certs" / k).stat().st_mode & 0o077 == 0 for k in keys if k.endswith(".key"))
    job = lab.submit(job_dir / "job.sbatch")
    lab.wait(job, 600)
    summary = json.loads((job_dir / "run" / "summary.json").read_text())
    assert sorted(summary["peers"], key=int) == [str(k) for k in range(12)]
    assert summary["failed_peers"] == [] and summary["launcher"] == "torchrun"
    records = [json.loads((job_dir / "run" / "peers" / f"{k}.json").read_text()) for k in range(12) if summary["peers"][str(k)]["role"] == "honest"]
    assert all(r["tls"] == "mutual" and r["completed"] for r in records)
    ran = subprocess.run([*DFEDRW, "run", "--set", "rounds=150", "--out", str(tmp_path / "local")], capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-2000:]
    local = json.loads((tmp_path / "local" / "summary.json").read_text())
    # The same clients, shards and seeds over the same protocol: the process engine's spread.
    assert abs(summary["honest_mean_accuracy"] - local["honest_mean_accuracy"]) < 2.0, (summary["honest_mean_accuracy"], local["honest_mean_accuracy"])


@pytest.mark.timeout(900)
def test_a_client_cancelled_with_scancel_is_a_failed_client_and_the_others_finish(lab, tmp_path):
    job_dir = _job(tmp_path, "job", "rounds=1000")
    job = lab.submit(job_dir / "job.sbatch")
    victim = 3  # honest in the default scenario
    log = job_dir / "run" / "peers" / f"{victim}.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (log.exists() and log.read_text().count("\n") >= 20):
        time.sleep(0.5)
    assert log.exists(), "client 3 never started its rounds"
    step = lab.steps(job).get(f"client-{victim}")
    assert step is not None, lab.steps(job)
    cancelled = lab.run(["scancel", step])
    assert cancelled.returncode == 0, cancelled.stderr
    lab.wait(job, 800)
    summary = json.loads((job_dir / "run" / "summary.json").read_text())
    assert summary["failed_peers"] == [victim], summary["failed_peers"]
    others = [p for k, p in summary["peers"].items() if int(k) != victim and p["role"] == "honest"]
    assert len(others) == 9 and all(p["completed"] and p["rounds_done"] == 1000 for p in others)
    assert summary["peers"][str(victim)]["rounds_done"] < 1000

