"""``dfedrw sweep`` handing the batched engine batches of runs: how runs are grouped, a batch
that fails (its runs retried alone), a batch interrupted (resumed), and a real grid run in
batches giving what it gives run by run."""

import dataclasses
import io
import json
import os

import pytest
from rich.console import Console

from dfedrw.experiments import sweep
from dfedrw.experiments.grid import load_grid
from dfedrw.experiments.sweep import run_sweep
from dfedrw.experiments.sweep_plan import plan_batches, plan_sweep, run_state
from tests.support.runs import quiet_console
from tests.support.parity import differences
from tests.support.sweeps import GRID, TINY, write_grid


def test_runs_of_one_shape_go_in_even_batches_and_others_alone(tmp_path):
    grid = load_grid(write_grid(tmp_path, GRID + '\n[[variants.rounds]]\nlabel = "3"\nset = []\n\n[[variants.rounds]]\nlabel = "4"\nset = ["rounds=4"]\n'))
    runs = list(plan_sweep(grid, tmp_path / "out").runs.values())
    assert len(runs) == 16

    batches = plan_batches(runs, jobs=2, batch=16)
    # Two shapes (3 and 4 rounds), 8 runs each: each split in two for the two jobs.
    assert sorted(len(b) for b in batches) == [4, 4, 4, 4]
    assert all(len({r.scenario.rounds for r in b}) == 1 for b in batches)
    assert sorted(r.key for b in batches for r in b) == sorted(r.key for r in runs)
    # 8 runs in at most 3 a batch: 3 batches, made 4 so that 2 jobs have 2 each.
    assert sorted(len(b) for b in plan_batches(runs, jobs=2, batch=3)) == [2, 2, 2, 2, 2, 2, 2, 2]
    assert sorted(len(b) for b in plan_batches([r for r in runs if r.scenario.rounds == 3][:7], jobs=2, batch=16)) == [3, 4]
    # 7 runs for 3 jobs in at most 2 a batch: 4 batches, made 6 (not 4 of 2, 2, 2 and 1).
    seven = [r for r in runs if r.scenario.rounds == 3][:7]
    assert sorted(len(b) for b in plan_batches(seven, jobs=3, batch=2)) == [1, 1, 1, 1, 1, 2]
    assert [r.key for b in plan_batches(seven, jobs=3, batch=2) for r in b] == [r.key for r in seven]
    assert all(len(b) == 1 for b in plan_batches(runs, jobs=2, batch=1))

    # 40 runs for 2 jobs in at most 5 a batch: 8 batches, 4 a job; the last 2 cut in halves,
    # the last 2 halves in halves again.
    forty = runs + [dataclasses.replace(r, key=f"{r.key}-{i}") for i in (1, 2) for r in runs[:12]]
    forty = [dataclasses.replace(r, scenario=runs[0].scenario) for r in forty]
    tapered = plan_batches(forty, jobs=2, batch=5)
    assert [len(b) for b in tapered] == [5, 5, 5, 5, 5, 5, 3, 2, 2, 1, 1, 1]
    assert [r.key for b in tapered for r in b] == [r.key for r in forty]
    # 3 batches a job: no cut.
    assert [len(b) for b in plan_batches(forty[:30], jobs=2, batch=5)] == [5, 5, 5, 5, 5, 5]

    clients = [r for r in plan_sweep(load_grid(write_grid(tmp_path, GRID.replace('"eval.every=0"', '"eval.every=0", "engine.name=clients"'), "c.toml")), tmp_path / "c").runs.values()]
    assert all(len(b) == 1 for b in plan_batches(clients, jobs=2, batch=16))


def test_a_failed_batch_runs_its_runs_alone_and_only_the_broken_ones_fail(tmp_path, fake_run, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "fail44")
    grid_path = write_grid(tmp_path, GRID)

    result = run_sweep(grid_path, tmp_path / "out", jobs=1, batch=8, console=quiet_console(), check_runnable=False)

    # One batch of 8 fails at its first seed-44 run, after the seed-43 runs finished (they
    # count): the 4 unfinished ones go again one by one, and fail alone.
    assert result.done == 4 and len(result.failures) == 4 and result.exit_code == 1
    calls = fake_run()
    assert len(calls) == 12 and sorted(calls[8:]) == sorted(c for c in calls[:8] if c.startswith("44_"))
    assert all("exit code 3" in f.reason and f.points[0].startswith("seed=44") for f in result.failures)


