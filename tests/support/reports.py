"""Hand-made sweep folders, as a sweep leaves them (only what ``dfedrw report`` reads): what
the report tests share."""

import json

from dfedrw.experiments.report_spec import normalize_report_spec


def write_run(root, name, metrics, peers=None, rounds=None):
    """A finished run folder as `dfedrw run` leaves it (only what the report reads)."""
    folder = root / "runs" / name
    (folder / "peers").mkdir(parents=True, exist_ok=True)
    summary = dict(metrics)
    summary["peers"] = peers or {"0": {"role": "honest", "accuracy": 1.0, "global_accuracy": 1.0}}
    (folder / "summary.json").write_text(json.dumps(summary))
    for k, records in (rounds or {}).items():
        (folder / "peers" / f"{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def write_sweep(root, raw_spec, axes, points):
    """sweep.json as `dfedrw sweep` writes it: points are (labels, run folder name)."""
    root.mkdir(parents=True, exist_ok=True)
    record = {
        "grid": "grid.toml",
        "axes": axes,
        "report": normalize_report_spec(raw_spec, axes),
        "points": [{"labels": labels, "run": f"runs/{name}"} for labels, name in points],
    }
    (root / "sweep.json").write_text(json.dumps(record))


FAIR_AXES = {"seed": ["43", "44"], "data.partition": ["iid", "dirichlet:0.1"], "method": ["DFedAvg", "Ours"]}


FAIR_SPEC = {
    "kind": "fairness",
    "rows": ["data.partition"],
    "columns": "method",
    "row_labels": {"iid": "IID", "dirichlet:0.1": "Diri(0.1)"},
    "axis_labels": {"data.partition": "DH"},
}


# (partition, method, seed) -> (variance, accuracy); the Diri(0.1) / Ours run of seed 44 never finished
FAIR_RUNS = {
    ("iid", "DFedAvg", "43"): (1.0, 80.0),
    ("iid", "DFedAvg", "44"): (2.0, 82.0),
    ("iid", "Ours", "43"): (1.2, 81.0),
    ("iid", "Ours", "44"): (1.4, 83.0),
    ("dirichlet:0.1", "DFedAvg", "43"): (300.0, 70.0),
    ("dirichlet:0.1", "DFedAvg", "44"): (400.0, 74.0),
    ("dirichlet:0.1", "Ours", "43"): (10.0, 95.0),
}


def fair_name(part, method, seed):
    return f"{seed}_{'diri' if part != 'iid' else 'iid'}_{method.lower()}"


def make_fairness(root, spec=FAIR_SPEC, seeds=("43", "44")):
    points = []
    for seed in seeds:
        for part in FAIR_AXES["data.partition"]:
            for method in FAIR_AXES["method"]:
                name = fair_name(part, method, seed)
                points.append(({"seed": seed, "data.partition": part, "method": method}, name))
                if (part, method, seed) in FAIR_RUNS:
                    var, acc = FAIR_RUNS[part, method, seed]
                    write_run(root, name, {"accuracy_variance": var, "honest_mean_accuracy": acc})
                else:
                    (root / "runs" / name / "peers").mkdir(parents=True)  # started, then interrupted
    write_sweep(root, spec, {**FAIR_AXES, "seed": list(seeds)}, points)
    return root


BYZ_AXES = {
    "seed": ["43", "44"],
    "attack.name": ["gaussian", "sign_flip"],
    "data.partition": ["iid", "dirichlet:0.1"],
    "method": ["No-AT", "Median", "Ours"],
}


BYZ_SPEC = {
    "kind": "byzantine",
    "rows": ["attack.name", "data.partition"],
    "columns": "method",
    "unranked": ["No-AT"],
    "row_labels": {"gaussian": "GA", "sign_flip": "S-F", "iid": "IID", "dirichlet:0.1": "Diri(0.1)"},
    "axis_labels": {"attack.name": "Attack", "data.partition": "DH"},
}


# global accuracy per (attack, partition, method) for seeds 43, 44; None: never started.
# No-AT does not depend on the attack: both attack rows share its runs.
BYZ_ACC = {
    ("iid", "No-AT"): (81.0, 83.0),
    ("dirichlet:0.1", "No-AT"): (70.0, 72.0),
    ("gaussian", "iid", "Median"): (80.0, 81.0),
    ("gaussian", "iid", "Ours"): (80.25, 80.75),
    ("gaussian", "dirichlet:0.1", "Median"): (50.0, 54.0),
    ("gaussian", "dirichlet:0.1", "Ours"): (66.0, None),
    ("sign_flip", "iid", "Median"): (60.0, 70.0),
    ("sign_flip", "iid", "Ours"): (82.5, 83.5),
}


SHORT = {"gaussian": "ga", "sign_flip": "sf", "iid": "iid", "dirichlet:0.1": "diri"}


def byz_peers(acc, byzantine):
    peers = {
        "0": {"role": "honest", "accuracy": acc, "global_accuracy": acc - 1},
        "1": {"role": "honest", "accuracy": acc, "global_accuracy": acc + 1},
    }
    if byzantine:
        peers["2"] = {"role": "byzantine", "accuracy": None, "global_accuracy": None}
    return peers


def byz_rounds(acc):
    # client 0 gives the Byzantine client 2 some weight in round 0 only; eval at rounds 1 and 3
    return {
        0: [
            {"round": 0, "weights": {"0": 0.5, "2": 0.5}},
            {"round": 1, "weights": {"0": 1.0}, "global_accuracy": acc - 11, "accuracy": 0.0},
            {"round": 2, "weights": {"0": 0.5, "1": 0.5}},
            {"round": 3, "weights": {"0": 1.0}, "global_accuracy": acc - 1},
        ],
        1: [
            {"round": 0, "weights": {"1": 1.0}},
            {"round": 1, "weights": {"1": 1.0}, "global_accuracy": acc - 9},
            {"round": 2, "weights": {"1": 1.0}},
            {"round": 3, "weights": {"1": 1.0}, "global_accuracy": acc + 1},
        ],
    }


def make_byzantine(root, spec=BYZ_SPEC):
    points = []
    for s, seed in enumerate(("43", "44")):
        for attack in BYZ_AXES["attack.name"]:
            for part in BYZ_AXES["data.partition"]:
                if (attack, part) == ("sign_flip", "dirichlet:0.1"):
                    continue  # not in this grid
                for method in BYZ_AXES["method"]:
                    if method == "No-AT":
                        name = f"{seed}_{SHORT[part]}_noat"
                        acc = BYZ_ACC[part, method][s]
                    else:
                        name = f"{seed}_{SHORT[attack]}_{SHORT[part]}_{method.lower()}"
                        acc = BYZ_ACC[attack, part, method][s]
                    points.append(({"seed": seed, "attack.name": attack, "data.partition": part, "method": method}, name))
                    if acc is not None and not (root / "runs" / name).exists():
                        byzantine = method != "No-AT"
                        write_run(root, name, {"honest_mean_global_accuracy": acc, "global_accuracy_variance": 1.0},
                                  byz_peers(acc, byzantine), byz_rounds(acc))
    write_sweep(root, spec, BYZ_AXES, points)
    return root
