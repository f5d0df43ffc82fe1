"""``dfedrw sweep`` running its runs, each a child process: resuming, failures, interrupts, a
kill, a busy folder, a run left running, and one real end-to-end sweep plus report of
examples/grids/tiny.toml."""

import csv
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from dfedrw.experiments import sweep
from dfedrw.experiments.cli import main
from dfedrw.experiments.grid import SweepError, load_grid
from dfedrw.experiments.sweep import run_sweep
from dfedrw.experiments.sweep_plan import plan_sweep, run_state
from dfedrw.peer.config.scenario import dump_scenario
from tests.support.runs import quiet_console
from tests.support.sweeps import FAST, GRID, TINY, write_grid


def finish(run, summary=None):
    run.folder.mkdir(parents=True, exist_ok=True)
    dump_scenario(run.scenario, run.folder / "scenario.toml")
    (run.folder / "summary.json").write_text(json.dumps(summary or {"honest_mean_accuracy": 1.0}))


def test_resume_skips_finished_runs_and_redoes_interrupted_ones(tmp_path, fake_run):
    grid_path = write_grid(tmp_path, GRID)
    plan = plan_sweep(load_grid(grid_path), tmp_path / "out")
    runs = list(plan.runs.values())
    finish(runs[0])
    (runs[0].folder / "keep.txt").write_text("finished earlier")
    # crashed: no summary, a leftover JSONL that must not be appended to
    (runs[1].folder / "peers").mkdir(parents=True)
    (runs[1].folder / "peers" / "0.jsonl").write_text('{"round": 0}\n')
    # interrupted: the launcher wrote a summary flagged as interrupted
    finish(runs[2], {"honest_mean_accuracy": 1.0, "interrupted": True})

    result = run_sweep(grid_path, tmp_path / "out", jobs=3, console=quiet_console(), check_runnable=False)

    assert (result.total, result.skipped, result.done, result.failures, result.exit_code) == (8, 1, 7, [], 0)
    assert sorted(fake_run()) == sorted(r.folder.name for r in runs[1:])
    assert (runs[0].folder / "keep.txt").read_text() == "finished earlier"
    assert not (runs[1].folder / "peers").exists()
    assert all(run_state(r.folder, r.scenario) == "done" for r in runs)
    assert (runs[1].folder / "scenario.request.toml").read_text() == runs[1].toml

    record = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert record["grid"] == str(grid_path.resolve())
    assert record["report"]["columns"] == "method" and record["report"]["rows"] == ["data.partition"]
    assert [p["labels"]["method"] for p in record["points"][:2]] == ["DFedAvg", "Ours"]
    assert record["points"][0]["run"] == f"runs/{runs[0].folder.name}"
    assert len(record["sittings"]) == 1 and record["sittings"][0]["runs_done"] == 7

    again = run_sweep(grid_path, tmp_path / "out", jobs=3, console=quiet_console(), check_runnable=False)
    assert (again.skipped, again.done) == (8, 0)
    record = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert len(record["sittings"]) == 2
    assert record["wall_seconds"] == pytest.approx(sum(s["wall_seconds"] for s in record["sittings"]), abs=1e-2)


def test_a_failed_run_is_reported_with_its_log_and_the_rest_go_on(tmp_path, fake_run, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "fail44")
    grid_path = write_grid(tmp_path, GRID)

    result = run_sweep(grid_path, tmp_path / "out", jobs=2, console=quiet_console(), check_runnable=False)

    assert result.done == 4 and len(result.failures) == 4 and result.exit_code == 1
    failure = result.failures[0]
    assert "exit code 3" in failure.reason and "boom: simulated crash" in failure.log_tail
    assert failure.points[0].startswith("seed=44")
    record = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert sorted(r["status"] for r in record["runs"].values()) == ["done"] * 4 + ["failed"] * 4


