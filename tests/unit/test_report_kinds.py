"""``dfedrw report`` for the robustness and two-pair kinds, and the fairness table's global
accuracy, on hand-made sweep folders with hand-computed numbers."""

import pytest

from dfedrw.experiments.plots import make_plots
from dfedrw.experiments.report import ReportError, load_results, normalize_report_spec, render_markdown, write_report
from dfedrw.experiments import robustness, tpm_pairs
from dfedrw.experiments.robustness import ranking, render_worst_case_csv, worst_case
from dfedrw.experiments.tpm_pairs import verdict
from tests.support.reports import FAIR_AXES, FAIR_SPEC, make_fairness, write_run, write_sweep


def peers(acc, byzantine):
    out = {"0": {"role": "honest", "accuracy": acc, "global_accuracy": acc}}
    if byzantine:
        out["1"] = {"role": "byzantine", "accuracy": None, "global_accuracy": None}
    return out


def summary(acc, share):
    return {
        "honest_mean_global_accuracy": acc, "global_accuracy_variance": 1.0,
        "honest_mean_accuracy": acc, "accuracy_variance": 1.0, "byzantine_weight_share": share,
    }


# --------------------------------------------------------------------------- robustness

ROB_AXES = {
    "seed": ["43", "44"],
    "data.partition": ["iid", "dirichlet:0.1"],
    "attack": ["GA", "ALIE", "Decoy"],
    "method": ["No-AT", "Median", "Ours"],
}
ROB_SPEC = {
    "kind": "robustness",
    "rows": ["data.partition", "method"],
    "columns": "attack",
    "unranked": ["No-AT"],
    "reference": "No-AT",
    "row_labels": {"iid": "IID", "dirichlet:0.1": "Diri(0.1)"},
    "axis_labels": {"data.partition": "DH", "method": "Defence"},
}
# (partition, method) -> accuracy per seed (43, 44), one run shared by every attack
ROB_NO_AT = {"iid": (80.0, 82.0), "dirichlet:0.1": (70.0, 72.0)}
# (partition, attack, method) -> ((acc 43, share 43), (acc 44, share 44)); None: never started
ROB_RUNS = {
    ("iid", "GA", "Median"): ((79.0, 0.0), (81.0, 0.0)),
    ("iid", "ALIE", "Median"): ((70.0, 0.2), (74.0, 0.3)),
    ("iid", "Decoy", "Median"): ((78.0, 0.0001), (78.0, 0.0003)),
    ("iid", "GA", "Ours"): ((80.0, 0.0), (80.0, 0.0)),
    ("iid", "ALIE", "Ours"): ((76.0, 0.1), (78.0, 0.2)),
    ("iid", "Decoy", "Ours"): ((12.0, 0.09), (14.0, 0.1)),
    ("dirichlet:0.1", "GA", "Median"): ((60.0, 0.0), (62.0, 0.0)),
    ("dirichlet:0.1", "ALIE", "Median"): ((65.0, 0.25), (65.0, 0.25)),
    ("dirichlet:0.1", "Decoy", "Median"): ((50.0, 0.05), None),
    ("dirichlet:0.1", "GA", "Ours"): ((50.0, 0.02), (56.0, 0.0)),
    ("dirichlet:0.1", "ALIE", "Ours"): ((69.0, 0.1), (71.0, 0.1)),
    ("dirichlet:0.1", "Decoy", "Ours"): ((12.0, 0.1), (12.0, 0.1)),
}
SHORT = {"iid": "iid", "dirichlet:0.1": "diri"}


def make_robustness(root, spec=ROB_SPEC):
    points = []
    for s, seed in enumerate(ROB_AXES["seed"]):
        for part in ROB_AXES["data.partition"]:
            for attack in ROB_AXES["attack"]:
                for method in ROB_AXES["method"]:
                    labels = {"seed": seed, "data.partition": part, "attack": attack, "method": method}
                    if method == "No-AT":
                        name = f"{seed}_{SHORT[part]}_noat"
                        result = (ROB_NO_AT[part][s], None)
                    else:
                        name = f"{seed}_{SHORT[part]}_{attack.lower()}_{method.lower()}"
                        result = ROB_RUNS[part, attack, method][s]
                    points.append((labels, name))
                    if result is not None and not (root / "runs" / name).exists():
                        acc, share = result
                        write_run(root, name, summary(acc, share), peers(acc, method != "No-AT"))
    write_sweep(root, spec, ROB_AXES, points)
    return root


