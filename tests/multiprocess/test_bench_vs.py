"""bench/grid_methods.py --vs REF: the bench in this checkout and in a worktree of a commit,
alternated, with ratios; the worktree removed afterwards."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_bench_against_a_commit_runs_both_alternated_and_leaves_no_worktree(tmp_path):
    before = subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True, check=True).stdout
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "grid_methods.py"), "--grid", str(REPO / "examples" / "grids" / "tiny.toml"),
         "--per", "1", "--rounds", "3", "--vs", "HEAD", "--pairs", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # pair 1 this checkout first, pair 2 the commit first; both methods' figures side by side
    order = [line.split()[2] for line in lines if line.startswith("pair") and "grid" in line]
    assert order == ["this", "HEAD", "HEAD", "this"]
    assert any(line.startswith("DFedAvg ") for line in lines) and lines[-1].startswith("grid CPU s, this / HEAD:")
    after = subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True, check=True).stdout
    assert after == before

    refused = subprocess.run([sys.executable, str(REPO / "bench" / "grid_methods.py"), "--vs", "no-such-commit"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "no commit 'no-such-commit'" in refused.stderr
