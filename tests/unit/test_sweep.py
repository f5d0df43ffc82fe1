"""``dfedrw sweep``: grid expansion, validation, run identity, the dry run and the ETA, with no
run started (the sweep's runs, each a child process, are in
tests/integration/test_sweep_runs.py)."""

import hashlib
import json
import os
from pathlib import Path

import tomli_w
import pytest

from dfedrw.experiments import sweep, sweep_board
from dfedrw.experiments.cli import main
from dfedrw.experiments.grid import SweepError, expand, load_grid, toml_value
from dfedrw.experiments.sweep import run_sweep
from dfedrw.experiments.sweep_plan import plan_sweep, run_seconds, scenario_key, scenario_text
from dfedrw.peer.config.scenario import dump_scenario, load_scenario, scenario_changes
from tests.support.runs import quiet_console
from tests.support.sweeps import FAST, GRID, TINY, write_grid


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
        ("# nothing yet\n", ["an empty grid"]),
        ('[axes]\nseed = []\n', ["axis 'seed'", "non-empty list"]),
        ('[axes]\nseed = [{a = 1}]\n', ["axis 'seed'", "string, number or boolean"]),
        ('[axes]\nseed = [1, 1]\n', ["'1' twice"]),
        ('[[variants.m]]\nlabel = "A"\nwhen = {x = 1}\n', ["unknown key 'when'", "label, set"]),
        ('[[variants.m]]\nset = []\n', ["needs a label"]),
        ('[axes]\nseed = [1]\n[[exclude]]\nmethod = "A"\n', ["unknown axis 'method'", "axes: seed"]),
        ('set = ["rounds"]\n', ["key=value"]),
        ('base = "nope.toml"\n', ["base scenario file not found"]),
        ('base = "."\n', ["base scenario file is a folder"]),
        ('set = ["seed=7"]\n[axes]\nseed = [1, 2]\n', ["seed is an axis and is also in set ('seed=7')"]),
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


def test_a_folder_holding_another_scenario_is_left_alone_and_reported(tmp_path, fake_run):
    grid_path = write_grid(tmp_path, FAST + "[axes]\nseed = [43]\n")
    (run,) = plan_sweep(load_grid(grid_path), tmp_path / "out").runs.values()
    run.folder.mkdir(parents=True)
    dump_scenario(load_scenario(None, ["rounds=99"]), run.folder / "scenario.toml")
    (run.folder / "summary.json").write_text(json.dumps({"honest_mean_accuracy": 1.0}))

    result = run_sweep(grid_path, tmp_path / "out", console=quiet_console(), check_runnable=False)

    assert result.exit_code == 1 and "different scenario" in result.failures[0].reason
    assert fake_run() == [] and (run.folder / "summary.json").exists()


@pytest.mark.parametrize("mode", ["", "record"])
def test_the_sweep_builds_a_runs_record_only_where_the_run_wrote_none(tmp_path, fake_run, monkeypatch, mode):
    from dfedrw.experiments.record import read_record

    monkeypatch.setenv("FAKE_MODE", mode)
    grid_path = write_grid(tmp_path, FAST + "[axes]\nseed = [43, 44]\n")

    result = run_sweep(grid_path, tmp_path / "out", console=quiet_console(), check_runnable=False)

    assert result.exit_code == 0 and len(fake_run()) == 2
    records = [read_record(run.folder) for run in plan_sweep(load_grid(grid_path), tmp_path / "out").runs.values()]
    # the run's own record kept as it wrote it; else one built from its (here absent) round logs
    expected = {"accuracy": [[0, 42.0]]} if mode else {"accuracy": [], "global_accuracy": []}
    assert [r["curves"] for r in records] == [expected, expected]


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


