"""``dfedrw sweep``: grid expansion, validation, run identity, resuming, failures, interrupts,
and one real end-to-end sweep plus report of examples/grids/tiny.toml."""

import csv
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import tomli_w
import pytest

from experiments import sweep
from experiments.cli import main
from experiments.sweep import (
    SweepError,
    expand,
    load_grid,
    plan_sweep,
    run_state,
    run_sweep,
    scenario_key,
    scenario_text,
    toml_value,
)
from peer.config import dump_scenario, load_scenario, scenario_changes
from tests.helpers import quiet_console

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "grids" / "tiny.toml"

FAST = 'set = ["rounds=3", "network.transport=inproc", "topology.honest=4", "topology.byzantine=0", "attack.name=none", "eval.every=0"]\n'


def write_grid(tmp_path, body, name="grid.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


GRID = FAST + """
[axes]
seed = [43, 44]
"data.partition" = ["iid", "dirichlet:0.1"]

[[variants.method]]
label = "DFedAvg"
set = ["aggregation.rule=dfedavg"]

[[variants.method]]
label = "Ours"
set = ["aggregation.rule=dfedreweighting", "aggregation.tpm=accuracy", "aggregation.crs=softmax"]
"""


# A stand-in for `dfedrw run`: records the scenario it was given and a finished summary, or
# misbehaves as FAKE_MODE says. Lets the sweep machinery be tested without training anything.
FAKE_RUN = """
import json, os, sys, time, pathlib
request, folder = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
text = request.read_text()
mode = os.environ.get("FAKE_MODE", "")
with open(os.environ["FAKE_CALLS"], "a") as fh:
    fh.write(folder.name + "\\n")
if mode == "sleep":
    (folder / "pid").write_text(str(os.getpid()))
    time.sleep(60)
if mode == "fail44" and "seed = 44" in text:
    print("boom: simulated crash")
    sys.exit(3)
(folder / "scenario.toml").write_text(text)
(folder / "summary.json").write_text(json.dumps({"honest_mean_accuracy": 50.0, "accuracy_variance": 1.0}))
"""


@pytest.fixture
def fake_run(tmp_path, monkeypatch):
    script = tmp_path / "fake_run.py"
    script.write_text(FAKE_RUN)
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    monkeypatch.setattr(sweep, "child_command", lambda request, folder: [sys.executable, str(script), str(request), str(folder)])
    return lambda: calls.read_text().split()


# --------------------------------------------------------------------------- grid expansion


def test_expand_takes_the_product_with_variants_last(tmp_path):
    grid = load_grid(write_grid(tmp_path, GRID))
    points = expand(grid)

    assert [p.describe() for p in points[:3]] == [
        "seed=43, data.partition=iid, method=DFedAvg",
        "seed=43, data.partition=iid, method=Ours",
        "seed=43, data.partition=dirichlet:0.1, method=DFedAvg",
    ]
    assert len(points) == 8
    # fixed set first, then axes with TOML-quoted strings, then the variant bundle
    assert points[2].overrides[-3:] == ("seed=43", 'data.partition="dirichlet:0.1"', "aggregation.rule=dfedavg")
    assert grid.axis_labels() == {"seed": ["43", "44"], "data.partition": ["iid", "dirichlet:0.1"], "method": ["DFedAvg", "Ours"]}


def test_exclude_removes_matching_points_and_accepts_lists(tmp_path):
    grid = load_grid(write_grid(tmp_path, GRID + """
[[exclude]]
"data.partition" = "iid"
method = ["Ours"]

[[exclude]]
seed = 44
"data.partition" = "dirichlet:0.1"
"""))
    described = [p.describe() for p in expand(grid)]

    assert described == [
        "seed=43, data.partition=iid, method=DFedAvg",
        "seed=43, data.partition=dirichlet:0.1, method=DFedAvg",
        "seed=43, data.partition=dirichlet:0.1, method=Ours",
        "seed=44, data.partition=iid, method=DFedAvg",
    ]


def test_identical_resolved_scenarios_run_once(tmp_path):
    # A No-attack baseline overrides the attack axis, so both attack rows share its run.
    grid = load_grid(write_grid(tmp_path, """
set = ["rounds=3", "network.transport=inproc", "topology.honest=4"]
[axes]
"attack.name" = ["gaussian", "sign_flip"]
[[variants.method]]
label = "No-AT"
set = ["attack.name=none", "topology.byzantine=0", "aggregation.rule=dfedavg"]
[[variants.method]]
label = "Ours"
set = []
"""))
    plan = plan_sweep(grid, tmp_path / "out")

    assert len(plan.points) == 4 and len(plan.runs) == 3
    no_attack = [key for p, key in zip(plan.points, plan.point_runs) if p.labels["method"] == "No-AT"]
    assert no_attack[0] == no_attack[1]
    assert plan.runs[no_attack[0]].points == [0, 2]
    assert plan.runs[no_attack[0]].scenario.attack.name == "none"
    assert plan.runs[no_attack[0]].folder.name.endswith("-" + no_attack[0])


def test_a_bad_key_fails_the_whole_sweep_naming_the_point(tmp_path):
    grid = load_grid(write_grid(tmp_path, GRID + """
[[variants.method]]
label = "Typo"
set = ["aggregation.temprature=0.1"]
"""))
    with pytest.raises(SweepError) as err:
        run_sweep(grid.path, tmp_path / "out", console=quiet_console(), check_runnable=False)

    message = str(err.value)
    assert "seed=43, data.partition=iid, method=Typo" in message
    assert "aggregation.temprature" in message and "temperature" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "body, words",
    [
        ('sett = ["rounds=1"]\n', ["unknown key 'sett'", "base, set, axes"]),
        ('[axes]\nseed = []\n', ["axis 'seed'", "non-empty list"]),
        ('[axes]\nseed = [{a = 1}]\n', ["axis 'seed'", "string, number or boolean"]),
        ('[axes]\nseed = [1, 1]\n', ["'1' twice"]),
        ('[[variants.m]]\nlabel = "A"\nwhen = {x = 1}\n', ["unknown key 'when'", "label, set"]),
        ('[[variants.m]]\nset = []\n', ["needs a label"]),
        ('[axes]\nseed = [1]\n[[exclude]]\nmethod = "A"\n', ["unknown axis 'method'", "axes: seed"]),
        ('set = ["rounds"]\n', ["key=value"]),
        ('base = "nope.toml"\n', ["base scenario file not found"]),
        ('[axes]\nseed = [1]\n[report]\nkind = "speed"\n', ["report.kind", "fairness, byzantine"]),
        ('[axes]\nseed = [1]\nrounds = [1, 2]\n[report]\nrows = []\ncolumns = "seed"\n', ["report.columns", "rounds"]),
    ],
)
def test_grid_errors_name_the_problem_and_the_choices(tmp_path, body, words):
    path = write_grid(tmp_path, body)
    with pytest.raises(ValueError) as err:
        plan_sweep(load_grid(path), tmp_path / "out")
    for w in words:
        assert w in str(err.value)


