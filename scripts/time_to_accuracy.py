"""Time and bytes to an accuracy, per cell of an exported sweep: for each combination of its
variants (seeds apart), the honest mean accuracy, simulated (or wall) seconds and MB sent over
the run, and, per seed, the seconds and MB until the honest mean first reached ``--target`` %
(read from each run's ``record.json`` curves: the mean honest client at each evaluation).

    python scripts/time_to_accuracy.py docs/results/data/study_network_costs --target 65

Prints a Markdown table; a run that never reached the target shows ``—``. Reads only the
exported folder (``sweep.json``, each run's ``summary.json`` and ``record.json``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def first_reached(record: dict, target: float) -> tuple[float, float] | None:
    """(seconds, bytes) at the first evaluation whose honest mean accuracy is at least ``target``."""
    curves = record.get("curves", {})
    seconds, sent = dict(map(tuple, curves.get("seconds", []))), dict(map(tuple, curves.get("bytes_sent", [])))
    for r, accuracy in curves.get("accuracy", []):
        if accuracy >= target and r in seconds:
            return seconds[r], sent.get(r, float("nan"))
    return None


def rows(folder: Path, target: float) -> tuple[list[str], list[list[str]]]:
    sweep = json.loads((folder / "sweep.json").read_text())
    axes = [a for a in sweep["axes"] if a != "seed"]
    cells: dict[tuple[str, ...], list[tuple[dict, dict]]] = {}
    for point in sweep["points"]:
        run = folder / point["run"]
        summary = json.loads((run / "summary.json").read_text())
        record = json.loads((run / "record.json").read_text())
        cells.setdefault(tuple(point["labels"][a] for a in axes), []).append((summary, record))
    out = []
    for labels, runs in cells.items():
        def mean(key: str, scale: float = 1.0) -> str:
            values = [s[key] for s, _ in runs if s.get(key) is not None]
            return f"{sum(values) / len(values) / scale:.2f}" if values else "—"

        reached = [first_reached(r, target) for _, r in runs]
        out.append([
            *labels, mean("honest_mean_accuracy"), mean("honest_mean_seconds"), mean("honest_mean_bytes_sent", 1e6),
            " / ".join("—" if x is None else f"{x[0]:.1f}" for x in reached),
            " / ".join("—" if x is None else f"{x[1] / 1e6:.2f}" for x in reached),
        ])
    head = [*axes, "accuracy %", "seconds", "MB sent", f"seconds to {target:g} %", f"MB to {target:g} %"]
    return head, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="an exported sweep (dfedrw export)")
    parser.add_argument("--target", type=float, default=65.0, help="the accuracy (%%) to reach (default 65)")
    args = parser.parse_args(argv)
    if not (args.folder / "sweep.json").is_file():
        print(f"error: {args.folder} holds no sweep.json (an exported sweep: dfedrw export)", file=sys.stderr)
        return 2
    head, body = rows(args.folder, args.target)
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in body:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
