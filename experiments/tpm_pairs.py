"""The two-pair report (``[report] kind = "tpm_pairs"``): two TPM-CRS pairs side by side, and
whether a claim about them holds on each row (the paper's Figure 3: the loss-based pair against
the accuracy-based one under three attacks on four heterogeneity rows).

Layout: ``columns`` is an axis of exactly two values, the pair the claim favours first; ``rows``
as for the other kinds (e.g. ``["attack.name", "data.partition"]``). A cell is the mean over seeds
of the metric (default ``honest_mean_global_accuracy``) ± its std over seeds (population).

The rule, per row: Δ = mean(first) − mean(second). The first pair is *better* when Δ is larger
than the larger of the two cells' standard deviations over seeds, the second is better when −Δ
is, and otherwise the two are *about equal* (with a single seed any difference decides). The
claim: about equal on the rows named by ``equal_rows`` (row values or their labels; default
``["iid"]``), the first pair better on every other row.

Files: ``table.md`` (the cells, Δ, the verdict, the claim and whether it holds; then a
summary), ``table.csv`` (the same without bold), ``cells.csv`` (one line per cell, full
precision, with the Byzantine weight share) and ``plots/``: ``pairs.png`` (grouped bars with the
std over seeds as error bars, a panel per value of the outer row axes, like the paper's figure)
and the per-row plots of the Byzantine table (accuracy per round, per-client accuracy, weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dfedrw.experiments.formatting import (
    accuracy_cell, cells_csv, csv_text, fmt, md_header, md_row, missing_lines, seed_note, signed,
)
from dfedrw.experiments.table import Table

SHARE_KEY = "byzantine_weight_share"
EQUAL = "about equal"


@dataclass(frozen=True)
class Verdict:
    diff: float  # mean(first) - mean(second), points
    spread: float  # the larger of the two stds over seeds
    outcome: str  # "<first> better", "<second> better" or "about equal"
    claim: str
    holds: bool


def pair(table: Table) -> tuple[str, str]:
    """(first, second): the columns axis' two values in grid order."""
    first, second = table.axes[table.spec["columns"]]
    return first, second


def claimed_equal(table: Table, row: tuple[str, ...]) -> bool:
    names = set(table.spec.get("equal_rows", []))
    return any(v in names for v in row) or any(label in names for label in table.row_label(row))


def verdict(table: Table, row: tuple[str, ...]) -> Verdict | None:
    """The row's verdict, or None while either cell has no result."""
    first, second = pair(table)
    a, b = table.cells.get((row, first)), table.cells.get((row, second))
    if a is None or b is None or not a.n or not b.n:
        return None
    diff = a.mean(table.metric) - b.mean(table.metric)
    spread = max(a.std(table.metric), b.std(table.metric))
    if diff > spread:
        outcome = f"{table.column_label(first)} better"
    elif -diff > spread:
        outcome = f"{table.column_label(second)} better"
    else:
        outcome = EQUAL
    claim = EQUAL if claimed_equal(table, row) else f"{table.column_label(first)} better"
    return Verdict(diff, spread, outcome, claim, outcome == claim)


def _line(table: Table, row: tuple[str, ...], *, markdown: bool) -> list[str]:
    first, second = pair(table)
    v = verdict(table, row)
    bold = {first: False, second: False}
    if markdown and v is not None and v.outcome != EQUAL:
        bold[first if v.diff > 0 else second] = True
    cells = [accuracy_cell(table, row, c, bold=bold[c]) for c in (first, second)]
    if v is None:
        return [*cells, "", "", "", EQUAL if claimed_equal(table, row) else f"{table.column_label(first)} better", ""]
    return [*cells, signed(v.diff, 2), fmt(v.spread, 2), v.outcome, v.claim, "yes" if v.holds else "no"]


def _heads(table: Table) -> list[str]:
    first, second = pair(table)
    return [
        *table.row_headers(), table.column_label(first), table.column_label(second),
        "Δ", "larger std", "verdict", "claim", "holds",
    ]


