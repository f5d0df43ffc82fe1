"""``dfedrw report`` on hand-made sweep folders: exact tables, paper comparison, merging,
determinism and the plots' inputs."""

import json
import math
from dataclasses import replace

import pytest

from dfedrw.experiments.cli import main
from dfedrw.experiments.plots import accuracy_curve, make_plots, mean_weights
from dfedrw.experiments.report import (
    MAX_NOT_STARTED_LISTED,
    Missing,
    ReportError,
    RunResult,
    load_results,
    normalize_report_spec,
    render_cells_csv,
    render_comparison,
    render_csv,
    render_markdown,
    write_report,
)
from tests.support.reports import (
    BYZ_AXES,
    BYZ_SPEC,
    FAIR_AXES,
    FAIR_SPEC,
    byz_peers,
    byz_rounds,
    make_byzantine,
    make_fairness,
    write_run,
)


# --------------------------------------------------------------------------- fairness


FAIR_MD = """\
# Client fairness

Cell: VAR (ACC): the population variance over honest clients of their final test accuracy (%², `accuracy_variance`) and, in brackets, their mean accuracy (%, `honest_mean_accuracy`), each averaged over seeds. **Bold**: the lowest variance in the row.

| DH | DFedAvg | Ours |
|---|---|---|
| IID | 1.500 (81.000) | **1.300** (82.000) |
| Diri(0.1) | 350.000 (72.000) | **10.000** (95.000) [n=1] |

Cells average up to 2 seeds (seeds 43, 44); [n=k] marks a cell with only k finished runs.

Missing results (1 run):

- `runs/44_diri_ours` (no summary.json): seed=44, data.partition=dirichlet:0.1, method=Ours
"""

FAIR_CSV = """\
DH,DFedAvg,Ours
IID,1.500 (81.000),1.300 (82.000)
Diri(0.1),350.000 (72.000),10.000 (95.000) [n=1]
"""

FAIR_CELLS = """\
data.partition,method,seeds,honest_mean_accuracy_mean,honest_mean_accuracy_std,accuracy_variance_mean,accuracy_variance_std
iid,DFedAvg,2,81.000000,1.000000,1.500000,0.500000
iid,Ours,2,82.000000,1.000000,1.300000,0.100000
dirichlet:0.1,DFedAvg,2,72.000000,2.000000,350.000000,50.000000
dirichlet:0.1,Ours,1,95.000000,0.000000,10.000000,0.000000
"""


def test_fairness_table_markdown_and_csv_exact(tmp_path):
    table = load_results([make_fairness(tmp_path / "s")])

    assert render_markdown(table) == FAIR_MD
    assert render_csv(table) == FAIR_CSV
    assert render_cells_csv(table) == FAIR_CELLS
    assert render_comparison(table) is None


FAIR_PAPER = {
    "IID|DFedAvg": 1.0,
    "IID|Ours": [1.005, 82.46],
    "Diri(0.1)|DFedAvg": [360.772, 76.972],
    "Diri(0.1)|Ours": [13.422, 95.39],
    "LabelSkew(4)|Ours": 15.876,
}

FAIR_COMPARISON = """\
# Comparison with the paper

Ours: this sweep, averaged over seeds (`honest_mean_accuracy`); paper: `[report.paper]` of the grid. Δ = ours − paper.

| DH | Method | ours VAR | paper VAR | Δ VAR | ours ACC | paper ACC | Δ ACC |
|---|---|---|---|---|---|---|---|
| IID | DFedAvg | 1.500 | 1.000 | +0.500 | 81.000 |  |  |
| IID | Ours | 1.300 | 1.005 | +0.295 | 82.000 | 82.460 | -0.460 |
| Diri(0.1) | DFedAvg | 350.000 | 360.772 | -10.772 | 72.000 | 76.972 | -4.972 |
| Diri(0.1) | Ours | 10.000 | 13.422 | -3.422 | 95.000 | 95.390 | -0.390 |

## Accuracy cells more than 3.0 points from the paper

- Diri(0.1) / DFedAvg: ours 72.00, paper 76.97 (-4.97)

## Rows where the order of methods by variance differs from the paper

- IID: ours Ours (1.300) < DFedAvg (1.500); paper DFedAvg (1.000) < Ours (1.005)

## Paper values with no cell in this table (check the labels)

- `LabelSkew(4)|Ours`
"""


