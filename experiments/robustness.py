"""The robustness report (``[report] kind = "robustness"``): every defence against every attack.

Layout: ``rows = [GROUP..., DEFENCE]`` (e.g. ``["data.partition", "method"]``), ``columns =
ATTACK``. Each value of the group axes gets its own table, a row per defence and a column per
attack. A cell is the mean over seeds of the table's metric (default
``honest_mean_global_accuracy``) ± its std over seeds, and separately the mean over seeds of the
Byzantine weight share (``byzantine_weight_share``: the weight honest clients gave Byzantine
senders over the run; ``n/a`` where a run has no Byzantine clients, such as a No-attack row).

A defence's *worst case* is its lowest cell over the attacks: it is ranked by the attack that
hurts it most, as ByzFL ranks aggregators, since a deployment does not choose its attacker.
Ties count as displayed (2 decimals). ``unranked`` defences (a No-attack baseline) are shown but
not ranked; ``reference`` names the defence every worst case is compared with (its loss against
No-attack). A last table takes the worst case over every group as well.

Files: ``table.md`` (the tables and rankings), ``table.csv`` (the accuracy tables, with the worst
case), ``cells.csv`` (one line per cell, full precision, with the weight share),
``worst_case.csv`` (per group and overall: rank, worst case, the attack behind it) and
``plots/``: a heatmap of each group's table and each defence's accuracy per round under each
attack.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dfedrw.experiments.formatting import (
    accuracy_cell,
    cells_csv,
    MISSING, NOT_IN_GRID, csv_text, fmt, md_header, md_row, missing_lines, seed_note, share, signed,
)
from dfedrw.experiments.table import Table

SHARE_KEY = "byzantine_weight_share"
ALL = "all"


@dataclass(frozen=True)
class Worst:
    value: float
    column: str  # the attack behind it
    attacks: int  # how many attacks have a result for this defence
    of: int  # how many attacks the table has
    same_runs: bool = False  # every attack's cell holds the same runs (a No-attack row)


def groups(table: Table) -> list[tuple[tuple[str, ...], list[tuple[str, ...]]]]:
    """(group values, its rows) in table order; the group is every row axis but the last."""
    out: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    for row in table.rows:
        out.setdefault(row[:-1], []).append(row)
    return list(out.items())


def worst_case(table: Table, row: tuple[str, ...]) -> Worst | None:
    """The row's lowest cell mean over the attacks (the first attack in grid order on a tie)."""
    present = [c for c in table.columns if (cell := table.cells.get((row, c))) is not None and cell.n]
    if not present:
        return None
    same = len({tuple(r.name for r in table.cells[row, c].runs) for c in present}) == 1 and len(present) > 1
    low = min(present, key=lambda c: table.cells[row, c].mean(table.metric))
    return Worst(table.cells[row, low].mean(table.metric), low, len(present), len(table.columns), same)


def _ranked(table: Table, row: tuple[str, ...]) -> bool:
    unranked = set(table.spec["unranked"])
    defence = row[-1]
    return defence not in unranked and table.row_label(row)[-1] not in unranked


def ranking(table: Table, rows: list[tuple[str, ...]]) -> list[tuple[int, tuple[str, ...], Worst]]:
    """(rank, row, worst case) of the ranked rows with a result, best worst case first; rows
    whose worst cases print alike share a rank."""
    scored = [(row, w) for row in rows if _ranked(table, row) and (w := worst_case(table, row)) is not None]
    scored.sort(key=lambda rw: -float(fmt(rw[1].value, 2)))
    out = []
    for i, (row, w) in enumerate(scored):
        same = i > 0 and fmt(w.value, 2) == fmt(scored[i - 1][1].value, 2)
        out.append((out[-1][0] if same else i + 1, row, w))
    return out


def overall(table: Table) -> list[tuple[str, dict[tuple[str, ...], Worst], Worst | None]]:
    """Per defence (in table order): its worst case in each group and the lowest of those."""
    defences: dict[str, dict[tuple[str, ...], Worst]] = {}
    for group, rows in groups(table):
        for row in rows:
            w = worst_case(table, row)
            per = defences.setdefault(row[-1], {})
            if w is not None:
                per[group] = w
    out = []
    for defence, per in defences.items():
        low = min(per.values(), key=lambda w: w.value) if per else None
        out.append((defence, per, low))
    return out


