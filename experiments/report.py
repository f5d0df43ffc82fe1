"""``dfedrw report``: the paper's tables, and the studies' own, from one or more sweep folders.

The layout comes from the grid's ``[report]`` table (recorded in ``sweep.json``)::

    [report]
    kind = "fairness"                 # or "byzantine", "robustness", "tpm_pairs", "backdoor"
    metric = "honest_mean_accuracy"   # summary key the cells use (default for every other kind:
                                      # honest_mean_global_accuracy)
    rows = ["data.partition"]         # axes forming the rows, in this order
    columns = "method"                # the axis forming the columns (grid order)
    unranked = ["No-AT"]              # optional: columns (robustness: defences) never bolded or ranked
    tolerance = 3.0                   # optional: accuracy gap (points) listed in comparison.md;
                                      # backdoor: the clean accuracy a defence may lose against
                                      # the reference and still be ranked
    reference = "No-AT"               # optional, byzantine: comparison.md also gives each cell less
                                      # this column's, ours and the paper's; robustness, backdoor: the
                                      # defence each worst case is compared with
    equal_rows = ["iid"]              # tpm_pairs only (this default): the rows where the claim is
                                      # "about equal"
    [report.row_labels]               # optional pretty names of row values (also column_labels, axis_labels)
    "dirichlet:0.1" = "Diri(0.1)"
    [report.paper]                    # optional, fairness and byzantine: "ROW|COLUMN" -> paper value,
    "IID|DFedAvg" = 1.455             # with pretty labels; several row axes join with "|": "GA|IID|Median"
    "Diri(0.1)|DFedAvg" = [360.772, 76.972]   # fairness may give [variance, accuracy]

The kinds:

- ``fairness``: a cell is ``VAR (ACC)``: the population variance of the honest clients'
  accuracy (%^2) and their mean accuracy (%), each averaged over seeds. When the runs give both
  accuracies, a second table gives the other one (the global accuracy beside the local) as
  ``ACC ± STD``, cells.csv gains its columns and ``plots/local_vs_global.png`` puts one against
  the other: what the fairness rule gains on each client's own data and what it costs on all.
- ``byzantine``: a cell is ``ACC ± STD``: the mean over seeds and the population standard
  deviation over seeds (ddof=0).
- ``robustness`` (:mod:`experiments.robustness`): ``rows = [GROUP..., DEFENCE]``, ``columns =
  ATTACK``; per group a table of ``ACC ± STD`` cells with each defence's worst case over the
  attacks, a table of Byzantine weight shares and a ranking by worst case; then the worst case
  over every group. Also ``worst_case.csv``.
- ``backdoor`` (:mod:`experiments.backdoor`): laid out as ``robustness``; a cell is ``CLEAN /
  PEAK → END``: the clean accuracy, the highest honest mean attack success rate over the
  evaluated rounds and the one at the last round (after ``attack.stop``: how long the backdoor
  lasted); defences ranked by their highest success over the attacks; also ``worst_case.csv``
  and ``plots/success_*.png``.
- ``tpm_pairs`` (:mod:`experiments.tpm_pairs`): ``columns`` has two values (two TPM-CRS pairs,
  the favoured one first); per row the two cells, their difference, the verdict (better when
  the difference of the means exceeds the larger std over seeds, else about equal) and whether
  the claim holds (about equal on ``equal_rows``, the first better elsewhere); ``plots/pairs.png``
  draws it as grouped bars (the paper's Figure 3).

The ``seed`` axis is always averaged over; any other axis with several values must be a row or
the column.

Outputs (byte-identical when run again on the same results): ``table.md``, ``table.csv`` (the
paper's layout), ``cells.csv`` (one line per cell, full precision), ``comparison.md`` (with
``[report.paper]``), ``worst_case.csv`` (robustness) and ``plots/*.png``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dfedrw.experiments.formatting import MAX_NOT_STARTED_LISTED as MAX_NOT_STARTED_LISTED  # re-exported
from dfedrw.experiments.formatting import MISSING, NOT_IN_GRID, accuracy_cell, missing_lines, seed_note
from dfedrw.experiments.formatting import cells_csv
from dfedrw.experiments.formatting import csv_text as _csv
from dfedrw.experiments.formatting import fmt as _fmt
from dfedrw.experiments.formatting import md_escape as _md_escape
from dfedrw.experiments.formatting import signed as _signed
from dfedrw.experiments.record import read_summary, read_sweep
from dfedrw.experiments.report_spec import ReportError as ReportError  # re-exported
from dfedrw.experiments.report_spec import SEED_AXIS, normalize_report_spec
from dfedrw.experiments.table import METRICS, Cell, Missing, RunResult, Table

# Files only some reports write; an earlier report's copy is removed when this one has none.
OPTIONAL_FILES = ("comparison.md", "worst_case.csv")

# ---------------------------------------------------------------------------------------------
# Reading results


def load_results(dirs: Sequence[str | Path]) -> Table:
    """Read the sweep folders (merged; they must share one report spec) into a :class:`Table`."""
    if not dirs:
        raise ReportError("give at least one sweep folder")
    axes: dict[str, list[str]] = {}
    spec: dict[str, Any] | None = None
    first: Path | None = None
    points: list[tuple[dict[str, str], Path]] = []
    for d in map(Path, dirs):
        record = read_sweep(d)
        if record.get("report") is None:
            raise ReportError(f"{d}: its grid has no [report] table and no axis to form the columns; add [report]")
        if spec is None:
            spec, first = record["report"], d
        elif record["report"] != spec:
            diff = sorted(k for k in set(spec) | set(record["report"]) if spec.get(k) != record["report"].get(k))
            raise ReportError(
                f"{d}: its report spec differs from {first}'s (keys: {', '.join(diff)}); merge only sweeps with the same [report]"
            )
        for name, labels in record.get("axes", {}).items():
            merged = axes.setdefault(name, [])
            merged.extend(label for label in labels if label not in merged)
        for p in record.get("points", []):
            points.append((dict(p["labels"]), d / p["run"]))
    assert spec is not None
    spec = normalize_report_spec(spec, axes)
    for labels, _ in points:
        for a in [*spec["rows"], spec["columns"]]:
            if a not in labels:
                raise ReportError(f"a point has no label for axis '{a}': {labels}")

    summaries: dict[str, tuple[dict[str, Any] | None, str]] = {}
    cells: dict[tuple[tuple[str, ...], str], Cell] = {}
    missing: dict[str, Missing] = {}
    seen_in_cell: set[tuple[tuple[str, ...], str, str]] = set()
    metric = spec["metric"]
    for labels, folder in points:
        name = folder.name
        if name not in summaries:
            summaries[name] = read_summary(folder)
        summary, state = summaries[name]
        if summary is not None and summary.get(metric) is None:
            summary, state = None, f"no {metric} (every honest client failed)"
        row = tuple(labels[a] for a in spec["rows"])
        column = labels[spec["columns"]]
        cell = cells.setdefault((row, column), Cell(row, column))
        desc = ", ".join(f"{k}={v}" for k, v in labels.items())
        if summary is None:
            missing.setdefault(name, Missing(f"runs/{name}", state, [])).points.append(desc)
            continue
        # Several points (or merged sweeps) may name the same run; it counts once per cell.
        if (row, column, name) in seen_in_cell:
            continue
        seen_in_cell.add((row, column, name))
        cell.runs.append(RunResult(name, folder, labels.get(SEED_AXIS), summary))

    seeds = axes.get(SEED_AXIS, [])
    order = {s: i for i, s in enumerate(seeds)}
    for cell in cells.values():
        cell.runs.sort(key=lambda r: (order.get(r.seed, len(order)), r.name))

    def product(names: list[str]) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = [()]
        for a in names:
            out = [(*t, v) for t in out for v in axes[a]]
        return out

    present_rows = {r for r, _ in cells}
    present_cols = {c for _, c in cells}
    rows = [r for r in product(spec["rows"]) if r in present_rows]
    columns = [c for c in axes[spec["columns"]] if c in present_cols]
    return Table(spec, axes, rows, columns, cells, seeds, sorted(missing.values(), key=lambda m: m.run))


# ---------------------------------------------------------------------------------------------
# Formatting


def _best_columns(table: Table, row: tuple[str, ...]) -> set[str]:
    """Columns holding the best value of a row, compared as displayed (ties all count)."""
    unranked = set(table.spec["unranked"])
    scored = {}
    for c in table.columns:
        cell = table.cells.get((row, c))
        if cell is None or not cell.n or c in unranked or table.column_label(c) in unranked:
            continue
        if table.kind == "fairness":
            scored[c] = float(_fmt(cell.mean(table.variance_key), 3))
        else:
            scored[c] = -float(_fmt(cell.mean(table.metric), 2))
    if not scored:
        return set()
    best = min(scored.values())
    return {c for c, v in scored.items() if v == best}


def cell_text(table: Table, row: tuple[str, ...], column: str, *, bold: bool = False) -> str:
    """One cell as the paper prints it; ``[n=k]`` marks a cell with fewer seeds than the most."""
    if table.kind != "fairness":
        return accuracy_cell(table, row, column, bold=bold)
    cell = table.cells.get((row, column))
    if cell is None:
        return NOT_IN_GRID
    if not cell.n:
        return MISSING
    head, tail = _fmt(cell.mean(table.variance_key), 3), f" ({_fmt(cell.mean(table.metric), 3)})"
    if bold:
        head = f"**{head}**"
    flag = f" [n={cell.n}]" if cell.n < table.n_max() else ""
    return head + tail + flag


def _row_cells(table: Table, row: tuple[str, ...], *, markdown: bool) -> list[str]:
    best = _best_columns(table, row) if markdown else set()
    return [cell_text(table, row, c, bold=c in best) for c in table.columns]


def _description(table: Table) -> str:
    unranked = table.spec["unranked"]
    excluding = f" (excluding {', '.join(unranked)})" if unranked else ""
    if table.kind == "fairness":
        return (
            f"Cell: VAR (ACC): the population variance over honest clients of their final test accuracy (%², "
            f"`{table.variance_key}`) and, in brackets, their mean accuracy (%, `{table.metric}`), each averaged "
            f"over seeds. **Bold**: the lowest variance in the row{excluding}."
        )
    return (
        f"Cell: ACC ± STD: the mean over seeds of `{table.metric}` (%) and its standard deviation over seeds "
        f"(population, ddof=0). **Bold**: the highest accuracy in the row{excluding}."
    )


def render_markdown(table: Table) -> str:
    """``table.md``: the table in the paper's layout, its legend, seed counts and missing runs."""
    title = "Client fairness" if table.kind == "fairness" else "Byzantine robustness"
    header = [*table.row_headers(), *(table.column_label(c) for c in table.columns)]
    lines = [f"# {title}", "", _description(table), ""]
    lines.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
    lines.append("|" + "|".join(["---"] * len(header)) + "|")
    previous: list[str] = []
    for row in table.rows:
        labels = table.row_label(row)
        # Like the paper's multirow: an outer row label is printed once per group.
        shown = []
        for i, label in enumerate(labels):
            same_group = i < len(labels) - 1 and labels[: i + 1] == previous[: i + 1]
            shown.append("" if same_group else label)
        previous = labels
        lines.append("| " + " | ".join(_md_escape(x) for x in [*shown, *_row_cells(table, row, markdown=True)]) + " |")
    lines += ["", seed_note(table)]
    if table.kind == "fairness" and table.every_cell_has(table.other_metric):
        lines += ["", *_other_accuracy_section(table)]
    if table.kind == "byzantine":
        lines.append("± is the population standard deviation over seeds (numpy ddof=0), not the sample one.")
    lines += missing_lines(table)
    return "\n".join(lines) + "\n"


