"""Two reports' cells of one grid, side by side: is every cell of a rerun within the spread over
seeds of the committed one?

    python scripts/compare_cells.py docs/results/fairness_fmnist/cells.csv sweeps/report/cells.csv
    python scripts/compare_cells.py OLD/cells.csv NEW/cells.csv --metric honest_mean_global_accuracy

Reads the ``cells.csv`` that ``dfedrw report`` writes (one row per cell: the grid's row and
column labels, then ``<metric>_mean`` and ``<metric>_std`` over seeds, population std) and, for
every metric present in both (or the ones named), prints the cells whose means differ by more
than the committed cell's std over seeds, then per metric: how many cells are identical, within
that spread, and outside it. Exit status 1 when a cell is outside the spread or missing.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path


def read_cells(path: Path) -> tuple[list[str], dict[tuple[str, ...], dict[str, float]]]:
    """(label columns, {labels: {metric_mean/std column: value}})."""
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise SystemExit(f"{path}: no cells")
    columns = list(rows[0])
    numeric = [c for c in columns if c.endswith("_mean") or c.endswith("_std")]
    labels = [c for c in columns if c not in numeric and c != "seeds"]
    cells = {}
    for row in rows:
        cells[tuple(row[c] for c in labels)] = {c: float(row[c]) for c in numeric if row[c] not in ("", "nan", "None")}
    return labels, cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("committed", type=Path, help="the committed report's cells.csv")
    parser.add_argument("rerun", type=Path, help="the rerun's cells.csv")
    parser.add_argument("--metric", action="append", default=[], help="compare only this metric (repeatable)")
    args = parser.parse_args(argv)
    labels, old = read_cells(args.committed)
    labels_new, new = read_cells(args.rerun)
    if labels != labels_new:
        raise SystemExit(f"the two files label their cells differently: {labels} and {labels_new}")
    metrics = args.metric or sorted({c[: -len("_mean")] for v in old.values() for c in v if c.endswith("_mean")})
    bad = 0
    for metric in metrics:
        same = within = outside = missing = 0
        largest = 0.0
        for key, cell in old.items():
            mean, std = cell.get(f"{metric}_mean"), cell.get(f"{metric}_std", 0.0)
            if mean is None:
                continue
            other = new.get(key, {}).get(f"{metric}_mean")
            if other is None:
                missing += 1
                print(f"{metric}: {' | '.join(key)}: missing from the rerun")
                continue
            diff = abs(other - mean)
            largest = max(largest, diff)
            if diff == 0:
                same += 1
            elif diff <= std:
                within += 1
            else:
                outside += 1
                print(f"{metric}: {' | '.join(key)}: {mean:.3f} -> {other:.3f} (difference {diff:.3f}, std over seeds {std:.3f})")
        print(
            f"{metric}: {same + within + outside + missing} cells: {same} identical, {within} within the std over seeds, "
            f"{outside} outside, {missing} missing; largest difference {largest:.3f}"
        )
        bad += outside + missing
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