def test_interrupt_stops_running_children_and_keeps_finished_runs(tmp_path, fake_run, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "sleep")
    grid_path = write_grid(tmp_path, GRID)
    plan = plan_sweep(load_grid(grid_path), tmp_path / "out")
    first = next(iter(plan.runs.values()))
    finish(first)
    started: list[int] = []
    original = sweep.SweepBoard.refresh

    def refresh(self):
        original(self)
        pids = sorted((tmp_path / "out" / "runs").glob("*/pid"))
        if not started and self.running == 2 and len(pids) == 2:
            started.extend(int(p.read_text()) for p in pids)
            raise KeyboardInterrupt

    monkeypatch.setattr(sweep.SweepBoard, "refresh", refresh)
    monkeypatch.setattr(sweep, "_INT_GRACE", 5.0)

    # One run per process (batches of runs: test_batch_of_runs.py)
    result = run_sweep(grid_path, tmp_path / "out", jobs=2, batch=1, console=quiet_console(), check_runnable=False)

    assert result.interrupted and result.exit_code == 130 and len(started) == 2
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert run_state(first.folder, first.scenario) == "done"
    record = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert record["sittings"][-1]["interrupted"] is True


def test_a_sweep_killed_outright_keeps_its_time_up_to_the_last_finished_run(tmp_path, fake_run, monkeypatch):
    grid_path = write_grid(tmp_path, GRID)
    record_path = tmp_path / "out" / "sweep.json"
    seen: list[dict] = []
    write = sweep.write_json_atomic

    def spy(path, data):
        if path == record_path and data["sittings"][-1].get("runs_done") == 4 and not seen:
            seen.append(json.loads(json.dumps(data)))
        return write(path, data)

    monkeypatch.setattr(sweep, "write_json_atomic", spy)

    run_sweep(grid_path, tmp_path / "out", jobs=1, console=quiet_console(), check_runnable=False)

    # What a kill right after the fourth run would have left: a checkpoint, not a final entry.
    (checkpoint,) = seen
    last = checkpoint["sittings"][-1]
    assert last["interrupted"] is None and last["wall_seconds"] > 0 and last["end"] is not None
    assert checkpoint["wall_seconds"] == pytest.approx(last["wall_seconds"], abs=1e-2)
    record_path.write_text(json.dumps(checkpoint))

    run_sweep(grid_path, tmp_path / "out", jobs=1, console=quiet_console(), check_runnable=False)

    killed, second = json.loads(record_path.read_text())["sittings"]
    assert killed["killed"] is True and killed["interrupted"] is True
    assert killed["wall_seconds"] == last["wall_seconds"]
    assert second["interrupted"] is False and "killed" not in second


def test_a_second_sweep_on_a_busy_folder_is_refused_and_a_stale_lock_taken_over(tmp_path, fake_run):
    grid_path = write_grid(tmp_path, FAST + "[axes]\nseed = [43]\n")
    (tmp_path / "out").mkdir()
    lock = tmp_path / "out" / "sweep.lock"
    lock.write_text(str(os.getppid()))  # a live process

    with pytest.raises(SweepError, match=f"another sweep \\(pid {os.getppid()}\\) is running"):
        run_sweep(grid_path, tmp_path / "out", console=quiet_console(), check_runnable=False)
    assert fake_run() == []

    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()  # exited and reaped: nothing lives under its PID any more
    lock.write_text(str(finished.pid))
    result = run_sweep(grid_path, tmp_path / "out", console=quiet_console(), check_runnable=False)
    assert result.exit_code == 0 and result.done == 1 and not lock.exists()


def test_a_folder_holding_another_grids_sweep_is_refused_and_left_as_it_was(tmp_path, fake_run):
    # Prepare: a finished sweep of one grid
    first = write_grid(tmp_path, FAST + "[axes]\nseed = [43]\n", name="first.toml")
    second = write_grid(tmp_path, FAST + "[axes]\nseed = [44]\n", name="second.toml")
    run_sweep(first, tmp_path / "out", console=quiet_console(), check_runnable=False)
    record = (tmp_path / "out" / "sweep.json").read_bytes()

    # Execute, Assert
    for dry_run in (True, False):
        with pytest.raises(SweepError, match="holds the sweep of grid first.toml, not of second.toml"):
            run_sweep(second, tmp_path / "out", console=quiet_console(), check_runnable=False, dry_run=dry_run)
    assert (tmp_path / "out" / "sweep.json").read_bytes() == record and len(fake_run()) == 1
    assert run_sweep(first, tmp_path / "out", console=quiet_console(), check_runnable=False).skipped == 1  # its own grid resumes