def test_fairness_comparison_lists_far_cells_and_reordered_rows(tmp_path):
    table = load_results([make_fairness(tmp_path / "s", {**FAIR_SPEC, "paper": FAIR_PAPER})])

    assert render_comparison(table) == FAIR_COMPARISON


# --------------------------------------------------------------------------- byzantine


BYZ_MD = """\
# Byzantine robustness

Cell: ACC ± STD: the mean over seeds of `honest_mean_global_accuracy` (%) and its standard deviation over seeds (population, ddof=0). **Bold**: the highest accuracy in the row (excluding No-AT).

| Attack | DH | No-AT | Median | Ours |
|---|---|---|---|---|
| GA | IID | 82.00 ± 1.00 | **80.50** ± 0.50 | **80.50** ± 0.25 |
|  | Diri(0.1) | 71.00 ± 1.00 | 52.00 ± 2.00 | **66.00** ± 0.00 [n=1] |
| S-F | IID | 82.00 ± 1.00 | 65.00 ± 5.00 | **83.00** ± 0.50 |

Cells average up to 2 seeds (seeds 43, 44); [n=k] marks a cell with only k finished runs.
± is the population standard deviation over seeds (numpy ddof=0), not the sample one.

Missing results (1 run):

- `runs/44_ga_diri_ours` (not started): seed=44, attack.name=gaussian, data.partition=dirichlet:0.1, method=Ours
"""

BYZ_CSV = """\
Attack,DH,No-AT,Median,Ours
GA,IID,82.00 ± 1.00,80.50 ± 0.50,80.50 ± 0.25
GA,Diri(0.1),71.00 ± 1.00,52.00 ± 2.00,66.00 ± 0.00 [n=1]
S-F,IID,82.00 ± 1.00,65.00 ± 5.00,83.00 ± 0.50
"""

BYZ_COMPARISON = """\
# Comparison with the paper

Ours: this sweep, averaged over seeds (`honest_mean_global_accuracy`); paper: `[report.paper]` of the grid. Δ = ours − paper.

| Attack | DH | Method | ours ACC | paper ACC | Δ ACC |
|---|---|---|---|---|---|
| GA | IID | Median | 80.50 | 91.79 | -11.29 |
| GA | IID | Ours | 80.50 | 81.32 | -0.82 |
| S-F | IID | Ours | 83.00 | 83.48 | -0.48 |

## Accuracy cells more than 3.0 points from the paper

- GA / IID / Median: ours 80.50, paper 91.79 (-11.29)
"""


def test_byzantine_table_exact_with_shared_baseline_and_ties(tmp_path):
    table = load_results([make_byzantine(tmp_path / "s")])

    assert render_markdown(table) == BYZ_MD
    assert render_csv(table) == BYZ_CSV
    assert table.cells[("sign_flip", "iid"), "No-AT"].runs[0].name == "43_iid_noat"


def test_a_sweep_in_progress_lists_its_broken_runs_and_only_the_first_runs_not_started(tmp_path):
    table = load_results([make_byzantine(tmp_path / "s")])
    waiting = [Missing(f"runs/w{i:02d}", "not started", [f"seed={i}"]) for i in range(MAX_NOT_STARTED_LISTED + 3)]
    broken = [Missing("runs/x1", "interrupted", ["seed=99"]), Missing("runs/a0", "no summary.json", ["seed=98"])]

    md = render_markdown(replace(table, missing=[*waiting, *broken]))

    listed = md[md.index("Missing results (15 runs):"):].splitlines()[2:]
    assert listed[0] == "- `runs/a0` (no summary.json): seed=98"
    assert [line.split("`")[1] for line in listed[1:-2]] == [f"runs/w{i:02d}" for i in range(MAX_NOT_STARTED_LISTED)]
    assert listed[-2] == "- `runs/x1` (interrupted): seed=99"
    assert listed[-1].startswith("- and 3 more runs not started (")