def _other_accuracy_section(table: Table) -> list[str]:
    """Fairness: the same runs' other accuracy (global beside local), so that what the fairness
    rule gains on each client's own distribution shows beside what it costs on all classes."""
    key = table.other_metric
    what = (
        "each honest client's final model scored on the whole test set, every class alike, then averaged over the clients"
        if key == "honest_mean_global_accuracy"
        else "each honest client's final model scored on its own test set, drawn like its own data, then averaged over the clients"
    )
    title = "Global accuracy" if key == "honest_mean_global_accuracy" else "Local accuracy"
    header = [*table.row_headers(), *(table.column_label(c) for c in table.columns)]
    lines = [
        f"## {title} of the same runs",
        "",
        (
            f"Cell: ACC ± STD: the mean over seeds of `{key}` (%: {what}) and its standard deviation over seeds "
            "(population, ddof=0). No bold: the table above ranks by fairness; this one shows what the same models "
            "do on every class."
        ),
        "",
        "| " + " | ".join(_md_escape(h) for h in header) + " |",
        "|" + "|".join(["---"] * len(header)) + "|",
    ]
    for row in table.rows:
        cells = []
        for c in table.columns:
            cell = table.cells.get((row, c))
            if cell is None:
                cells.append(NOT_IN_GRID)
            elif not cell.n:
                cells.append(MISSING)
            else:
                flag = f" [n={cell.n}]" if cell.n < table.n_max() else ""
                cells.append(f"{_fmt(cell.mean(key), 2)} ± {_fmt(cell.std(key), 2)}{flag}")
        lines.append("| " + " | ".join(_md_escape(x) for x in [*table.row_label(row), *cells]) + " |")
    return lines