@pytest.mark.slow
def test_tiny_grid_end_to_end_then_report(tmp_path, capsys):
    out = tmp_path / "tiny"

    assert main(["sweep", str(TINY), "--out", str(out), "--jobs", "2"]) == 0
    assert main(["report", str(out)]) == 0

    record = json.loads((out / "sweep.json").read_text())
    assert len(record["points"]) == 4 and len(record["runs"]) == 4
    for name in ("table.md", "table.csv", "cells.csv", "plots/accuracy_00_iid.png", "plots/clients_00_iid.png"):
        assert (out / "report" / name).is_file(), name
    by_method: dict[str, list[dict]] = {}
    for p in record["points"]:
        by_method.setdefault(p["labels"]["method"], []).append(json.loads((out / p["run"] / "summary.json").read_text()))
    rows = list(csv.reader((out / "report" / "table.csv").open()))
    assert rows[0] == ["DH", "DFedAvg", "DFedReweighting (T=0.1)"] and rows[1][0] == "IID"
    for method, text in zip(rows[0][1:], rows[1][1:]):
        summaries = by_method[method]
        var = np.mean([s["accuracy_variance"] for s in summaries])
        acc = np.mean([s["honest_mean_accuracy"] for s in summaries])
        assert text == f"{var:.3f} ({acc:.3f})"
    cells = {r["method"]: r for r in csv.DictReader((out / "report" / "cells.csv").open())}
    for method, summaries in by_method.items():
        assert float(cells[method]["honest_mean_accuracy_mean"]) == pytest.approx(
            np.mean([s["honest_mean_accuracy"] for s in summaries]), abs=1e-6
        )
        assert cells[method]["seeds"] == "2"
    # each finished run has its compact record, and the export reports the same
    for run in record["runs"]:
        assert (out / run / "record.json").is_file()
    assert main(["export", str(out), "--out", str(tmp_path / "exported")]) == 0
    assert main(["report", str(tmp_path / "exported"), "--out", str(tmp_path / "again")]) == 0
    for name in ("table.md", "table.csv", "cells.csv", "plots/accuracy_00_iid.png", "plots/clients_00_iid.png"):
        assert (tmp_path / "again" / name).read_bytes() == (out / "report" / name).read_bytes(), name
    # a second sitting finds everything done
    assert main(["sweep", str(TINY), "--out", str(out), "--jobs", "2"]) == 0
    assert len(json.loads((out / "sweep.json").read_text())["sittings"]) == 2


def test_a_run_left_running_by_a_killed_sweep_is_not_deleted_under_it(tmp_path, fake_run):
    grid_path = write_grid(tmp_path, FAST + "[axes]\nseed = [43]\n")
    (run,) = plan_sweep(load_grid(grid_path), tmp_path / "out").runs.values()
    run.folder.mkdir(parents=True)
    (run.folder / "peers").mkdir()
    # What a killed sweep leaves: its child still at work in the folder, its PID on file.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(run.folder)])
    try:
        (run.folder / sweep.PID_FILE).write_text(str(child.pid))
        deadline = time.monotonic() + 10  # until the child has exec'd (its command line is its own)
        while sweep.still_running(run.folder) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sweep.still_running(run.folder) == child.pid

        with pytest.raises(SweepError, match=rf"still running .*{run.folder.name} \(pid {child.pid}\)"):
            run_sweep(grid_path, tmp_path / "out", console=quiet_console(), check_runnable=False)
        assert (run.folder / "peers").exists() and fake_run() == []
    finally:
        child.kill()
        child.wait()

    assert sweep.still_running(run.folder) is None
    result = run_sweep(grid_path, tmp_path / "out", console=quiet_console(), check_runnable=False)
    assert result.done == 1 and not (run.folder / sweep.PID_FILE).exists()