# --------------------------------------------------------------------------- tpm_pairs

PAIR_AXES = {
    "seed": ["43", "44"],
    "attack.name": ["gaussian", "alie"],
    "data.partition": ["iid", "dirichlet:0.1"],
    "method": ["Loss", "Accuracy"],
}
PAIR_SPEC = {
    "kind": "tpm_pairs",
    "rows": ["attack.name", "data.partition"],
    "columns": "method",
    "row_labels": {"gaussian": "GA", "alie": "ALIE", "iid": "IID", "dirichlet:0.1": "Diri(0.1)"},
    "axis_labels": {"attack.name": "Attack", "data.partition": "DH"},
}
# (attack, partition) -> (Loss accuracies, Accuracy accuracies) for seeds 43, 44
PAIR_RUNS = {
    ("gaussian", "iid"): ((80.0, 81.0), (80.0, 80.5)),  # +0.25 within std 0.5: about equal (claim holds)
    ("gaussian", "dirichlet:0.1"): ((60.0, 62.0), (50.0, 54.0)),  # +9 beyond std 2: Loss better (holds)
    ("alie", "iid"): ((78.0, 78.0), (80.0, 80.0)),  # -2 beyond std 0: Accuracy better (fails)
    ("alie", "dirichlet:0.1"): ((70.0, 72.0), (69.0, 71.0)),  # +1, not beyond std 1: about equal (fails)
}


def make_pairs(root, spec=PAIR_SPEC):
    points = []
    for s, seed in enumerate(PAIR_AXES["seed"]):
        for attack in PAIR_AXES["attack.name"]:
            for part in PAIR_AXES["data.partition"]:
                for k, method in enumerate(PAIR_AXES["method"]):
                    name = f"{seed}_{attack}_{SHORT[part]}_{method.lower()}"
                    points.append(({"seed": seed, "attack.name": attack, "data.partition": part, "method": method}, name))
                    acc = PAIR_RUNS[attack, part][k][s]
                    write_run(root, name, summary(acc, 0.01 * (k + 1)), peers(acc, True))
    write_sweep(root, spec, PAIR_AXES, points)
    return root


# --------------------------------------------------------------------------- fairness: global accuracy

# The fairness sweep's axes and report are those of tests.support.reports; here its runs have
# global accuracies too.
# (partition, method) -> ((local, global) seed 43, (local, global) seed 44)
FAIR_RUNS = {
    ("iid", "DFedAvg"): ((80.0, 80.0), (82.0, 81.0)),
    ("iid", "Ours"): ((81.0, 80.5), (83.0, 80.5)),
    ("dirichlet:0.1", "DFedAvg"): ((70.0, 79.0), (74.0, 81.0)),
    ("dirichlet:0.1", "Ours"): ((95.0, 40.0), (96.0, 36.0)),
}


def make_fairness_with_global(root):
    points = []
    for s, seed in enumerate(FAIR_AXES["seed"]):
        for part in FAIR_AXES["data.partition"]:
            for method in FAIR_AXES["method"]:
                name = f"{seed}_{SHORT[part]}_{method.lower()}"
                points.append(({"seed": seed, "data.partition": part, "method": method}, name))
                local, glob = FAIR_RUNS[part, method][s]
                metrics = {
                    "honest_mean_accuracy": local, "accuracy_variance": 2.0,
                    "honest_mean_global_accuracy": glob, "global_accuracy_variance": 3.0,
                }
                write_run(root, name, metrics, {"0": {"role": "honest", "accuracy": local, "global_accuracy": glob}})
    write_sweep(root, FAIR_SPEC, FAIR_AXES, points)
    return root


# --------------------------------------------------------------------------- expected outputs