def test_byzantine_comparison(tmp_path):
    paper = {"GA|IID|Ours": 81.32, "GA|IID|Median": 91.79, "S-F|IID|Ours": 83.48}
    table = load_results([make_byzantine(tmp_path / "s", {**BYZ_SPEC, "paper": paper})])

    assert render_comparison(table) == BYZ_COMPARISON


def test_byzantine_comparison_against_a_reference_column(tmp_path):
    paper = {"GA|IID|No-AT": 81.6, "GA|IID|Ours": 81.32, "GA|IID|Median": 91.79, "S-F|IID|Ours": 83.48}
    table = load_results([make_byzantine(tmp_path / "s", {**BYZ_SPEC, "paper": paper, "reference": "No-AT"})])

    lines = render_comparison(table).splitlines()

    assert lines[4] == "| Attack | DH | Method | ours ACC | paper ACC | Δ ACC | ours − No-AT | paper − No-AT |"
    assert lines[6:10] == [
        "| GA | IID | No-AT | 82.00 | 81.60 | +0.40 |  |  |",
        "| GA | IID | Median | 80.50 | 91.79 | -11.29 | -1.50 | +10.19 |",
        "| GA | IID | Ours | 80.50 | 81.32 | -0.82 | -1.50 | -0.28 |",
        "| S-F | IID | Ours | 83.00 | 83.48 | -0.48 | +1.00 |  |",  # the paper has no S-F No-AT cell here
    ]


@pytest.mark.parametrize(
    "raw, words",
    [
        ({"kind": "fairness", "reference": "DFedAvg"}, "for kind = \"byzantine\""),
        ({"kind": "byzantine", "reference": "Nobody"}, "must be a value of the columns axis 'method'"),
    ],
)
def test_a_reference_must_be_a_byzantine_column(raw, words):
    with pytest.raises(ReportError, match=words):
        normalize_report_spec({**raw, "rows": ["attack.name", "data.partition"], "columns": "method"}, BYZ_AXES)


# --------------------------------------------------------------------------- files, merging, determinism


def test_report_is_byte_identical_when_run_again(tmp_path):
    root = make_fairness(tmp_path / "s", {**FAIR_SPEC, "paper": FAIR_PAPER})

    first = {p.name: p.read_bytes() for p in write_report([root], tmp_path / "a", plots=False)}
    second = {p.name: p.read_bytes() for p in write_report([root], tmp_path / "b", plots=False)}

    assert set(first) == {"table.md", "table.csv", "cells.csv", "comparison.md"}
    assert first == second
    assert first["table.md"].decode() == FAIR_MD


def test_seeds_split_over_two_sweeps_merge_into_one_table(tmp_path):
    a = make_fairness(tmp_path / "a", seeds=("43",))
    b = make_fairness(tmp_path / "b", seeds=("44",))

    merged = load_results([a, b])

    assert render_markdown(merged).replace("`runs/44_diri_ours` (no summary.json)", "X") == FAIR_MD.replace(
        "`runs/44_diri_ours` (no summary.json)", "X"
    )
    assert merged.cells[("iid",), "DFedAvg"].n == 2


def test_merging_sweeps_with_different_report_specs_is_refused(tmp_path):
    a = make_fairness(tmp_path / "a")
    b = make_fairness(tmp_path / "b", {**FAIR_SPEC, "kind": "byzantine"})

    with pytest.raises(ReportError, match=r"report spec differs .* \(keys: kind, metric\)"):
        load_results([a, b])


@pytest.mark.parametrize(
    "raw, words",
    [
        # columns default to method
        ({"rows": ["method"]}, ["report.rows: 'method': it is the columns' axis (report.columns = 'method')", "choose from: data.partition"]),
        ({"rows": ["lr"]}, ["report.rows: 'lr': it is not a row axis", "choose from: data.partition"]),
        ({"columns": "method", "rows": []}, ["axis 'data.partition' has 2 values", "report.rows"]),
        ({"colums": "method"}, ["report.colums", "kind, metric, rows, columns"]),
        ({"columns": "seed"}, ["report.columns", "data.partition, method"]),
        ({"metric": "accuracy"}, ["report.metric", "honest_mean_accuracy, honest_mean_global_accuracy"]),
        ({"kind": "byzantine", "paper": {"A|B": [1, 2]}}, ["report.paper", "an accuracy"]),
        ({"rows": ["data.partition", "data.partition"], "columns": "method"}, ["twice"]),
    ],
)
def test_report_spec_errors_name_the_key_and_choices(raw, words):
    with pytest.raises(ReportError) as err:
        normalize_report_spec(raw, FAIR_AXES)
    for w in words:
        assert w in str(err.value)


