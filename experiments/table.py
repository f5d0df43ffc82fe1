"""The results a report is made of: runs, the cells they fall into and the table of cells.

Shared by :mod:`experiments.report` (which reads and renders them) and :mod:`experiments.plots`
(which draws them), so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Summary accuracy key -> the summary key holding the variance of the same accuracy.
METRICS = {
    "honest_mean_accuracy": "accuracy_variance",
    "honest_mean_global_accuracy": "global_accuracy_variance",
}


def summary_value(summary: dict[str, Any], key: str) -> Any:
    """The value of ``key`` in a run's summary; a dotted key reads into a nested table
    (``attack_success.peak_mean``). None where any part is missing."""
    value: Any = summary
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


@dataclass
class RunResult:
    name: str
    folder: Path
    seed: str | None
    summary: dict[str, Any] | None
    record: dict[str, Any] | None = None  # experiments.record, read when a plot first needs it


@dataclass
class Cell:
    row: tuple[str, ...]
    column: str
    runs: list[RunResult] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.runs)

    def values(self, key: str) -> np.ndarray:
        return np.asarray([float(summary_value(r.summary, key)) for r in self.runs], dtype=float)

    def mean(self, key: str) -> float | None:
        return float(np.mean(self.values(key))) if self.runs else None

    def std(self, key: str) -> float | None:
        # Population std over seeds (ddof=0), as the footnote says.
        return float(np.std(self.values(key), ddof=0)) if self.runs else None

    def has(self, key: str) -> bool:
        """Whether every run of the cell (at least one) gives a value for ``key``."""
        return bool(self.runs) and all(summary_value(r.summary, key) is not None for r in self.runs)

    def mean_present(self, key: str) -> float | None:
        """The mean over the runs that give a value for ``key`` (e.g. ``byzantine_weight_share``,
        None in a run without Byzantine clients); None when no run does."""
        values = self._present(key)
        return float(np.mean(values)) if values else None

    def std_present(self, key: str) -> float | None:
        values = self._present(key)
        return float(np.std(values, ddof=0)) if values else None

    def _present(self, key: str) -> list[float]:
        return [float(v) for r in self.runs if (v := summary_value(r.summary, key)) is not None]


@dataclass
class Missing:
    run: str
    state: str
    points: list[str]


@dataclass
class Table:
    spec: dict[str, Any]
    axes: dict[str, list[str]]
    rows: list[tuple[str, ...]]
    columns: list[str]
    cells: dict[tuple[tuple[str, ...], str], Cell]
    seeds: list[str]
    missing: list[Missing]

    @property
    def kind(self) -> str:
        return self.spec["kind"]

    @property
    def metric(self) -> str:
        return self.spec["metric"]

    @property
    def variance_key(self) -> str:
        return METRICS[self.metric]

    @property
    def other_metric(self) -> str:
        """The accuracy the table's metric is not: global for local, local for global."""
        return next(m for m in METRICS if m != self.metric)

    def every_cell_has(self, key: str) -> bool:
        """Whether every run of every cell with results gives a value for ``key``."""
        filled = [c for c in self.cells.values() if c.n]
        return bool(filled) and all(c.has(key) for c in filled)

    def row_label(self, row: tuple[str, ...]) -> list[str]:
        if not row:
            return ["all"]
        return [self.spec["row_labels"].get(v, v) for v in row]

    def row_key(self, row: tuple[str, ...]) -> str:
        return "|".join(self.row_label(row))

    def column_label(self, column: str) -> str:
        return self.spec["column_labels"].get(column, column)

    def cell_key(self, row: tuple[str, ...], column: str) -> str:
        """The cell's key in ``[report.paper]``: "ROW|COLUMN", in labels."""
        return f"{self.row_key(row)}|{self.column_label(column)}"

    def row_headers(self) -> list[str]:
        return [self.spec["axis_labels"].get(a, a) for a in self.spec["rows"]] or [""]

    def n_max(self) -> int:
        return max((c.n for c in self.cells.values()), default=0)