# -- ETA ---------------------------------------------------------------------------------------
def fake_clock_and_runs(monkeypatch):
    """A clock the test sets (``clock[0]``) in place of the board's, and a maker of runs."""
    from types import SimpleNamespace

    clock = [0.0]
    monkeypatch.setattr(sweep_board, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    engine = SimpleNamespace(engine=SimpleNamespace(name="batched"))
    return clock, lambda k: SimpleNamespace(key=k, name=k, scenario=engine)


def test_eta_counts_the_work_left_over_the_parallelism(monkeypatch):
    clock, run = fake_clock_and_runs(monkeypatch)
    quiet = quiet_console()

    assert sweep_board.SweepBoard(quiet, 12, 2, jobs=2).eta() == "?"  # nothing to go by yet
    board = sweep_board.SweepBoard(quiet, 12, 2, jobs=2, prior_seconds=[90.0, 110.0])
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


def test_eta_of_batches_takes_their_pace_before_any_run_has_finished(monkeypatch):
    clock, run = fake_clock_and_runs(monkeypatch)
    board = sweep_board.SweepBoard(quiet_console(), 12, 0, jobs=2)
    for k in "abcd":
        board.started(run(k), "first")
    for k in "efgh":
        board.started(run(k), "second")
    clock[0] = 40.0
    assert board.eta() == "?"  # no run finished and no progress said yet
    board.progress("first", 0.05)  # 40 s for start-up and the first rounds
    board.progress("second", 0.1)
    board.progress("nobody", 0.9)  # a process that is not running: ignored
    assert board.eta() == "?"  # one line each: no pace yet
    clock[0] = 100.0
    board.progress("first", 0.25)
    board.progress("second", 0.5)

    # first: 300 s a whole at its pace, 225 s left, 40 + 0.95 x 300 = 325 s in all (81.25 a
    # run); second: 150 s a whole, 75 s left, 175 s in all (43.75 a run); the 4 queued runs
    # take their mean, 62.5 s each: (225 + 75 + 4 x 62.5) / 2. Scaling the elapsed time by the
    # rounds done would count the start-up again for every share of the rounds: 5m50s.
    assert board.eta() == "4m35s"
    assert "running 8 (38 % of their rounds)" in board.info()

    for k in "efgh":
        board.finished(run(k), True, 50.0)  # the second batch: 200 s over its 4 runs
    # the runs' own times now: (225 left of the first + 4 queued x 50) / 2, and no less than
    # the 225 s the first batch still needs
    assert board.eta() == "3m45s"
    assert "running 4 (25 % of their rounds)" in board.info()
    board.progress("first", 1.0)
    for k in "ijkl":
        board.started(run(k), "third")
        board.progress("third", 1.0)
    assert board.eta() == "0s"  # every round done, nothing queued: only results to write


def test_eta_takes_the_pace_up_to_the_last_progress_line_and_a_single_line_gives_no_pace(monkeypatch):
    clock, run = fake_clock_and_runs(monkeypatch)
    board = sweep_board.SweepBoard(quiet_console(), 8, 0, jobs=2, prior_seconds=[100.0])
    for k in "ab":
        board.started(run(k), "paced")
    for k in "cd":
        board.started(run(k), "single")
    clock[0] = 20.0
    board.progress("paced", 0.1)
    board.progress("single", 0.3)
    clock[0] = 60.0
    board.progress("paced", 0.5)
    clock[0] = 90.0
    board.progress("paced", 0.5)  # the same line read again
    board.progress("single", 0.3)

    # paced: 100 s a whole from its two lines, 50 s left at 60 s, 20 s at 90 s; single: one
    # line, so its 2 runs take the mean, 200 s, less its 90 s; 4 queued runs x 100 s:
    # (20 + 110 + 400) / 2. Taking the pace up to now instead would give 87.5 s left: 4m59s.
    assert board.eta() == "4m25s"
    clock[0] = 200.0  # past what the pace predicts: nothing left of it, not less
    assert board.eta() == "3m20s"  # (0 + 0 + 400) / 2


def test_rounds_done_reads_the_last_round_line_of_a_log(tmp_path):
    log = tmp_path / "run.log"
    assert sweep.rounds_done(log) is None  # no log yet
    log.write_text("batched engine: 3 runs as one batch\n")
    assert sweep.rounds_done(log) is None
    log.write_text("batched engine: 3 runs as one batch\n" + "".join(f"round {r}/3000\n" for r in range(60, 1260, 60)) + "a round 2999/3000 said mid-line\n")
    assert sweep.rounds_done(log) == 1200 / 3000
    with log.open("a") as fh:
        fh.write("x" * 10_000 + "\nround 1500/3000\n")  # only the end is read
    assert sweep.rounds_done(log) == 0.5


def test_a_resumed_sweep_counts_a_batched_run_by_its_share_of_the_batch(tmp_path):
    head, other, alone = (tmp_path / name for name in ("head", "other", "alone"))
    for folder in (head, other, alone):
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps({"wall_seconds": 120.0}))
    (head / "run.log").write_text("batched engine: 12 runs as one batch, 120 honest clients on cpu\nround 60/3000\n")
    (other / "run.log").write_text("run in a batch of 12 runs; its log: ../head/run.log\n")
    (alone / "run.log").write_text("batched engine, 10 + 0 clients on cpu\n")

    assert [run_seconds(f) for f in (head, other, alone)] == [10.0, 10.0, 120.0]
    (other / "run.log").unlink()
    assert run_seconds(other) is None  # its share of a batch can no longer be told


def test_a_resumed_sweep_takes_its_first_eta_from_the_finished_runs(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    assert run_seconds(folder) is None
    (folder / "summary.json").write_text(json.dumps({"wall_seconds": 81.5}))
    (folder / "run.log").write_text("batched engine, 10 + 0 clients on cpu\n")
    assert run_seconds(folder) == 81.5
    (folder / "summary.json").write_text("[1, 2]")
    assert run_seconds(folder) is None


def test_a_recycled_pid_is_not_taken_for_a_run(tmp_path):
    folder = tmp_path / "runs" / "43-abc"
    folder.mkdir(parents=True)
    (folder / sweep.PID_FILE).write_text(str(os.getpid()))  # alive, but not a run of this folder
    if Path(f"/proc/{os.getpid()}/cmdline").exists():
        assert sweep.still_running(folder) is None
    (folder / sweep.PID_FILE).write_text("not a pid")
    assert sweep.still_running(folder) is None