def test_rows_naming_the_only_axis_say_to_leave_rows_out():
    with pytest.raises(ReportError) as err:
        normalize_report_spec({"rows": ["method"]}, {"seed": FAIR_AXES["seed"], "method": FAIR_AXES["method"]})
    assert str(err.value) == (
        "report.rows: 'method': it is the columns' axis (report.columns = 'method'); "
        "the grid has no other axis for the rows: leave report.rows out (one row)"
    )


def test_report_spec_defaults():
    spec = normalize_report_spec(None, FAIR_AXES)

    assert (spec["kind"], spec["metric"], spec["rows"], spec["columns"]) == (
        "fairness", "honest_mean_accuracy", ["data.partition"], "method"
    )
    assert normalize_report_spec({"kind": "byzantine"}, FAIR_AXES)["metric"] == "honest_mean_global_accuracy"


def test_cli_report_writes_the_files_and_bad_folder_is_one_line(tmp_path, capsys):
    root = make_fairness(tmp_path / "s")

    assert main(["report", str(root), "--no-plots"]) == 0
    assert (root / "report" / "table.md").read_text() == FAIR_MD
    assert "| IID | 1.500 (81.000) | **1.300** (82.000) |" in capsys.readouterr().out

    assert main(["report", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no sweep.json" in err


def test_a_sweep_with_no_finished_run_is_refused_and_nothing_is_written(tmp_path, capsys):
    root = make_fairness(tmp_path / "s")
    for summary in (root / "runs").glob("*/summary.json"):
        summary.unlink()

    assert main(["report", str(root), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{root}: no finished run to report (8 runs not finished; the first, runs/" in err
    assert "run or resume the sweep first" in err and not (root / "report").exists()
    # One finished run is enough for a table (the others listed as missing).
    make_fairness(tmp_path / "t")
    assert main(["report", str(tmp_path / "t"), "--no-plots"]) == 0


# --------------------------------------------------------------------------- plots


def test_mean_weights_and_accuracy_curve_hand_computed(tmp_path):
    folder = write_run(tmp_path, "r", {}, byz_peers(80.0, byzantine=True), byz_rounds(80.0))
    run = RunResult("r", folder, "43", json.loads((folder / "summary.json").read_text()))

    receivers, senders, matrix = mean_weights(run)

    assert receivers == [0, 1] and senders == [0, 1, 2]
    # client 0 over 4 rounds: self 0.5+1+0.5+1, client 1 only in round 2, client 2 only in round 0
    assert matrix[0].tolist() == [0.75, 0.125, 0.125]
    assert matrix[1, 1] == 1.0 and math.isnan(matrix[1, 0]) and math.isnan(matrix[1, 2])
    assert accuracy_curve(run, "global_accuracy") == {1: 70.0, 3: 80.0}
    assert accuracy_curve(run, "accuracy") == {1: 0.0}


def test_plots_have_fixed_names_and_heatmaps_only_with_byzantine_clients(tmp_path):
    table = load_results([make_byzantine(tmp_path / "s")])

    names = [p.name for p in make_plots(table, tmp_path / "plots")]

    assert names == [
        "accuracy_00_ga-iid.png", "clients_00_ga-iid.png",
        "weights_00_ga-iid__01_median.png", "weights_00_ga-iid__02_ours.png",
        "accuracy_01_ga-diri-0-1.png", "clients_01_ga-diri-0-1.png",
        "weights_01_ga-diri-0-1__01_median.png", "weights_01_ga-diri-0-1__02_ours.png",
        "accuracy_02_s-f-iid.png", "clients_02_s-f-iid.png",
        "weights_02_s-f-iid__01_median.png", "weights_02_s-f-iid__02_ours.png",
    ]
    assert all((tmp_path / "plots" / n).stat().st_size > 1000 for n in names)
