"""Run folders made before the settings moved into per-class tables are finished for a sweep now.

Earlier versions wrote a run's ``scenario.toml`` with flat keys (``[aggregation] temperature``,
``loss_clip_weighting``, ``[attack] std``); a sweep today must still read such a folder as a
finished run of the same scenario, under the same hash, and plan nothing to do for it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import tomllib
from pathlib import Path

import pytest

import dfedrw.experiments.sweep as sweep
from dfedrw.peer.config.scenario import scenario_from_dict
from dfedrw.experiments.cli import main as dfedrw

ROOT = Path(__file__).resolve().parents[2]
EXPORT = ROOT / "docs" / "results" / "data" / "study_loss_clip_weighting"
GRID = ROOT / "examples" / "grids" / "studies" / "loss_clip_weighting.toml"


@pytest.fixture(autouse=True)
def _signals():
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in handlers.items():
        signal.signal(s, h)


def _dry_run(grid: Path, out: Path, capsys) -> list[str]:
    assert dfedrw(["sweep", str(grid), "--out", str(out), "--dry-run"]) == 0
    return capsys.readouterr().out.splitlines()


def test_committed_export_is_finished(tmp_path, capsys, monkeypatch):
    """The committed export of the loss-clip study (old flat keys) needs no run."""
    copy = tmp_path / "study"
    shutil.copytree(EXPORT, copy)
    folders = sorted((copy / "runs").iterdir())
    assert len(folders) == 12
    for folder in folders:  # made before the change: the flat keys of the old format
        raw = tomllib.loads((folder / "scenario.toml").read_text())
        assert "loss_clip_weighting" in raw["aggregation"] and "std" in raw["attack"], folder

    lines = _dry_run(GRID, copy, capsys)
    rows = [line for line in lines if "->" in line]
    assert len(rows) == 12 and all(line.endswith("[done]") for line in rows), lines
    assert {line.split("runs/")[1].split()[0] for line in rows} == {f.name for f in folders}
    assert lines[-1] == "12 points, 12 distinct runs: 12 done, 0 to run"

    # A real sitting on the copy starts nothing and counts all twelve as skipped.
    def no_runs(runs, *args, **kwargs):
        assert list(runs) == [], [r.name for r in runs]

    monkeypatch.setattr(sweep, "_execute", no_runs)
    result = sweep.run_sweep(GRID, copy, jobs=1, check_runnable=False)
    assert (result.total, result.skipped, result.done, result.failures) == (12, 12, 0, [])
    assert sorted(p.name for p in (copy / "runs").iterdir()) == [f.name for f in folders]


OLD_SCENARIO = """\
seed = 43
rounds = 3

[data]
name = "digits"
dir = ""
partition = "iid"
aux_fraction = 0.1
local_test_size = 1000
labelskew_assign = "cyclic"

[train]
model = "softmax_regression"
hidden = 64
lr = 0.5
batch_size = 32
local_steps = 1
init = "shared"

[topology]
kind = "erdos_renyi"
rho = 0.7
file = ""
honest = 4
byzantine = 1

[attack]
name = "gaussian"
std = 20.0
center = "received_mean"
scale = -10.0
z = "auto"

[aggregation]
rule = "dfedreweighting"
tpm = "accuracy"
crs = "softmax"
temperature = 0.5
accuracy_scale = 100.0

[network]
transport = "inproc"

[eval]
every = 0
"""

OLD_GRID = """\
set = [
    "data.name=digits", "rounds=3", "network.transport=inproc", "topology.honest=4",
    "topology.byzantine=1", "attack.name=gaussian", "eval.every=0", "train.lr=0.5",
]

[axes]
seed = [43, 44]

[[variants.method]]
label = "DFedReweighting (T=0.5)"
set = ["aggregation.rule=dfedreweighting", "aggregation.tpm=accuracy", "aggregation.crs=softmax", "{t}", "{std}"]
"""


@pytest.mark.parametrize(
    "spelling",
    [
        ("aggregation.temperature=0.5", "attack.std=20"),  # the grid in the old flat keys too
        ('aggregation.crs_params.softmax.temperature=0.5', "attack.gaussian.std=20"),  # the grid in today's keys
    ],
    ids=["old-grid", "new-grid"],
)
def test_hand_built_old_run_folder(spelling, tmp_path, capsys):
    """A run folder written in the old format (flat keys) by hand is finished; its sibling is not."""
    grid = tmp_path / "grid.toml"
    grid.write_text(OLD_GRID.format(t=spelling[0], std=spelling[1]))
    plan = sweep.plan_sweep(sweep.load_grid(grid), tmp_path / "sweep")
    (run43, run44) = [plan.runs[k] for k in plan.point_runs]
    # The hash a sweep gives the seed-43 point; an old sweep named its folder the same way.
    old = tmp_path / "sweep" / "runs" / f"43_dfedreweighting-t-0-5-{run43.key}"
    old.mkdir(parents=True)
    (old / "scenario.toml").write_text(OLD_SCENARIO)
    # The same scenario; the old run was computed by client threads, the sweep would use the
    # batched engine, and how a run was computed is not what it is.
    recorded = scenario_from_dict(tomllib.loads(OLD_SCENARIO))
    assert (recorded.engine.name, run43.scenario.engine.name) == ("clients", "batched")
    assert dataclasses.replace(recorded, engine=run43.scenario.engine) == run43.scenario
    (old / "summary.json").write_text(json.dumps({"honest_mean_accuracy": 0.5, "failed_peers": [], "wall_seconds": 1.0}))

    lines = _dry_run(grid, tmp_path / "sweep", capsys)
    assert lines[0].endswith(f"runs/{old.name}  [done]"), lines
    assert lines[1].endswith(f"runs/{run44.folder.name}  [absent]"), lines
    assert lines[-1] == "2 points, 2 distinct runs: 1 done, 1 to run"