def test_axis_values_are_written_as_toml(tmp_path):
    assert toml_value("dirichlet:0.1") == '"dirichlet:0.1"'
    assert (toml_value(0.1), toml_value(43), toml_value(True)) == ("0.1", "43", "true")
    grid = load_grid(write_grid(tmp_path, FAST + '[axes]\n"train.lr" = [0.05]\n"data.partition" = ["labelskew:4"]\n'))
    plan = plan_sweep(grid, tmp_path / "out")
    (run,) = plan.runs.values()
    assert run.scenario.train.lr == 0.05 and run.scenario.data.partition == "labelskew:4"


# --------------------------------------------------------------------------- run identity


def test_scenario_hash_is_stable_and_depends_only_on_the_resolved_scenario(tmp_path):
    a = load_scenario(None, ["rounds=7", "train.lr=0.5"])
    base = tmp_path / "base.toml"
    dump_scenario(load_scenario(None, ["train.lr=0.5"]), base)
    b = load_scenario(base, ["rounds=7"])  # same scenario, reached another way

    assert scenario_key(a) == scenario_key(b) == scenario_key(a)
    assert scenario_key(a) == hashlib.sha256(tomli_w.dumps(scenario_changes(a)).encode()).hexdigest()[:10]
    assert len(scenario_key(a)) == 10 and int(scenario_key(a), 16) >= 0
    assert scenario_key(load_scenario(None, ["rounds=8", "train.lr=0.5"])) != scenario_key(a)


def test_plan_reuses_a_finished_folder_with_the_same_hash_under_another_slug(tmp_path):
    grid = load_grid(write_grid(tmp_path, FAST + "[axes]\nseed = [43]\n"))
    (run,) = plan_sweep(grid, tmp_path / "out").runs.values()
    renamed = tmp_path / "out" / "runs" / f"old-name-{run.key}"
    renamed.mkdir(parents=True)

    (again,) = plan_sweep(grid, tmp_path / "out").runs.values()
    assert again.folder == renamed


# --------------------------------------------------------------------------- running


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


