"""scripts/grid_round_logs.py: one seed's runs of a grid, cut short, and whether two such
folders hold the same round logs byte for byte."""

from pathlib import Path

import pytest

from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "grids" / "tiny.toml"


def script():
    return load_script("grid_round_logs")


def test_two_runs_of_one_code_compare_equal_and_a_changed_log_is_named(tmp_path, capsys):
    # Prepare
    module = script()
    for name in ("before", "after"):
        assert module.main(["run", str(TINY), str(tmp_path / name), "--seed", "44", "--rounds", "2"]) == 0
    logs = sorted((tmp_path / "after" / "runs").glob("*/peers/*.jsonl"))

    # Execute
    same = module.main(["compare", str(tmp_path / "before"), str(tmp_path / "after")])
    logs[0].write_text(logs[0].read_text().replace('"round": 1', '"round": 7', 1))
    changed = module.main(["compare", str(tmp_path / "before"), str(tmp_path / "after")])

    # Assert: the seed's 2 runs of 4 clients, 2 rounds each; then the one edited log
    out = capsys.readouterr().out
    assert len(logs) == 8 and all(len(p.read_text().splitlines()) == 2 for p in logs[1:])
    assert same == 0 and "8 round logs in both, 0 differ, 0 on one side only" in out
    assert changed == 1 and f"differs: {logs[0].relative_to(tmp_path / 'after')}" in out


def test_a_seed_the_grid_lacks_or_a_used_folder_is_refused(tmp_path):
    module = script()
    with pytest.raises(SystemExit, match=r"no run of seed 7 \(seeds: 43, 44\)"):
        module.main(["run", str(TINY), str(tmp_path / "a"), "--seed", "7", "--rounds", "1"])
    (tmp_path / "b" / "runs" / "x").mkdir(parents=True)
    with pytest.raises(SystemExit, match="already holds runs"):
        module.main(["run", str(TINY), str(tmp_path / "b"), "--seed", "43", "--rounds", "1"])
    with pytest.raises(SystemExit, match="no runs/ folder"):
        module.main(["compare", str(tmp_path / "a"), str(tmp_path / "b")])