def test_an_interrupted_batch_leaves_its_runs_unfinished_and_a_rerun_finishes_them(tmp_path, fake_run, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "sleep")
    grid_path = write_grid(tmp_path, GRID)
    started: list[int] = []
    original = sweep.SweepBoard.refresh

    def refresh(self):
        original(self)
        pids = sorted((tmp_path / "out" / "runs").glob("*/pid"))
        if not started and len(pids) == 8:
            started.extend(int(p.read_text()) for p in pids)
            raise KeyboardInterrupt

    monkeypatch.setattr(sweep.SweepBoard, "refresh", refresh)
    monkeypatch.setattr(sweep, "_INT_GRACE", 5.0)

    result = run_sweep(grid_path, tmp_path / "out", jobs=1, batch=8, console=quiet_console(), check_runnable=False)

    assert result.interrupted and len(set(started)) == 1  # one process ran the 8 runs
    with pytest.raises(ProcessLookupError):
        os.kill(started[0], 0)
    plan = plan_sweep(load_grid(grid_path), tmp_path / "out")
    assert {run_state(r.folder, r.scenario) for r in plan.runs.values()} == {"unfinished"}

    monkeypatch.setattr(sweep.SweepBoard, "refresh", original)
    monkeypatch.setenv("FAKE_MODE", "")
    again = run_sweep(grid_path, tmp_path / "out", jobs=1, batch=8, console=quiet_console(), check_runnable=False)
    assert (again.done, again.skipped, again.failures) == (8, 0, [])
    record = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert [s["batch"] for s in record["sittings"]] == [8, 8]


@pytest.mark.slow
def test_a_grid_in_batches_gives_what_it_gives_run_by_run(tmp_path):
    # The tiny grid in the batched engine: once a run per process, once all in one batch.
    grid = write_grid(tmp_path, TINY.read_text().replace('"network.transport=inproc",', '"engine.name=batched",'))
    alone = run_sweep(grid, tmp_path / "alone", jobs=2, batch=1, console=quiet_console())
    together = run_sweep(grid, tmp_path / "together", jobs=1, batch=16, console=quiet_console())
    assert (alone.done, together.done, alone.failures, together.failures) == (4, 4, [], [])
    runs = sorted(p.name for p in (tmp_path / "alone" / "runs").iterdir())
    assert runs == sorted(p.name for p in (tmp_path / "together" / "runs").iterdir())
    for name in runs:
        assert differences(tmp_path / "alone" / "runs" / name, tmp_path / "together" / "runs" / name) == [], name
    logs = [(tmp_path / "together" / "runs" / name / "run.log").read_text() for name in runs]
    assert sum("4 runs as one batch" in text for text in logs) == 1
    assert sum("run in a batch of 4 runs" in text for text in logs) == 3


def test_a_batch_that_cannot_be_forked_runs_as_a_new_process(tmp_path, fake_run, monkeypatch):
    # Prepare: a fork server that refuses every batch
    closed = []

    class Refusing:
        def start(self, argv, env, log):
            raise RuntimeError("the fork server could not start a process: it exited (no output)")

        def close(self):
            closed.append(True)

    monkeypatch.setattr(sweep, "batch_server", lambda env: Refusing())
    console = Console(file=io.StringIO(), width=200)

    # Execute
    result = run_sweep(write_grid(tmp_path, GRID), tmp_path / "out", jobs=1, batch=4, console=console, check_runnable=False)

    # Assert: the two batches ran as new processes (the stand-in), the server closed once
    assert (result.done, result.failures) == (8, [])
    assert len(fake_run()) == 8 and closed == [True]
    assert "could not fork a batch (the fork server could not start a process" in console.file.getvalue()