ROB_MD = """\
# Robustness: each defence against each attack

Cell: ACC ± STD: the mean over seeds of `honest_mean_global_accuracy` (%) and its standard deviation over seeds (population, ddof=0). **Bold**: the highest accuracy under each attack (excluding No-AT), and the best worst case. Worst case: the defence's lowest cell over the attacks, with the attack that gives it; defences are ranked by it (a defence is as good as the attack that hurts it most).

Byzantine weight share, the second table of each section: `byzantine_weight_share`, the weight honest clients gave Byzantine senders over the whole run, mean over seeds (0: never any; <0.001: some, below what 3 decimals show; n/a: no Byzantine clients). A clipping rule (ClippedGossip, CenteredClipping) can give a Byzantine model a small share and still move by the full clipping radius toward it every round.

## DH: IID

| Defence | GA | ALIE | Decoy | Worst case |
|---|---|---|---|---|
| No-AT | 81.00 ± 1.00 | 81.00 ± 1.00 | 81.00 ± 1.00 | 81.00 |
| Median | **80.00** ± 1.00 | 72.00 ± 2.00 | **78.00** ± 0.00 | **72.00** (ALIE) |
| Ours | **80.00** ± 0.00 | **77.00** ± 1.00 | 13.00 ± 1.00 | 13.00 (Decoy) |

Byzantine weight share:

| Defence | GA | ALIE | Decoy |
|---|---|---|---|
| No-AT | n/a | n/a | n/a |
| Median | 0 | 0.250 | <0.001 |
| Ours | 0 | 0.150 | 0.095 |

Ranking by worst case (No-AT not ranked):

1. Median: 72.00 (ALIE); -9.00 against No-AT
2. Ours: 13.00 (Decoy); -68.00 against No-AT

## DH: Diri(0.1)

| Defence | GA | ALIE | Decoy | Worst case |
|---|---|---|---|---|
| No-AT | 71.00 ± 1.00 | 71.00 ± 1.00 | 71.00 ± 1.00 | 71.00 |
| Median | **61.00** ± 1.00 | 65.00 ± 0.00 | **50.00** ± 0.00 [n=1] | **50.00** (Decoy) |
| Ours | 53.00 ± 3.00 | **70.00** ± 1.00 | 12.00 ± 0.00 | 12.00 (Decoy) |

Byzantine weight share:

| Defence | GA | ALIE | Decoy |
|---|---|---|---|
| No-AT | n/a | n/a | n/a |
| Median | 0 | 0.250 | 0.050 |
| Ours | 0.010 | 0.100 | 0.100 |

Ranking by worst case (No-AT not ranked):

1. Median: 50.00 (Decoy); -21.00 against No-AT
2. Ours: 12.00 (Decoy); -59.00 against No-AT

## Worst case over every attack and every DH

Each DH column: the worst case there, as above; overall: the lowest of them, with its attack and DH. Ranked by the overall worst case.

| Rank | Defence | IID | Diri(0.1) | Overall |
|---|---|---|---|---|
| 1 | Median | 72.00 (ALIE) | 50.00 (Decoy) | 50.00 (Decoy, Diri(0.1)) |
| 2 | Ours | 13.00 (Decoy) | 12.00 (Decoy) | 12.00 (Decoy, Diri(0.1)) |
|  | No-AT | 81.00 | 71.00 | 71.00 (Diri(0.1)) |

Cells average up to 2 seeds (seeds 43, 44); [n=k] marks a cell with only k finished runs.
± is the population standard deviation over seeds (numpy ddof=0), not the sample one.

Missing results (1 run):

- `runs/44_diri_decoy_median` (not started): seed=44, data.partition=dirichlet:0.1, attack=Decoy, method=Median
"""

ROB_WORST = """\
data.partition,method,rank,worst_case,attack,attacks,of
iid,No-AT,,81.000000,,3,3
iid,Median,1,72.000000,ALIE,3,3
iid,Ours,2,13.000000,Decoy,3,3
dirichlet:0.1,No-AT,,71.000000,,3,3
dirichlet:0.1,Median,1,50.000000,Decoy,3,3
dirichlet:0.1,Ours,2,12.000000,Decoy,3,3
all,No-AT,,71.000000,,,
all,Median,1,50.000000,Decoy,,
all,Ours,2,12.000000,Decoy,,
"""

