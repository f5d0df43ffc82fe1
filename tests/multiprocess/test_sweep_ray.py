"""``dfedrw sweep --ray`` on a real Ray cluster: a head and two worker nodes started with
``ray start`` on loopback in a network namespace of the test's (tests/support/ray_lab.py). The grid's
result files are those of the local sweep; a worker node killed mid-batch, or the driver killed
and started again, changes none of them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import ray_lab as lab_module
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(lab_module.unusable_reason() is not None, reason=str(lab_module.unusable_reason())),
]

DFEDRW = [sys.executable, "-m", "dfedrw.experiments.cli"]
GRID = lab_module.GRID.format(rounds=300)
# What differs from one run of a scenario to the next wherever it runs: its times and PIDs.
VOLATILE = {"wall_seconds", "pid", "launcher_pid", "loop_seconds", "loop_cpu_seconds"}


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def results(out: Path) -> dict[str, tuple[bytes, dict]]:
    """Each run's record.json bytes and its summary without the volatile fields."""
    runs = {}
    for folder in sorted((out / "runs").iterdir()):
        summary = json.loads((folder / "summary.json").read_text())
        runs[folder.name] = ((folder / "record.json").read_bytes(), _stable(summary))
    return runs


def _sweep_cli(*args: str) -> list[str]:
    return [*DFEDRW, "sweep", *args]


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("grid") / "grid.toml"
    path.write_text(GRID)
    return path


