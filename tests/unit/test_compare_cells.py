"""scripts/compare_cells.py: which cells of a rerun leave the committed spread over seeds."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_cells.py"
HEADER = "data.partition,method,seeds,acc_mean,acc_std\n"


def run(tmp_path, old: str, new: str):
    (tmp_path / "old.csv").write_text(HEADER + old)
    (tmp_path / "new.csv").write_text(HEADER + new)
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "old.csv"), str(tmp_path / "new.csv")], capture_output=True, text=True)


def test_cells_within_the_spread_pass_and_are_counted(tmp_path):
    done = run(tmp_path, "iid,A,4,80.0,0.5\niid,B,4,70.0,1.0\ndir,A,4,60.0,0.0\n", "iid,A,4,80.0,0.4\niid,B,4,70.9,1.1\ndir,A,4,60.0,0.0\n")
    assert done.returncode == 0, done.stdout
    assert "acc: 3 cells: 2 identical, 1 within the std over seeds, 0 outside, 0 missing; largest difference 0.900" in done.stdout


def test_a_cell_outside_the_spread_or_missing_fails_and_is_named(tmp_path):
    done = run(tmp_path, "iid,A,4,80.0,0.5\niid,B,4,70.0,1.0\n", "iid,A,4,81.0,0.5\n")
    assert done.returncode == 1
    assert "iid | A: 80.000 -> 81.000 (difference 1.000, std over seeds 0.500)" in done.stdout
    assert "iid | B: missing from the rerun" in done.stdout