# ---------------------------------------------------------------------------------------------
# Text


def share_cell(table: Table, row: tuple[str, ...], column: str) -> str:
    cell = table.cells.get((row, column))
    if cell is None:
        return NOT_IN_GRID
    if not cell.n:
        return MISSING
    return share(cell.mean_present(SHARE_KEY))


def _worst_text(table: Table, w: Worst | None, *, bold: bool = False) -> str:
    if w is None:
        return MISSING
    head = fmt(w.value, 2)
    if bold:
        head = f"**{head}**"
    partial = f" [{w.attacks} of {w.of} attacks]" if w.attacks < w.of else ""
    # A No-attack row is the same runs under every attack: no attack to name.
    attack = "" if w.same_runs else f" ({table.column_label(w.column)})"
    return f"{head}{attack}{partial}"


def _best_per_column(table: Table, rows: list[tuple[str, ...]]) -> set[tuple[tuple[str, ...], str]]:
    """The (row, attack) cells holding the highest mean of their attack's column among the
    ranked defences, compared as displayed (ties all count)."""
    best = set()
    for c in table.columns:
        scored = {}
        for row in rows:
            cell = table.cells.get((row, c))
            if cell is not None and cell.n and _ranked(table, row):
                scored[row] = float(fmt(cell.mean(table.metric), 2))
        if scored:
            top = max(scored.values())
            best |= {(row, c) for row, v in scored.items() if v == top}
    return best


def group_title(table: Table, group: tuple[str, ...]) -> str:
    if not group:
        return ""
    labels = [table.spec["row_labels"].get(v, v) for v in group]
    heads = [table.spec["axis_labels"].get(a, a) for a in table.spec["rows"][:-1]]
    return ", ".join(f"{h}: {v}" for h, v in zip(heads, labels, strict=True))


def _reference_rows(table: Table) -> dict[tuple[str, ...], Worst]:
    reference = table.spec.get("reference")
    if reference is None:
        return {}
    out = {}
    for group, rows in groups(table):
        for row in rows:
            if row[-1] == reference and (w := worst_case(table, row)) is not None:
                out[group] = w
    return out


