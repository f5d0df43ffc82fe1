"""Every example scenario loads and runs briefly (digits, in-process, a few rounds)."""

from pathlib import Path

import pytest

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config import load_scenario
from tests.support.runs import quiet_console

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_briefly(path, tmp_path):
    scenario = load_scenario(path, ["rounds=3", "data.name=digits", "data.dir=''", "network.transport=inproc", "eval.every=0"])
    _, summary = run_scenario(scenario, tmp_path, console=quiet_console())
    assert summary["failed_peers"] == []
    assert summary["honest_mean_accuracy"] is not None