PAIR_MD = """\
# Loss against Accuracy

Cell: ACC ± STD: the mean over seeds of `honest_mean_global_accuracy` (%) and its standard deviation over seeds (population, ddof=0). Δ = Loss − Accuracy (points). Verdict: "Loss better" when Δ is larger than the larger of the two standard deviations over seeds, "Accuracy better" when −Δ is, otherwise "about equal" (**bold**: the better one). Claim: about equal on the rows of IID, Loss better on every other row.

| Attack | DH | Loss | Accuracy | Δ | larger std | verdict | claim | holds |
|---|---|---|---|---|---|---|---|---|
| GA | IID | 80.50 ± 0.50 | 80.25 ± 0.25 | +0.25 | 0.50 | about equal | about equal | yes |
|  | Diri(0.1) | **61.00** ± 1.00 | 52.00 ± 2.00 | +9.00 | 2.00 | Loss better | Loss better | yes |
| ALIE | IID | 78.00 ± 0.00 | **80.00** ± 0.00 | -2.00 | 0.00 | Accuracy better | about equal | no |
|  | Diri(0.1) | 71.00 ± 1.00 | 70.00 ± 1.00 | +1.00 | 1.00 | about equal | Loss better | no |

The claim holds on 2 of 4 rows with results.

Rows where it does not:

- ALIE / IID: Accuracy better (Δ -2.00, larger std 0.00); claim: about equal
- ALIE / Diri(0.1): about equal (Δ +1.00, larger std 1.00); claim: Loss better

Each cell averages 2 seeds (seeds 43, 44).
± is the population standard deviation over seeds (numpy ddof=0), not the sample one.
"""

FAIR_GLOBAL = """\
## Global accuracy of the same runs

Cell: ACC ± STD: the mean over seeds of `honest_mean_global_accuracy` (%: each honest client's final model scored on the whole test set, every class alike, then averaged over the clients) and its standard deviation over seeds (population, ddof=0). No bold: the table above ranks by fairness; this one shows what the same models do on every class.

| DH | DFedAvg | Ours |
|---|---|---|
| IID | 80.50 ± 0.50 | 80.50 ± 0.00 |
| Diri(0.1) | 80.00 ± 1.00 | 38.00 ± 2.00 |
"""


def test_robustness_table_worst_case_and_ranking_exact(tmp_path):
    table = load_results([make_robustness(tmp_path / "s")])

    files = {p.name: p.read_text() for p in write_report([tmp_path / "s"], tmp_path / "out", plots=False)}

    assert files["table.md"] == ROB_MD
    assert files["worst_case.csv"] == ROB_WORST
    assert render_worst_case_csv(table) == ROB_WORST
    assert set(files) == {"table.md", "table.csv", "cells.csv", "worst_case.csv"}
    # Median's worst attack differs per partition; the No-AT row is one run under every attack.
    iid_median = worst_case(table, ("iid", "Median"))
    assert (iid_median.value, iid_median.column, iid_median.same_runs) == (72.0, "ALIE", False)
    assert worst_case(table, ("iid", "No-AT")).same_runs
    assert [(rank, row[-1]) for rank, row, _ in ranking(table, [r for r in table.rows if r[0] == "iid"])] == [
        (1, "Median"), (2, "Ours"),
    ]


def test_robustness_cells_csv_has_the_weight_share_and_blanks_without_byzantine_clients(tmp_path):
    write_report([make_robustness(tmp_path / "s")], tmp_path / "out", plots=False)

    lines = (tmp_path / "out" / "cells.csv").read_text().splitlines()

    assert lines[0].endswith(",byzantine_weight_share_mean,byzantine_weight_share_std")
    assert lines[1] == "iid,No-AT,GA,2,81.000000,1.000000,1.000000,0.000000,,"
    assert "iid,Median,Decoy,2,78.000000,0.000000,1.000000,0.000000,0.000200,0.000100" in lines
    assert "dirichlet:0.1,Median,Decoy,1,50.000000,0.000000,1.000000,0.000000,0.050000,0.000000" in lines


