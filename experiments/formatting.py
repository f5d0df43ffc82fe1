"""Number and table text shared by the report's renderers (:mod:`experiments.report`,
:mod:`experiments.robustness`, :mod:`experiments.tpm_pairs`)."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING

from dfedrw.experiments.record import NOT_STARTED

if TYPE_CHECKING:
    from dfedrw.experiments.table import Table

MISSING = "missing"
# A cell no point of the grid maps to (e.g. removed by [[exclude]]).
NOT_IN_GRID = "—"
MAX_NOT_STARTED_LISTED = 10


def fmt(x: float, digits: int) -> str:
    text = f"{x:.{digits}f}"
    # "-0.000" would differ from "0.000" only by rounding noise.
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def accuracy_cell(table: Table, row: tuple[str, ...], column: str, *, bold: bool = False) -> str:
    """An accuracy cell as the tables print it: ``mean ± std`` over seeds (2 decimals, the mean
    bold when asked), ``[n=k]`` where a cell has fewer seeds than the most."""
    cell = table.cells.get((row, column))
    if cell is None:
        return NOT_IN_GRID
    if not cell.n:
        return MISSING
    head = fmt(cell.mean(table.metric), 2)
    if bold:
        head = f"**{head}**"
    flag = f" [n={cell.n}]" if cell.n < table.n_max() else ""
    return f"{head} ± {fmt(cell.std(table.metric), 2)}{flag}"


def signed(x: float, digits: int) -> str:
    text = f"{x:+.{digits}f}"
    return "+" + text[1:] if float(text) == 0 else text


def share(x: float | None) -> str:
    """A Byzantine weight share (a fraction): ``n/a`` without Byzantine clients, ``0`` when they
    never got any weight, ``<0.001`` when they got some but less than shows in 3 decimals."""
    if x is None:
        return "n/a"
    if x == 0:
        return "0"
    text = fmt(x, 3)
    return "<0.001" if float(text) == 0 else text


def md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def md_row(cells: list[str]) -> str:
    return "| " + " | ".join(md_escape(c) for c in cells) + " |"


def md_header(cells: list[str]) -> list[str]:
    return [md_row(cells), "|" + "|".join(["---"] * len(cells)) + "|"]


def csv_text(rows: list[list[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows(rows)
    return buf.getvalue()


def seed_note(table: Table) -> str:
    n = table.n_max()
    seeds = f" ({'seed' if len(table.seeds) == 1 else 'seeds'} {', '.join(table.seeds)})" if table.seeds else ""
    short = sorted({c.n for c in table.cells.values() if c.n < n})
    if not short:
        return f"Each cell averages {n} seed{'s' if n != 1 else ''}{seeds}."
    return f"Cells average up to {n} seeds{seeds}; [n=k] marks a cell with only k finished runs."


def missing_lines(table: Table) -> list[str]:
    """The runs without a result, for the end of table.md (nothing when every run finished)."""
    if not table.missing:
        return []
    lines = ["", f"Missing results ({len(table.missing)} run{'s' if len(table.missing) != 1 else ''}):", ""]
    # Runs that started and left no result all need a look; of those not started yet (a
    # sweep in progress may have hundreds) the first few are enough.
    waiting = [m for m in table.missing if m.state == NOT_STARTED]
    shown = [m for m in table.missing if m.state != NOT_STARTED] + waiting[:MAX_NOT_STARTED_LISTED]
    for m in sorted(shown, key=lambda m: m.run):
        lines.append(f"- `{m.run}` ({m.state}): {'; '.join(m.points)}")
    if len(waiting) > MAX_NOT_STARTED_LISTED:
        lines.append(
            f"- and {len(waiting) - MAX_NOT_STARTED_LISTED} more runs not started "
            "(`dfedrw sweep GRID --out DIR --dry-run` lists every run and its state)"
        )
    return lines


def cells_csv(table: Table, keys: list[str], present: tuple[str, ...] = ()) -> str:
    """``cells.csv``: one line per cell with its seed count, the mean and std over seeds of each
    of ``keys`` (6 decimals), then of each of ``present`` over the runs that have it (blank where
    none has, e.g. the Byzantine share of a run without Byzantine clients)."""
    header = [*table.spec["rows"], table.spec["columns"], "seeds"]
    for k in [*keys, *present]:
        header += [f"{k}_mean", f"{k}_std"]
    out = [header]
    for row in table.rows:
        for c in table.columns:
            cell = table.cells.get((row, c))
            if cell is None:
                continue
            line = [*row, c, str(cell.n)]
            for k in keys:
                line += [fmt(cell.mean(k), 6), fmt(cell.std(k), 6)] if cell.n else ["", ""]
            for k in present:
                m, s = cell.mean_present(k), cell.std_present(k)
                line += ["" if m is None else fmt(m, 6), "" if s is None else fmt(s, 6)]
            out.append(line)
    return csv_text(out)