def render_csv(table: Table) -> str:
    """``table.csv``: the paper's layout with the same cell text as table.md, without bold."""
    out = [[*table.row_headers(), *(table.column_label(c) for c in table.columns)]]
    for row in table.rows:
        out.append([*table.row_label(row), *_row_cells(table, row, markdown=False)])
    return _csv(out)


def render_cells_csv(table: Table) -> str:
    """``cells.csv``: one line per cell with its seed count, means and stds (6 decimals)."""
    keys = [table.metric, table.variance_key]
    if table.kind == "fairness" and table.every_cell_has(table.other_metric):
        keys += [table.other_metric, METRICS[table.other_metric]]
    return cells_csv(table, keys)


def _paper_pair(table: Table, value: Any) -> tuple[float | None, float | None]:
    """(paper variance, paper accuracy) of a ``report.paper`` value."""
    if table.kind == "byzantine":
        return None, float(value)
    if isinstance(value, list):
        return float(value[0]), float(value[1])
    return float(value), None


def render_comparison(table: Table) -> str | None:
    """``comparison.md``: ours vs the paper per cell, the accuracy cells off by more than the
    tolerance, and (fairness) the rows whose method order by variance differs. None without
    ``report.paper``."""
    paper = table.spec["paper"]
    if not paper:
        return None
    tol = table.spec["tolerance"]
    # Byzantine tables may name a reference column (No-attack): each method's accuracy less the
    # reference's in the same row, ours and the paper's, so that an offset every method in a
    # row shares (e.g. from how the no-attack training itself differs) cancels out.
    reference = table.spec.get("reference")
    ref_label = table.column_label(reference) if reference is not None else None
    heads = [*table.row_headers(), "Method"]
    if table.kind == "fairness":
        heads += ["ours VAR", "paper VAR", "Δ VAR", "ours ACC", "paper ACC", "Δ ACC"]
    else:
        heads += ["ours ACC", "paper ACC", "Δ ACC"]
        if ref_label is not None:
            heads += [f"ours − {ref_label}", f"paper − {ref_label}"]
    intro = f"Ours: this sweep, averaged over seeds (`{table.metric}`); paper: `[report.paper]` of the grid. Δ = ours − paper."
    if ref_label is not None:
        intro += f" ours/paper − {ref_label}: the accuracy less that of {ref_label} in the same row."
    lines = [
        "# Comparison with the paper",
        "",
        intro,
        "",
        "| " + " | ".join(_md_escape(h) for h in heads) + " |",
        "|" + "|".join(["---"] * len(heads)) + "|",
    ]
    matched: set[str] = set()
    far: list[str] = []
    order_rows: list[str] = []
    for row in table.rows:
        ours_var: dict[str, float] = {}
        paper_var: dict[str, float] = {}
        for c in table.columns:
            key = table.cell_key(row, c)
            if key not in paper:
                continue
            matched.add(key)
            p_var, p_acc = _paper_pair(table, paper[key])
            cell = table.cells.get((row, c))
            has = cell is not None and cell.n > 0
            o_acc = cell.mean(table.metric) if has else None
            o_var = cell.mean(table.variance_key) if has and table.kind == "fairness" else None
            values: list[str] = []
            if table.kind == "fairness":
                values += _triple(o_var, p_var, 3)
                if o_var is not None and p_var is not None:
                    ours_var[c], paper_var[c] = float(_fmt(o_var, 3)), p_var
            values += _triple(o_acc, p_acc, 3 if table.kind == "fairness" else 2)
            if ref_label is not None:
                values += _drops(table, paper, row, c, o_acc, p_acc)
            lines.append("| " + " | ".join(_md_escape(x) for x in [*table.row_label(row), table.column_label(c), *values]) + " |")
            if o_acc is not None and p_acc is not None and abs(o_acc - p_acc) > tol:
                place = " / ".join([*table.row_label(row), table.column_label(c)])
                far.append(
                    f"- {place}: ours {_fmt(o_acc, 2)}, paper {_fmt(p_acc, 2)} ({_signed(o_acc - p_acc, 2)})"
                )
        if table.kind == "fairness" and len(ours_var) >= 2:
            cols = list(ours_var)
            ours_order = sorted(cols, key=lambda c: (ours_var[c], cols.index(c)))
            paper_order = sorted(cols, key=lambda c: (paper_var[c], cols.index(c)))
            if ours_order != paper_order:
                order_rows.append(
                    f"- {' / '.join(table.row_label(row))}: ours "
                    + " < ".join(f"{table.column_label(c)} ({_fmt(ours_var[c], 3)})" for c in ours_order)
                    + "; paper "
                    + " < ".join(f"{table.column_label(c)} ({_fmt(paper_var[c], 3)})" for c in paper_order)
                )
    lines += ["", f"## Accuracy cells more than {_fmt(tol, 1)} points from the paper", ""]
    lines += far or ["None."]
    if table.kind == "fairness":
        lines += ["", "## Rows where the order of methods by variance differs from the paper", ""]
        lines += order_rows or ["None."]
    unmatched = sorted(set(paper) - matched)
    if unmatched:
        lines += ["", "## Paper values with no cell in this table (check the labels)", ""]
        lines += [f"- `{k}`" for k in unmatched]
    return "\n".join(lines) + "\n"