def test_robustness_ties_share_a_rank(tmp_path):
    table = load_results([make_robustness(tmp_path / "s")])
    ours = table.cells[("iid", "Ours"), "Decoy"]
    for run in ours.runs:  # Ours's worst case becomes Median's: 72.00
        run.summary["honest_mean_global_accuracy"] = 72.001

    ranks = ranking(table, [r for r in table.rows if r[0] == "iid"])

    assert [(rank, row[-1]) for rank, row, _ in ranks] == [(1, "Median"), (1, "Ours")]


def test_robustness_plots(tmp_path):
    table = load_results([make_robustness(tmp_path / "s")])

    names = [p.name for p in robustness.make_plots(table, tmp_path / "plots")]

    assert names[:2] == ["robustness_00_iid.png", "robustness_01_diri-0-1.png"]
    assert names[2:] == [
        "accuracy_00_iid-no-at.png", "accuracy_01_iid-median.png", "accuracy_02_iid-ours.png",
        "accuracy_03_diri-0-1-no-at.png", "accuracy_04_diri-0-1-median.png", "accuracy_05_diri-0-1-ours.png",
    ]
    assert all((tmp_path / "plots" / n).stat().st_size > 1000 for n in names)


def test_a_report_removes_the_plots_an_earlier_report_drew_and_this_one_does_not(tmp_path):
    # Prepare: an earlier report's plot under a number this table's rows no longer give, and a
    # file of the user's that is no plot
    plots = tmp_path / "out" / "plots"
    plots.mkdir(parents=True)
    (plots / "accuracy_07_labelskew-4-ours.png").write_bytes(b"old")
    (plots / "notes.txt").write_text("mine")

    # Execute
    written = write_report([make_robustness(tmp_path / "s")], tmp_path / "out")

    # Assert: every plot left is one this report wrote; the other file stays
    assert sorted(plots.glob("*.png")) == sorted(p for p in written if p.suffix == ".png")
    assert not (plots / "accuracy_07_labelskew-4-ours.png").exists()
    assert (plots / "notes.txt").read_text() == "mine"


def test_tpm_pairs_table_and_verdicts_exact(tmp_path):
    table = load_results([make_pairs(tmp_path / "s")])

    assert tpm_pairs.render_markdown(table) == PAIR_MD
    v = verdict(table, ("gaussian", "dirichlet:0.1"))
    assert (v.diff, v.spread, v.outcome, v.claim, v.holds) == (9.0, 2.0, "Loss better", "Loss better", True)
    v = verdict(table, ("alie", "dirichlet:0.1"))  # a difference equal to the std is not beyond it
    assert (v.diff, v.spread, v.outcome, v.holds) == (1.0, 1.0, "about equal", False)


def test_tpm_pairs_plots_start_with_the_bars(tmp_path):
    root = make_pairs(tmp_path / "s")

    names = [p.name for p in write_report([root], tmp_path / "out") if p.suffix == ".png"]

    assert names[0] == "pairs.png" and "weights_00_ga-iid__00_loss.png" in names
    assert (tmp_path / "out" / "plots" / "pairs.png").stat().st_size > 1000


def test_fairness_table_gives_the_global_accuracy_of_the_same_runs(tmp_path):
    table = load_results([make_fairness_with_global(tmp_path / "s")])

    md = render_markdown(table)

    assert md.endswith(FAIR_GLOBAL)
    assert "| Diri(0.1) | 80.00 ± 1.00 | 38.00 ± 2.00 |" in md
    write_report([tmp_path / "s"], tmp_path / "out", plots=False)
    cells = (tmp_path / "out" / "cells.csv").read_text()
    assert cells.splitlines()[4] == (
        "dirichlet:0.1,Ours,2,95.500000,0.500000,2.000000,0.000000,38.000000,2.000000,3.000000,0.000000"
    )


