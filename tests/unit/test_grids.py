"""The grids shipped in examples/grids: each one plans (every point is a valid scenario) and
every ``[report.paper]`` key names a cell of its table, so a typo in a paper key or a row label
cannot silently drop a comparison."""

import itertools
from pathlib import Path

import pytest

from dfedrw.experiments.table import Table
from dfedrw.experiments.grid import load_grid
from dfedrw.experiments.sweep_plan import plan_sweep

GRIDS = sorted((Path(__file__).resolve().parents[2] / "examples" / "grids").rglob("*.toml"))


def table_keys(plan, axes):
    """Every "ROW|COLUMN" key the report of ``plan`` can print, with its labels."""
    spec = plan.report
    table = Table(spec, axes, rows=[], columns=[], cells={}, seeds=[], missing=[])
    rows = itertools.product(*(axes[a] for a in spec["rows"]))
    return {table.cell_key(row, c) for row in rows for c in axes[spec["columns"]]}


@pytest.mark.parametrize("path", GRIDS, ids=lambda p: p.relative_to(p.parents[1]).as_posix())
def test_grid_plans_and_paper_keys_name_cells(path, tmp_path):
    grid = load_grid(path)
    plan = plan_sweep(grid, tmp_path / "sweep")
    assert plan.runs and len(plan.points) >= len(plan.runs)
    if plan.report is None:
        return
    unknown = sorted(set(plan.report["paper"]) - table_keys(plan, grid.axis_labels()))
    assert not unknown, f"{path.name}: [report.paper] keys that name no cell: {unknown}"


def test_paper_grids_cover_both_tables():
    # Seeds 43-46 of every cell of the paper's two tables.
    grids = {p.stem: p for p in GRIDS}
    fairness = plan_sweep(load_grid(grids["paper_fairness_fmnist"]), Path("unused"))
    byzantine = plan_sweep(load_grid(grids["paper_byzantine_fmnist"]), Path("unused"))
    assert len(fairness.points) == 4 * 4 * 7
    assert len(fairness.report["paper"]) == 4 * 7
    # No-attack runs are shared by the three attack rows: 3 * 4 * 7 points, 4 * 4 * (3 * 6 + 1) runs.
    assert len(byzantine.points) == 4 * 3 * 4 * 7
    assert len(byzantine.runs) == 4 * 4 * (3 * 6 + 1)
    assert len(byzantine.report["paper"]) == 3 * 4 * 7