def _drops(table: Table, paper: Mapping[str, Any], row: tuple[str, ...], column: str,
           ours: float | None, theirs: float | None) -> list[str]:
    """[ours − reference, paper − reference] for one cell of the row (blank in the reference
    column itself and where either side is missing)."""
    reference = table.spec["reference"]
    if column == reference:
        return ["", ""]
    ref_cell = table.cells.get((row, reference))
    ref_ours = ref_cell.mean(table.metric) if ref_cell is not None and ref_cell.n > 0 else None
    ref_theirs = paper.get(f"{table.row_key(row)}|{table.column_label(reference)}")
    return [
        _signed(ours - ref_ours, 2) if ours is not None and ref_ours is not None else "",
        _signed(theirs - ref_theirs, 2) if theirs is not None and ref_theirs is not None else "",
    ]


def _triple(ours: float | None, paper: float | None, digits: int) -> list[str]:
    o = MISSING if ours is None else _fmt(ours, digits)
    p = "" if paper is None else _fmt(paper, digits)
    d = _signed(ours - paper, digits) if ours is not None and paper is not None else ""
    return [o, p, d]


def render_files(table: Table) -> dict[str, str]:
    """File name -> text of every table file of the report (its kind decides which)."""
    if table.kind == "robustness":
        from dfedrw.experiments import robustness

        return {
            "table.md": robustness.render_markdown(table),
            "table.csv": robustness.render_csv(table),
            "cells.csv": robustness.render_cells_csv(table),
            "worst_case.csv": robustness.render_worst_case_csv(table),
        }
    if table.kind == "backdoor":
        from dfedrw.experiments import backdoor

        return {
            "table.md": backdoor.render_markdown(table),
            "table.csv": backdoor.render_csv(table),
            "cells.csv": backdoor.render_cells_csv(table),
            "worst_case.csv": backdoor.render_worst_case_csv(table),
        }
    if table.kind == "tpm_pairs":
        from dfedrw.experiments import tpm_pairs

        return {
            "table.md": tpm_pairs.render_markdown(table),
            "table.csv": tpm_pairs.render_csv(table),
            "cells.csv": tpm_pairs.render_cells_csv(table),
        }
    files = {"table.md": render_markdown(table), "table.csv": render_csv(table), "cells.csv": render_cells_csv(table)}
    comparison = render_comparison(table)
    if comparison is not None:
        files["comparison.md"] = comparison
    return files


