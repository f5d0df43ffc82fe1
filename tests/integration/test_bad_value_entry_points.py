"""A bad value is refused at load, once, in one line naming its key, by every command that takes a
scenario: ``run``, ``sweep`` (a grid's point), ``compose``, ``slurm`` and ``peer``; none of them
writes anything."""

from __future__ import annotations

import subprocess
import sys

import pytest

MESSAGE = "train.lr=-1.0 must be a finite number in (0, 1e+06]"


@pytest.mark.parametrize("command", ["run", "sweep", "compose", "slurm", "peer"])
def test_a_bad_value_is_refused_once_naming_its_key(command, tmp_path):
    scenario = tmp_path / "bad.toml"
    scenario.write_text("rounds = 3\n[train]\nlr = -1.0\n")
    grid = tmp_path / "grid.toml"
    grid.write_text('set = ["rounds=3"]\n[axes]\n"train.lr" = [0.01, -1.0]\n')
    out = tmp_path / "out"
    argv = {
        "run": ["run", str(scenario), "--out", str(out)],
        "sweep": ["sweep", str(grid), "--out", str(out)],
        "compose": ["compose", str(scenario), "--out", str(out)],
        "slurm": ["slurm", str(scenario), "--out", str(out)],
        "peer": ["peer", "--scenario", str(scenario), "--id", "0", "--out", str(out)],
    }[command]

    done = subprocess.run([sys.executable, "-m", "dfedrw.experiments.cli", *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)

    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dfedrw: ") and MESSAGE in lines[0], done.stderr
    assert not out.exists()