def test_fairness_without_global_accuracy_keeps_its_table_and_plots(tmp_path):
    table = load_results([make_fairness(tmp_path / "s")])  # runs that give only the local accuracy

    assert "## Global accuracy" not in render_markdown(table)
    assert "local_vs_global.png" not in [p.name for p in make_plots(table, tmp_path / "plots")]


def test_local_vs_global_plot(tmp_path):
    table = load_results([make_fairness_with_global(tmp_path / "s")])

    names = [p.name for p in make_plots(table, tmp_path / "plots")]

    assert names[-1] == "local_vs_global.png"
    assert (tmp_path / "plots" / "local_vs_global.png").stat().st_size > 1000


def test_compact_labels_and_clusters():
    from dfedrw.experiments.plots import _clusters, _compact_labels

    assert _compact_labels(["DFedAvg", "q-FDFL (q=0.1)", "q-FDFL (q=0.5)"]) == "DFedAvg\nq-FDFL (q=0.1, q=0.5)"
    groups = _clusters([(80.0, 80.0, "a"), (36.0, 95.0, "b"), (80.5, 81.0, "c"), (36.2, 95.1, "d")], radius=1.0)
    assert [[p[2] for p in g] for g in groups] == [["a", "c"], ["b", "d"]]


@pytest.mark.parametrize(
    "kind, raw, words",
    [
        ("tpm_pairs", {"columns": "method", "rows": ["data.partition"]}, "compares two pairs; the axis 'method' has 3 values"),
        ("fairness", {"equal_rows": ["iid"]}, "report.equal_rows is for kind = \"tpm_pairs\""),
        ("robustness", {"columns": "method", "rows": ["data.partition"], "reference": "Nobody"},
         "must be a value of the defence axis 'data.partition'"),
        ("robustness", {"paper": {"A|B": 1.0}}, "report.paper is for kind"),
    ],
)
def test_new_kinds_spec_errors(kind, raw, words):
    axes = {"seed": ["43"], "data.partition": ["iid", "dirichlet:0.1"], "method": ["A", "B", "C"]}

    with pytest.raises(ReportError) as err:
        normalize_report_spec({"kind": kind, **raw}, axes)

    assert words in str(err.value)


def test_tpm_pairs_spec_keeps_equal_rows_and_other_kinds_do_not_gain_it():
    axes = {"seed": ["43"], "data.partition": ["iid"], "method": ["A", "B"]}

    assert normalize_report_spec({"kind": "tpm_pairs"}, axes)["equal_rows"] == ["iid"]
    assert "equal_rows" not in normalize_report_spec({"kind": "byzantine"}, axes)


def test_runs_with_a_clock_are_plotted_against_seconds_and_bytes_too(tmp_path):
    root = tmp_path / "s"
    points = []
    for method, pace in (("DFedAvg", 1.0), ("Ours", 2.0)):
        name = method.lower()
        records = [
            {"round": r, "weights": {"0": 1.0}, "bytes_sent": 1000, "seconds": pace * (r + 1), **({"accuracy": 50.0 + r} if r % 2 else {})}
            for r in range(6)
        ]
        write_run(root, name, {"accuracy_variance": 1.0, "honest_mean_accuracy": 55.0}, rounds={0: records})
        points.append(({"seed": "43", "data.partition": "iid", "method": method}, name))
    write_sweep(root, FAIR_SPEC, {**FAIR_AXES, "seed": ["43"], "data.partition": ["iid"]}, points)
    table = load_results([root])

    names = [p.name for p in make_plots(table, tmp_path / "plots")]

    assert names[:3] == ["accuracy_00_iid.png", "accuracy_seconds_00_iid.png", "accuracy_bytes_sent_00_iid.png"]
    assert all((tmp_path / "plots" / n).stat().st_size > 1000 for n in names[:3])
    # Runs without a clock (no seconds in their records) get the plot against rounds only.
    plain = [p.name for p in make_plots(load_results([make_fairness(tmp_path / "f")]), tmp_path / "plain")]
    assert not any(n.startswith(("accuracy_seconds", "accuracy_bytes")) for n in plain)