def write_report(dirs: Sequence[str | Path], out_dir: str | Path | None = None, *, plots: bool = True) -> list[Path]:
    """Write the kind's table files (table.md, table.csv, cells.csv, and comparison.md with
    paper values or worst_case.csv for robustness) and the plots to ``out_dir`` (default: the
    first folder's ``report/``); returns the files written. Files of an earlier report there
    that this one does not write (an optional table, a plot in ``plots/``) are removed."""
    table = load_results(dirs)
    if not any(cell.runs for cell in table.cells.values()):
        first = f"; the first, {table.missing[0].run}: {table.missing[0].state}" if table.missing else ""
        raise ReportError(
            f"{', '.join(map(str, dirs))}: no finished run to report ({len(table.missing)} runs not finished{first}); "
            "run or resume the sweep first (`dfedrw sweep GRID --out DIR`)"
        )
    out = Path(out_dir) if out_dir is not None else Path(dirs[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    files = render_files(table)
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
        written.append(out / name)
    for name in OPTIONAL_FILES:
        # Left from an earlier report with other settings, it would no longer match the table.
        if name not in files and (out / name).exists():
            (out / name).unlink()
    if plots:
        if table.kind == "robustness":
            from dfedrw.experiments.robustness import make_plots
        elif table.kind == "tpm_pairs":
            from dfedrw.experiments.tpm_pairs import make_plots
        elif table.kind == "backdoor":
            from dfedrw.experiments.backdoor import make_plots
        else:
            from dfedrw.experiments.plots import make_plots

        made = make_plots(table, out / "plots")
        written += made
        # An earlier report's plots that this one did not draw (other rows, so other numbers in
        # their names) would sit beside the new ones as if they were of this table.
        for stale in sorted(set((out / "plots").glob("*.png")) - set(made)):
            stale.unlink()
    return written