def _ranking_lines(table: Table, group: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    ref = _reference_rows(table).get(group)
    ref_label = table.row_label((*group, table.spec["reference"]))[-1] if table.spec.get("reference") else None
    lines = []
    for rank, row, w in ranking(table, rows):
        against = f"; {signed(w.value - ref.value, 2)} against {ref_label}" if ref is not None else ""
        lines.append(f"{rank}. {table.row_label(row)[-1]}: {_worst_text(table, w)}{against}")
    return lines or ["No defence has a result yet."]


def _description(table: Table) -> str:
    unranked = table.spec["unranked"]
    excluding = f" (excluding {', '.join(unranked)})" if unranked else ""
    return (
        f"Cell: ACC ± STD: the mean over seeds of `{table.metric}` (%) and its standard deviation over seeds "
        f"(population, ddof=0). **Bold**: the highest accuracy under each attack{excluding}, and the best worst case. "
        "Worst case: the defence's lowest cell over the attacks, with the attack that gives it; defences are ranked "
        "by it (a defence is as good as the attack that hurts it most)."
    )


SHARE_NOTE = (
    "Byzantine weight share, the second table of each section: `byzantine_weight_share`, the weight honest clients "
    "gave Byzantine senders over the whole run, mean over seeds (0: never any; <0.001: some, below what 3 decimals "
    "show; n/a: no Byzantine clients). A clipping rule (ClippedGossip, CenteredClipping) can give a Byzantine "
    "model a small share and still move by the full clipping radius toward it every round."
)


def render_markdown(table: Table) -> str:
    lines = ["# Robustness: each defence against each attack", "", _description(table), "", SHARE_NOTE, ""]
    defence_head = table.row_headers()[-1]
    attack_heads = [table.column_label(c) for c in table.columns]
    for group, rows in groups(table):
        title = group_title(table, group)
        if title:
            lines += [f"## {title}", ""]
        best = _best_per_column(table, rows)
        ranks = ranking(table, rows)
        top = ranks[0][2].value if ranks else None
        lines += md_header([defence_head, *attack_heads, "Worst case"])
        for row in rows:
            w = worst_case(table, row)
            bold_worst = w is not None and top is not None and _ranked(table, row) and fmt(w.value, 2) == fmt(top, 2)
            cells = [accuracy_cell(table, row, c, bold=(row, c) in best) for c in table.columns]
            lines.append(md_row([table.row_label(row)[-1], *cells, _worst_text(table, w, bold=bold_worst)]))
        lines += ["", "Byzantine weight share:", ""]
        lines += md_header([defence_head, *attack_heads])
        for row in rows:
            lines.append(md_row([table.row_label(row)[-1], *(share_cell(table, row, c) for c in table.columns)]))
        unranked = table.spec["unranked"]
        lines += ["", f"Ranking by worst case{' (' + ', '.join(unranked) + ' not ranked)' if unranked else ''}:", ""]
        lines += [*_ranking_lines(table, group, rows), ""]
    if len(groups(table)) > 1:
        lines += _overall_lines(table, defence_head)
    lines += [seed_note(table), "± is the population standard deviation over seeds (numpy ddof=0), not the sample one."]
    lines += missing_lines(table)
    return "\n".join(lines) + "\n"


def group_label(table: Table, group: tuple[str, ...]) -> str:
    return " / ".join(table.spec["row_labels"].get(v, v) for v in group) or ALL


def _overall_ranks(table: Table) -> dict[str, int]:
    """Rank of each ranked defence by its lowest worst case over the groups (ties share)."""
    scored = [(d, low) for d, _, low in overall(table) if low is not None and _ranked(table, (d,))]
    scored.sort(key=lambda t: -float(fmt(t[1].value, 2)))
    ranks: dict[str, int] = {}
    for i, (d, low) in enumerate(scored):
        same = i > 0 and fmt(low.value, 2) == fmt(scored[i - 1][1].value, 2)
        ranks[d] = ranks[scored[i - 1][0]] if same else i + 1
    return ranks


def _overall_lines(table: Table, defence_head: str) -> list[str]:
    group_list = [g for g, _ in groups(table)]
    ranks = _overall_ranks(table)
    rows = overall(table)
    # Ranked defences first, best first; then the others in table order.
    rows.sort(key=lambda t: (t[0] not in ranks, ranks.get(t[0], 0)))
    heads = " / ".join(table.spec["axis_labels"].get(a, a) for a in table.spec["rows"][:-1])
    lines = [
        f"## Worst case over every attack and every {heads}",
        "",
        (
            f"Each {heads} column: the worst case there, as above; overall: the lowest of them, with its attack "
            f"and {heads}. Ranked by the overall worst case."
        ),
        "",
    ]
    lines += md_header(["Rank", defence_head, *(group_label(table, g) for g in group_list), "Overall"])
    for d, per, low in rows:
        overall_text = MISSING
        if low is not None:
            where = next(g for g, w in per.items() if w is low)
            attack = "" if low.same_runs else f"{table.column_label(low.column)}, "
            overall_text = f"{fmt(low.value, 2)} ({attack}{group_label(table, where)})"
        cells = [_worst_text(table, per.get(g)) for g in group_list]
        lines.append(md_row([str(ranks.get(d, "")), table.spec["row_labels"].get(d, d), *cells, overall_text]))
    return [*lines, ""]


def render_csv(table: Table) -> str:
    """``table.csv``: each group's accuracy table (cell text as in table.md, without bold)."""
    heads = table.row_headers()
    out = [[*heads, *(table.column_label(c) for c in table.columns), "Worst case"]]
    for _, rows in groups(table):
        for row in rows:
            cells = [accuracy_cell(table, row, c) for c in table.columns]
            out.append([*table.row_label(row), *cells, _worst_text(table, worst_case(table, row))])
    return csv_text(out)


def render_cells_csv(table: Table) -> str:
    """``cells.csv``: one line per cell, means and stds over seeds (6 decimals), and the Byzantine share."""
    return cells_csv(table, [table.metric, table.variance_key], (SHARE_KEY,))


def render_worst_case_csv(table: Table) -> str:
    """``worst_case.csv``: per group, then overall (group ``all``): each defence's worst case,
    the attack behind it (blank where every attack's cell is the same runs, a No-attack row),
    how many attacks it covers, and its rank (blank: not ranked)."""
    group_axes = table.spec["rows"][:-1]
    out = [[*group_axes, table.spec["rows"][-1], "rank", "worst_case", "attack", "attacks", "of"]]
    for group, rows in groups(table):
        ranks = {row: rank for rank, row, _ in ranking(table, rows)}
        for row in rows:
            w = worst_case(table, row)
            if w is None:
                continue
            rank = str(ranks[row]) if row in ranks else ""
            attack = "" if w.same_runs else w.column
            out.append([*group, row[-1], rank, fmt(w.value, 6), attack, str(w.attacks), str(w.of)])
    if group_axes and len(groups(table)) > 1:
        ranks = _overall_ranks(table)
        for d, _, low in overall(table):
            if low is not None:
                rank = str(ranks.get(d, ""))
                attack = "" if low.same_runs else low.column
                out.append([*([ALL] * len(group_axes)), d, rank, fmt(low.value, 6), attack, "", ""])
    return csv_text(out)


# ---------------------------------------------------------------------------------------------
# Plots


def plot_heatmap(table: Table, group: tuple[str, ...], rows: list[tuple[str, ...]], path: Path) -> Path:
    import numpy as np

    from dfedrw.experiments.plots import new_figure, save_figure

    means = np.full((len(rows), len(table.columns)), np.nan)
    for i, row in enumerate(rows):
        for j, c in enumerate(table.columns):
            cell = table.cells.get((row, c))
            if cell is not None and cell.n:
                means[i, j] = cell.mean(table.metric)
    worst = np.array([[w.value if (w := worst_case(table, row)) is not None else np.nan] for row in rows])
    # Margins in inches (labels, colorbar), so that the cells keep their size whatever the counts.
    left, right, bottom, top = 1.5, 0.9, 1.0, 0.45
    width = left + 0.62 * (len(table.columns) + 1.5) + 0.35 + right
    height = bottom + 0.36 * len(rows) + top
    fig = new_figure(width, height)
    grid = fig.add_gridspec(1, 3, width_ratios=[len(table.columns), 1.2, 0.3], wspace=0.08)
    ax, ax_w, bar = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[0, 2])
    from matplotlib import colormaps

    cmap = colormaps["RdYlGn"].with_extremes(bad="#dddddd")
    finite = means[np.isfinite(means)]
    vmax = float(finite.max()) if finite.size else 100.0
    vmin = 10.0  # chance on 10 classes
    for axis, data, columns in ((ax, means, [table.column_label(c) for c in table.columns]), (ax_w, worst, ["worst case"])):
        image = axis.imshow(np.ma.masked_invalid(data), aspect="auto", cmap=cmap, vmin=vmin, vmax=max(vmax, vmin + 1))
        axis.set_xticks(range(len(columns)), columns, rotation=35, ha="right", fontsize="small")
        for i in range(data.shape[0]):
            for j in range(data.shape[1]):
                if np.isfinite(data[i, j]):
                    level = (data[i, j] - vmin) / max(vmax - vmin, 1.0)
                    colour = "white" if level < 0.12 or level > 0.88 else "black"
                    axis.text(j, i, f"{data[i, j]:.1f}", ha="center", va="center", fontsize=7, color=colour)
    ax.set_yticks(range(len(rows)), [table.row_label(r)[-1] for r in rows], fontsize="small")
    ax_w.set_yticks([])
    fig.colorbar(image, cax=bar, label="accuracy (%; 10: chance)")
    title = group_title(table, group)
    what = "global" if table.metric.endswith("global_accuracy") else "local"
    ax.set_title(f"Honest mean {what} accuracy (%), mean over seeds{' — ' + title if title else ''}", fontsize="medium", loc="left")
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height)
    return save_figure(fig, path)


def make_plots(table: Table, out_dir: Path) -> list[Path]:
    from dfedrw.experiments.plots import plot_accuracy, slug

    out_dir = Path(out_dir)
    written = []
    for i, (group, rows) in enumerate(groups(table)):
        name = slug(group_label(table, group))
        written.append(plot_heatmap(table, group, rows, out_dir / f"robustness_{i:02d}_{name}.png"))
    for i, row in enumerate(table.rows):
        written.append(plot_accuracy(table, row, out_dir / f"accuracy_{i:02d}_{slug('_'.join(table.row_label(row)))}.png"))
    return written
