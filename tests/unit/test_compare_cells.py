"""scripts/compare_cells.py: which cells of a rerun leave the committed spread over seeds."""

from tests.support.scripts import load_script

HEADER = "data.partition,method,seeds,acc_mean,acc_std\n"


def run(tmp_path, capsys, old: str, new: str) -> tuple[int, str]:
    module = load_script("compare_cells")
    (tmp_path / "old.csv").write_text(HEADER + old)
    (tmp_path / "new.csv").write_text(HEADER + new)
    code = module.main([str(tmp_path / "old.csv"), str(tmp_path / "new.csv")])
    return code, capsys.readouterr().out


def test_cells_within_the_spread_pass_and_are_counted(tmp_path, capsys):
    code, out = run(tmp_path, capsys, "iid,A,4,80.0,0.5\niid,B,4,70.0,1.0\ndir,A,4,60.0,0.0\n", "iid,A,4,80.0,0.4\niid,B,4,70.9,1.1\ndir,A,4,60.0,0.0\n")
    assert code == 0, out
    assert "acc: 3 cells: 2 identical, 1 within the std over seeds, 0 outside, 0 missing; largest difference 0.900" in out


def test_a_cell_outside_the_spread_or_missing_fails_and_is_named(tmp_path, capsys):
    code, out = run(tmp_path, capsys, "iid,A,4,80.0,0.5\niid,B,4,70.0,1.0\n", "iid,A,4,81.0,0.5\n")
    assert code == 1
    assert "iid | A: 80.000 -> 81.000 (difference 1.000, std over seeds 0.500)" in out
    assert "iid | B: missing from the rerun" in out