def render_markdown(table: Table) -> str:
    first, second = pair(table)
    one, two = table.column_label(first), table.column_label(second)
    equal = [table.spec["row_labels"].get(v, v) for v in table.spec.get("equal_rows", [])]
    where = f"on the rows of {' or '.join(equal)}" if equal else "on no row"
    lines = [
        f"# {one} against {two}",
        "",
        (
            f"Cell: ACC ± STD: the mean over seeds of `{table.metric}` (%) and its standard deviation over seeds "
            f"(population, ddof=0). Δ = {one} − {two} (points). Verdict: \"{one} better\" when Δ is larger than the "
            f"larger of the two standard deviations over seeds, \"{two} better\" when −Δ is, otherwise \"about equal\" "
            f"(**bold**: the better one). Claim: about equal {where}, {one} better on every other row."
        ),
        "",
    ]
    lines += md_header(_heads(table))
    previous: list[str] = []
    for row in table.rows:
        labels = table.row_label(row)
        shown = [
            "" if i < len(labels) - 1 and labels[: i + 1] == previous[: i + 1] else label
            for i, label in enumerate(labels)
        ]
        previous = labels
        lines.append(md_row([*shown, *_line(table, row, markdown=True)]))
    verdicts = [(row, v) for row in table.rows if (v := verdict(table, row)) is not None]
    held = [row for row, v in verdicts if v.holds]
    lines += ["", f"The claim holds on {len(held)} of {len(verdicts)} rows with results."]
    failed = [(row, v) for row, v in verdicts if not v.holds]
    if failed:
        lines += ["", "Rows where it does not:", ""]
        for row, v in failed:
            lines.append(
                f"- {' / '.join(table.row_label(row))}: {v.outcome} (Δ {signed(v.diff, 2)}, larger std {fmt(v.spread, 2)}); "
                f"claim: {v.claim}"
            )
    lines += ["", seed_note(table), "± is the population standard deviation over seeds (numpy ddof=0), not the sample one."]
    lines += missing_lines(table)
    return "\n".join(lines) + "\n"


def render_csv(table: Table) -> str:
    out = [_heads(table)]
    for row in table.rows:
        out.append([*table.row_label(row), *_line(table, row, markdown=False)])
    return csv_text(out)


def render_cells_csv(table: Table) -> str:
    """``cells.csv``: one line per cell, means and stds over seeds (6 decimals), and the Byzantine share."""
    return cells_csv(table, [table.metric, table.variance_key], (SHARE_KEY,))


def plot_pairs(table: Table, path: Path) -> Path:
    """Grouped bars: a panel per value of the outer row axes, a group per value of the last row
    axis, one bar per pair with the std over seeds; Δ and the verdict above each group."""
    import numpy as np

    from dfedrw.experiments.plots import new_figure, save_figure

    first, second = pair(table)
    panels: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    for row in table.rows:
        panels.setdefault(row[:-1], []).append(row)
    n = max(len(panels), 1)
    width_per_group = 1.05
    groups = max((len(rows) for rows in panels.values()), default=1)
    fig = new_figure(max(4.5, 1.2 + width_per_group * groups) * n, 4.6)
    axes = fig.subplots(1, n, squeeze=False, sharey=True)[0]
    colours = {first: "tab:blue", second: "tab:orange"}
    top = 0.0
    for ax, (outer, rows) in zip(axes, panels.items(), strict=False):
        x = np.arange(len(rows))
        for k, c in enumerate((first, second)):
            means, stds = [], []
            for row in rows:
                cell = table.cells.get((row, c))
                ok = cell is not None and cell.n
                means.append(cell.mean(table.metric) if ok else np.nan)
                stds.append(cell.std(table.metric) if ok else np.nan)
            top = max(top, float(np.nanmax(np.asarray(means) + np.asarray(stds))) if np.isfinite(means).any() else 0.0)
            ax.bar(x + (k - 0.5) * 0.38, means, 0.38, yerr=stds, capsize=3, color=colours[c],
                   label=table.column_label(c), error_kw={"elinewidth": 1.0})
        for i, row in enumerate(rows):
            v = verdict(table, row)
            if v is not None:
                mark = "" if v.holds else " ✗"
                ax.annotate(f"Δ {signed(v.diff, 1)}{mark}", (i, 1.0), xycoords=("data", "axes fraction"),
                            xytext=(0, -12), textcoords="offset points", ha="center", fontsize=8)
        ax.set_xticks(x, [table.row_label(r)[-1] for r in rows], fontsize="small")
        ax.set_title(" / ".join(table.spec["row_labels"].get(v, v) for v in outer) or "all", fontsize="medium", pad=14)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel(f"honest mean {'global' if table.metric.endswith('global_accuracy') else 'local'} accuracy (%)")
    for ax in axes:
        ax.set_ylim(0, min(100.0, top + 8.0) if top > 0 else 100.0)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncols=2, frameon=False, fontsize="small")
    one, two = table.column_label(first), table.column_label(second)
    fig.suptitle(f"Mean ± std over seeds; Δ = {one} − {two} (✗: the claim does not hold on that row)", fontsize="medium")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return save_figure(fig, path)


def make_plots(table: Table, out_dir: Path) -> list[Path]:
    from dfedrw.experiments.plots import make_plots as row_plots

    out_dir = Path(out_dir)
    return [plot_pairs(table, out_dir / "pairs.png"), *row_plots(table, out_dir)]