def test_a_folder_holding_another_scenario_is_left_alone_and_reported(tmp_path, fake_run):
    grid_path = write_grid(tmp_path, FAST + "[axes]\nseed = [43]\n")
    (run,) = plan_sweep(load_grid(grid_path), tmp_path / "out").runs.values()
    run.folder.mkdir(parents=True)
    dump_scenario(load_scenario(None, ["rounds=99"]), run.folder / "scenario.toml")
    (run.folder / "summary.json").write_text(json.dumps({"honest_mean_accuracy": 1.0}))

    result = run_sweep(grid_path, tmp_path / "out", console=quiet_console(), check_runnable=False)

    assert result.exit_code == 1 and "different scenario" in result.failures[0].reason
    assert fake_run() == [] and (run.folder / "summary.json").exists()


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

    result = run_sweep(grid_path, tmp_path / "out", jobs=2, console=quiet_console(), check_runnable=False)

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


def test_dry_run_prints_points_and_folders_and_runs_nothing(tmp_path, fake_run, capsys):
    grid_path = write_grid(tmp_path, GRID)

    rc = main(["sweep", str(grid_path), "--out", str(tmp_path / "out"), "--dry-run"])

    out = capsys.readouterr().out
    assert rc == 0 and fake_run() == []
    assert not (tmp_path / "out").exists()
    assert "seed=44, data.partition=dirichlet:0.1, method=Ours  ->  runs/44_dirichlet-0-1_ours-" in out
    assert out.rstrip().endswith("8 points, 8 distinct runs: 0 done, 8 to run")


def test_cli_bad_grid_is_one_line_and_exit_2(tmp_path, capsys):
    grid_path = write_grid(tmp_path, '[axes]\n"data.nmae" = ["digits"]\n')

    rc = main(["sweep", str(grid_path), "--out", str(tmp_path / "out"), "--dry-run"])

    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert err.startswith("dfedrw: point data.nmae=digits: unknown key 'data.nmae'")


# --------------------------------------------------------------------------- end to end


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


# -- ETA ---------------------------------------------------------------------------------------
def test_eta_counts_the_work_left_over_the_parallelism(monkeypatch):
    import io
    from types import SimpleNamespace

    from rich.console import Console

    clock = [0.0]
    monkeypatch.setattr(sweep, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    run = lambda k: SimpleNamespace(key=k, name=k)  # noqa: E731
    quiet = Console(file=io.StringIO())

    assert sweep.SweepBoard(quiet, 12, 2, jobs=2).eta() == "?"  # nothing to go by yet
    board = sweep.SweepBoard(quiet, 12, 2, jobs=2, prior_seconds=[90.0, 110.0])
    assert board.eta() == "8m20s"  # 10 runs x 100 s (earlier sittings) / 2
    board.started(run("a"))
    board.started(run("b"))
    clock[0] = 30.0
    assert board.eta() == "7m50s"  # (8 x 100 + 2 x 70) / 2
    clock[0] = 40.0
    board.finished(run("a"), True, 40.0)  # mean of 90, 110, 40: 80 s
    assert board.eta() == "5m40s"  # (8 x 80 + 40 left of b) / 2
    board.finished(run("b"), False, 40.0)  # a failed run's time is not a run time
    board.started(run("c"))
    clock[0] = 50.0
    assert board.eta() == "5m15s"  # (7 x 80 + 70) / 2
    for k in "defghij":
        board.started(run(k))
        board.finished(run(k), True, 80.0)
    assert board.eta() == "1m10s"  # c alone: what is left of it, not half of that
    clock[0] = 200.0
    assert board.eta() == "?"  # c past the mean: no telling
    board.finished(run("c"), True, 80.0)
    assert board.eta() == "0s"


def test_a_resumed_sweep_takes_its_first_eta_from_the_finished_runs(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    assert sweep._run_seconds(folder) is None
    (folder / "summary.json").write_text(json.dumps({"wall_seconds": 81.5}))
    assert sweep._run_seconds(folder) == 81.5
    (folder / "summary.json").write_text("[1, 2]")
    assert sweep._run_seconds(folder) is None


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


def test_a_recycled_pid_is_not_taken_for_a_run(tmp_path):
    folder = tmp_path / "runs" / "43-abc"
    folder.mkdir(parents=True)
    (folder / sweep.PID_FILE).write_text(str(os.getpid()))  # alive, but not a run of this folder
    if Path(f"/proc/{os.getpid()}/cmdline").exists():
        assert sweep.still_running(folder) is None
    (folder / sweep.PID_FILE).write_text("not a pid")
    assert sweep.still_running(folder) is None