@pytest.fixture(scope="module")
def local(grid, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("local") / "out"
    done = subprocess.run(_sweep_cli(str(grid), "--out", str(out), "--jobs", "2"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = results(out)
    assert len(found) == 24
    return found


@pytest.fixture(scope="module")
def lab():
    with lab_module.RayLab(workers=2) as lab:
        yield lab


def _nodes(out: Path) -> dict[str, str]:
    runs = json.loads((out / "sweep.json").read_text())["runs"]
    return {name: entry["node"]["node_id"] for name, entry in runs.items() if "node" in entry}


@pytest.mark.timeout(900)
def test_a_grid_on_ray_writes_the_files_the_local_sweep_writes_on_two_nodes(lab, grid, local, tmp_path):
    out = tmp_path / "out"
    done = lab.run(_sweep_cli(str(grid), "--out", str(out), "--ray", lab.address), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Ray cluster 127.0.0.1:6379: 3 node(s), 2 CPU(s)" in done.stderr
    assert results(out) == local
    nodes = _nodes(out)
    assert len(nodes) == 24 and len(set(nodes.values())) >= 2, nodes
    # What the report reads is there as locally: the run's log, its request, its round files.
    head = next(iter((out / "runs").iterdir()))
    assert (head / "run.log").read_text().strip() and (head / "scenario.request.toml").is_file() and (head / "peers").is_dir()


def _batch_pids(lab, index: int) -> list[int]:
    """The processes of node ``index`` that run a batch now (Ray names a worker by its task)."""
    found = []
    for pid in lab.node_processes(index):
        try:
            if b"run_batch_task" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def _all_batch_pids(lab) -> list[int]:
    """Every worker node's processes that run a batch now (an earlier test may have replaced a node)."""
    return [pid for index in range(1, len(lab.nodes)) for pid in _batch_pids(lab, index)]


def _running_task(lab, index: int, timeout: float) -> bool:
    """Whether node ``index`` is running a batch within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _batch_pids(lab, index):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.timeout(900)
def test_a_node_killed_mid_batch_has_its_batch_run_again_elsewhere(lab, grid, local, tmp_path):
    out = tmp_path / "out"
    sweep = lab.popen(_sweep_cli(str(grid), "--out", str(out), "--ray", lab.address), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _running_task(lab, 1, 120), "node 1 never ran a batch"
        killed = lab.kill_node(1)
        assert killed
        stdout, stderr = sweep.communicate(timeout=600)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
        lab.add_worker()  # the cluster as the other tests expect it
    assert sweep.returncode == 0, stderr[-3000:]
    assert results(out) == local
    # Every batch finished on a node that was alive at its end.
    assert len(_nodes(out)) == 24


@pytest.mark.timeout(900)
def test_a_driver_killed_and_started_again_resumes(lab, grid, local, tmp_path):
    out = tmp_path / "out"
    args = _sweep_cli(str(grid), "--out", str(out), "--ray", lab.address, "--batch", "3")
    sweep = lab.popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        done = 0
        while time.monotonic() < deadline and sweep.poll() is None:
            try:
                runs = json.loads((out / "sweep.json").read_text())["runs"]
                done = sum(entry["status"] == "done" for entry in runs.values())
            except (OSError, ValueError, KeyError):
                pass
            if done >= 3:
                break
            time.sleep(0.2)
        assert sweep.poll() is None and done >= 3, "the sweep ended, or did no run, before it could be killed"
        os.kill(sweep.pid, signal.SIGKILL)  # `ip netns exec` ran the driver in its own process
        sweep.wait()
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    again = lab.run(args, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    skipped = int(again.stderr.split(" already done")[0].rsplit(" ", 1)[-1])
    assert skipped >= done, again.stderr[-2000:]
    assert results(out) == local
    sittings = json.loads((out / "sweep.json").read_text())["sittings"]
    assert len(sittings) == 2 and sittings[0].get("killed") is True


@pytest.mark.timeout(900)
def test_ctrl_c_cancels_the_tasks_and_leaves_a_sweep_that_resumes(lab, grid, local, tmp_path):
    out = tmp_path / "out"
    args = _sweep_cli(str(grid), "--out", str(out), "--ray", lab.address)
    sweep = lab.popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_all_batch_pids(lab)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_all_batch_pids(lab)) >= 2, "two batches never ran at once"
        sweep.send_signal(signal.SIGINT)
        _, stderr = sweep.communicate(timeout=120)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    assert sweep.returncode == 130, stderr[-2000:]
    assert "cancelling 2 Ray task(s)" in stderr, stderr[-2000:]
    # The cancelled batches' workers are gone: no node runs a batch any more.
    deadline = time.monotonic() + 30
    while _all_batch_pids(lab) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _all_batch_pids(lab)
    record = json.loads((out / "sweep.json").read_text())
    assert record["sittings"][0]["interrupted"] is True
    again = lab.run(args, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert results(out) == local


@pytest.mark.timeout(300)
def test_a_batch_larger_than_every_node_is_refused_before_anything_is_submitted(lab, tmp_path):
    # A run of 65,536 hidden units holds about 0.3 GB a client: more clients than this machine
    # has memory for (a node offers a part of it).
    total = int(next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")).split()[1]) * 1024
    honest = int(total / 0.25e9) + 10
    grid = tmp_path / "big.toml"
    grid.write_text(f'set = ["engine.name=batched", "rounds=40", "train.model=mlp", "train.hidden=65536", "topology.honest={honest}"]\n[axes]\nseed = [1, 2]\n')
    out = tmp_path / "out"
    done = lab.run(_sweep_cli(str(grid), "--out", str(out), "--ray", lab.address), capture_output=True, text=True, timeout=240)
    assert done.returncode == 2, done.stderr
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("dfedrw:")]
    assert len(line) == 1 and "the largest node of the Ray cluster offers" in line[0], done.stderr
    assert not (out / "runs").exists()


@pytest.mark.timeout(900)
def test_a_node_without_the_data_files_takes_the_drivers_and_one_with_other_files_is_refused(tmp_path):
    from tests.support.datafiles import write_image_idx

    data = write_image_idx(tmp_path / "data", seed=1)
    other = write_image_idx(tmp_path / "other", seed=2)
    grid = tmp_path / "grid.toml"
    grid.write_text(f'set = ["engine.name=batched", "rounds=30", "data.name=mnist", "data.dir={data}", "topology.honest=4", "topology.byzantine=0", "attack.name=none"]\n[axes]\nseed = [1, 2]\n')
    local = tmp_path / "local"
    done = subprocess.run(_sweep_cli(str(grid), "--out", str(local), "--jobs", "2"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with lab_module.RayLab(workers=0) as lab:
        lab.add_worker({str(data): None})  # this node's data folder is empty
        out = tmp_path / "ray"
        done = lab.run(_sweep_cli(str(grid), "--out", str(out), "--ray", lab.address), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert results(out) == results(local)
    with lab_module.RayLab(workers=0) as lab:
        lab.add_worker({str(data): str(other)})  # this node's data.dir holds other images
        out = tmp_path / "refused"
        done = lab.run(_sweep_cli(str(grid), "--out", str(out), "--ray", lab.address), capture_output=True, text=True, timeout=600)
        assert done.returncode == 1, done.stderr[-3000:]
        assert "differs from the driver's" in done.stderr and "2 failed" in done.stderr, done.stderr[-3000:]
