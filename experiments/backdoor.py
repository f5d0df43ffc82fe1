"""The backdoor report (``[report] kind = "backdoor"``): clean accuracy and attack success side by side.

Layout as :mod:`experiments.robustness`: ``rows = [GROUP..., DEFENCE]`` (e.g.
``["data.partition", "topology.placement", "method"]``), ``columns = ATTACK``, one table per
value of the group axes. A cell gives three means over seeds, ``CLEAN / PEAK → END``:

- CLEAN: the table's metric (default ``honest_mean_global_accuracy``), the accuracy the
  defence keeps on the clean test set;
- PEAK: ``attack_success.peak_mean``, the highest honest mean attack success rate (%) over the
  evaluated rounds: how far the backdoor got while it was planted;
- END: ``attack_success.mean``, the honest mean at the last round. After an attack window
  (``attack.stop``) END against PEAK is how long the backdoor lasted once no one planted it.

A run of the attack without Byzantine clients (a No-attack row that keeps the attack's name)
plants nothing and measures the trigger on clean models: its PEAK and END are the base rate
every other row is read against. A second table per group gives the Byzantine weight share,
the weight honest clients gave the attackers over the run: whether a defence saw them.

A defence's *worst case* is its highest PEAK over the attacks; defences are ranked by it
(lowest first, ties as displayed), with their lowest clean accuracy beside it and, with
``reference``, that accuracy less the reference row's (the clean accuracy the defence costs).
A defence that keeps a backdoor out by not learning has not defended anything: with
``reference``, one whose lowest clean accuracy is more than ``tolerance`` points (default 3)
below the reference's is not ranked but listed after the ranking with what it lost.
``unranked`` defences are shown but not ranked. A last table takes the worst case over every
group; a defence is ranked there when it is ranked in every group.

Files: ``table.md``, ``table.csv`` (the cell text of each group's table, with the worst case),
``cells.csv`` (one line per cell, full precision), ``worst_case.csv`` and ``plots/``: the
honest mean attack success per round, one panel per attack and a line per defence, for each
group.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dfedrw.peer.config.checks import ScenarioError, parse_toml
from dfedrw.experiments.formatting import (
    MISSING, NOT_IN_GRID, cells_csv, csv_text, fmt, md_header, md_row, missing_lines, seed_note, signed,
)
from dfedrw.experiments.robustness import SHARE_KEY, SHARE_NOTE, group_label, group_title, groups, share_cell
from dfedrw.experiments.table import Table

PEAK = "attack_success.peak_mean"
END = "attack_success.mean"
WORST_CLIENT = "attack_success.worst"
ALL = "all"


@dataclass(frozen=True)
class Worst:
    success: float  # the highest PEAK over the attacks
    column: str  # the attack behind it
    clean: float | None  # the lowest clean accuracy over the same attacks
    attacks: int  # attacks with a success rate for this defence
    of: int  # attacks in the table


def _filled(table: Table, row: tuple[str, ...], column: str):
    cell = table.cells.get((row, column))
    return cell if cell is not None and cell.n else None


def worst_case(table: Table, row: tuple[str, ...]) -> Worst | None:
    """The row's highest PEAK over the attacks (the first attack in grid order on a tie) and
    its lowest clean accuracy; None when no attack's cell gives a success rate."""
    present = [c for c in table.columns if (cell := _filled(table, row, c)) is not None and cell.has(PEAK)]
    if not present:
        return None
    high = max(present, key=lambda c: (table.cells[row, c].mean(PEAK), -present.index(c)))
    clean = min(table.cells[row, c].mean(table.metric) for c in present)
    return Worst(table.cells[row, high].mean(PEAK), high, clean, len(present), len(table.columns))


def _ranked(table: Table, row: tuple[str, ...]) -> bool:
    unranked = set(table.spec["unranked"])
    return row[-1] not in unranked and table.row_label(row)[-1] not in unranked


def clean_loss(table: Table, row: tuple[str, ...], w: Worst | None = None) -> float | None:
    """The row's lowest clean accuracy less the reference row's in the same group (negative:
    the defence costs accuracy); None without a reference or either accuracy."""
    w = w if w is not None else worst_case(table, row)
    ref = _reference(table, row[:-1])
    if w is None or w.clean is None or ref is None or ref.clean is None:
        return None
    return w.clean - ref.clean


def keeps_accuracy(table: Table, row: tuple[str, ...], w: Worst | None = None) -> bool:
    """Whether the row's lowest clean accuracy is within ``tolerance`` points of the
    reference's (compared as displayed); True without a reference."""
    loss = clean_loss(table, row, w)
    return loss is None or float(fmt(loss, 2)) >= -table.spec["tolerance"]


def _eligible(table: Table, row: tuple[str, ...]) -> bool:
    return _ranked(table, row) and keeps_accuracy(table, row)


def ranking(table: Table, rows: list[tuple[str, ...]]) -> list[tuple[int, tuple[str, ...], Worst]]:
    """(rank, row, worst case) of the ranked rows with a success rate that keep their clean
    accuracy (:func:`keeps_accuracy`), lowest worst case first; rows whose worst cases print
    alike share a rank."""
    scored = [
        (row, w) for row in rows
        if _ranked(table, row) and (w := worst_case(table, row)) is not None and keeps_accuracy(table, row, w)
    ]
    scored.sort(key=lambda rw: float(fmt(rw[1].success, 2)))
    out: list[tuple[int, tuple[str, ...], Worst]] = []
    for i, (row, w) in enumerate(scored):
        same = i > 0 and fmt(w.success, 2) == fmt(scored[i - 1][1].success, 2)
        out.append((out[-1][0] if same else i + 1, row, w))
    return out


def overall(table: Table) -> list[tuple[str, dict[tuple[str, ...], Worst], Worst | None]]:
    """Per defence (in table order): its worst case in each group and the highest of those."""
    defences: dict[str, dict[tuple[str, ...], Worst]] = {}
    for group, rows in groups(table):
        for row in rows:
            per = defences.setdefault(row[-1], {})
            if (w := worst_case(table, row)) is not None:
                per[group] = w
    return [(d, per, max(per.values(), key=lambda w: w.success) if per else None) for d, per in defences.items()]


# ---------------------------------------------------------------------------------------------
# Text


def cell_text(table: Table, row: tuple[str, ...], column: str, *, bold: bool = False) -> str:
    """``CLEAN / PEAK → END`` (2 decimals; PEAK bold when asked); ``CLEAN / n/a`` where the run
    measured no success rate (an attack that plants no backdoor); ``[n=k]`` marks a cell with
    fewer seeds than the most."""
    cell = table.cells.get((row, column))
    if cell is None:
        return NOT_IN_GRID
    if not cell.n:
        return MISSING
    flag = f" [n={cell.n}]" if cell.n < table.n_max() else ""
    clean = fmt(cell.mean(table.metric), 2)
    if not cell.has(PEAK):
        return f"{clean} / n/a{flag}"
    peak = fmt(cell.mean(PEAK), 2)
    if bold:
        peak = f"**{peak}**"
    return f"{clean} / {peak} → {fmt(cell.mean(END), 2)}{flag}"


def _lowest_per_column(table: Table, rows: list[tuple[str, ...]]) -> set[tuple[tuple[str, ...], str]]:
    """The (row, attack) cells with the lowest PEAK of their attack among the ranked defences
    that keep their clean accuracy, compared as displayed (ties all count)."""
    low = set()
    for c in table.columns:
        scored = {
            row: float(fmt(cell.mean(PEAK), 2))
            for row in rows
            if (cell := _filled(table, row, c)) is not None and cell.has(PEAK) and _eligible(table, row)
        }
        if scored:
            least = min(scored.values())
            low |= {(row, c) for row, v in scored.items() if v == least}
    return low


def _worst_text(table: Table, w: Worst | None, *, bold: bool = False) -> str:
    if w is None:
        return MISSING
    head = fmt(w.success, 2)
    if bold:
        head = f"**{head}**"
    partial = f" [{w.attacks} of {w.of} attacks]" if w.attacks < w.of else ""
    return f"{head} ({table.column_label(w.column)}){partial}"


def _reference(table: Table, group: tuple[str, ...]) -> Worst | None:
    reference = table.spec.get("reference")
    return worst_case(table, (*group, reference)) if reference is not None else None


def _ranking_lines(table: Table, group: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    ref = _reference(table, group)
    ref_label = table.row_label((*group, table.spec["reference"]))[-1] if table.spec.get("reference") else None
    def line(row: tuple[str, ...], w: Worst) -> str:
        clean = "" if w.clean is None else f"; lowest clean accuracy {fmt(w.clean, 2)}"
        loss = clean_loss(table, row, w)
        against = f" ({signed(loss, 2)} against {ref_label})" if loss is not None else ""
        return f"{table.row_label(row)[-1]}: highest success {_worst_text(table, w)}{clean}{against}"

    ranks = ranking(table, rows)
    lines = [f"{rank}. {line(row, w)}" for rank, row, w in ranks] or ["No defence that keeps its clean accuracy has a success rate yet."]
    costly = [
        (row, w) for row in rows
        if _ranked(table, row) and (w := worst_case(table, row)) is not None and not keeps_accuracy(table, row, w)
    ]
    if costly:
        lines += [
            "",
            f"Not ranked: lowest clean accuracy more than {fmt(table.spec['tolerance'], 1)} points below {ref_label}'s "
            f"({fmt(ref.clean, 2) if ref is not None and ref.clean is not None else MISSING}):",
            "",
            *(f"- {line(row, w)}" for row, w in costly),
        ]
    return lines


def _description(table: Table) -> str:
    unranked = table.spec["unranked"]
    excluding = f" (excluding {', '.join(unranked)})" if unranked else ""
    keeping = ranked_if = ""
    if table.spec.get("reference") is not None:
        tol, ref = fmt(table.spec["tolerance"], 1), table.column_label(table.spec["reference"])
        keeping = " among the defences that keep their clean accuracy"
        ranked_if = (
            f", when their lowest clean accuracy is within {tol} points of {ref}'s (a defence that keeps a backdoor "
            "out by not learning is listed apart)"
        )
    return (
        f"Cell: CLEAN / PEAK → END, means over seeds (%): CLEAN is `{table.metric}`, the accuracy on the clean test "
        f"set; PEAK is `{PEAK}`, the highest honest mean attack success rate over the evaluated rounds (the share of "
        "triggered test inputs not of the target class that the models put in it); END is "
        f"`{END}`, the same at the last round: after the attack window closes, END against PEAK is how long the "
        f"backdoor lasted. A row with no Byzantine client plants nothing: its success rate is the trigger's base rate "
        f"on clean models. **Bold**: the lowest PEAK under each attack{excluding}{keeping}, and the best worst case. "
        "Worst case: the defence's highest PEAK over the attacks; defences are ranked by it, lowest first"
        f"{ranked_if}."
    )


def render_markdown(table: Table) -> str:
    lines = ["# Backdoors: clean accuracy and attack success", "", _description(table), "", SHARE_NOTE, ""]
    defence_head = table.row_headers()[-1]
    attack_heads = [table.column_label(c) for c in table.columns]
    for group, rows in groups(table):
        title = group_title(table, group)
        if title:
            lines += [f"## {title}", ""]
        low = _lowest_per_column(table, rows)
        ranks = ranking(table, rows)
        top = ranks[0][2].success if ranks else None
        lines += md_header([defence_head, *attack_heads, "Worst case"])
        for row in rows:
            w = worst_case(table, row)
            bold_worst = w is not None and top is not None and _ranked(table, row) and fmt(w.success, 2) == fmt(top, 2)
            cells = [cell_text(table, row, c, bold=(row, c) in low) for c in table.columns]
            lines.append(md_row([table.row_label(row)[-1], *cells, _worst_text(table, w, bold=bold_worst)]))
        lines += ["", "Byzantine weight share:", ""]
        lines += md_header([defence_head, *attack_heads])
        for row in rows:
            lines.append(md_row([table.row_label(row)[-1], *(share_cell(table, row, c) for c in table.columns)]))
        unranked = table.spec["unranked"]
        lines += ["", f"Ranking by highest success{' (' + ', '.join(unranked) + ' not ranked)' if unranked else ''}:", ""]
        lines += [*_ranking_lines(table, group, rows), ""]
    if len(groups(table)) > 1:
        lines += _overall_lines(table, defence_head)
    lines.append(seed_note(table))
    lines += missing_lines(table)
    return "\n".join(lines) + "\n"


def _overall_ranks(table: Table) -> dict[str, int]:
    """Rank of each defence ranked in every group, by its highest worst case over the groups."""
    kept = {d: all(keeps_accuracy(table, (*g, d), w) for g, w in per.items()) for d, per, _ in overall(table)}
    scored = [(d, high) for d, _, high in overall(table) if high is not None and _ranked(table, (d,)) and kept[d]]
    scored.sort(key=lambda t: float(fmt(t[1].success, 2)))
    ranks: dict[str, int] = {}
    for i, (d, high) in enumerate(scored):
        same = i > 0 and fmt(high.success, 2) == fmt(scored[i - 1][1].success, 2)
        ranks[d] = ranks[scored[i - 1][0]] if same else i + 1
    return ranks


def _overall_lines(table: Table, defence_head: str) -> list[str]:
    group_list = [g for g, _ in groups(table)]
    ranks = _overall_ranks(table)
    rows = overall(table)
    rows.sort(key=lambda t: (t[0] not in ranks, ranks.get(t[0], 0)))
    heads = " / ".join(table.spec["axis_labels"].get(a, a) for a in table.spec["rows"][:-1])
    lines = [
        f"## Highest success over every attack and every {heads}",
        "",
        (
            f"Each {heads} column: the worst case there, as above; overall: the highest of them. Ranked by the overall "
            "worst case, when the defence is ranked in every column (keeps its clean accuracy there)."
        ),
        "",
    ]
    lines += md_header(["Rank", defence_head, *(group_label(table, g) for g in group_list), "Overall"])
    for d, per, high in rows:
        text = MISSING
        if high is not None:
            where = next(g for g, w in per.items() if w is high)
            text = f"{fmt(high.success, 2)} ({table.column_label(high.column)}, {group_label(table, where)})"
        cells = [_worst_text(table, per.get(g)) for g in group_list]
        lines.append(md_row([str(ranks.get(d, "")), table.spec["row_labels"].get(d, d), *cells, text]))
    return [*lines, ""]


def render_csv(table: Table) -> str:
    """``table.csv``: each group's table (cell text as in table.md, without bold)."""
    out = [[*table.row_headers(), *(table.column_label(c) for c in table.columns), "Worst case"]]
    for _, rows in groups(table):
        for row in rows:
            cells = [cell_text(table, row, c) for c in table.columns]
            out.append([*table.row_label(row), *cells, _worst_text(table, worst_case(table, row))])
    return csv_text(out)


def render_cells_csv(table: Table) -> str:
    """``cells.csv``: one line per cell: the clean accuracy's mean and std over seeds, then the
    success rates (peak, end, worst client) and the Byzantine share over the runs that have them."""
    return cells_csv(table, [table.metric, table.variance_key], (PEAK, END, WORST_CLIENT, SHARE_KEY))


def render_worst_case_csv(table: Table) -> str:
    """``worst_case.csv``: per group, then overall (group ``all``): each defence's highest PEAK,
    the attack behind it, its lowest clean accuracy and that less the reference's, how many
    attacks it covers, its rank (blank: not ranked)."""
    group_axes = table.spec["rows"][:-1]
    out = [[*group_axes, table.spec["rows"][-1], "rank", "highest_success", "attack", "lowest_clean", "clean_loss", "attacks", "of"]]
    for group, rows in groups(table):
        ranks = {row: rank for rank, row, _ in ranking(table, rows)}
        for row in rows:
            if (w := worst_case(table, row)) is None:
                continue
            clean = "" if w.clean is None else fmt(w.clean, 6)
            loss = clean_loss(table, row, w)
            out.append([
                *group, row[-1], str(ranks.get(row, "")), fmt(w.success, 6), w.column, clean,
                "" if loss is None else fmt(loss, 6), str(w.attacks), str(w.of),
            ])
    if group_axes and len(groups(table)) > 1:
        ranks = _overall_ranks(table)
        for d, _, high in overall(table):
            if high is not None:
                clean = "" if high.clean is None else fmt(high.clean, 6)
                out.append([*([ALL] * len(group_axes)), d, str(ranks.get(d, "")), fmt(high.success, 6), high.column, clean, "", "", ""])
    return csv_text(out)


# ---------------------------------------------------------------------------------------------
# Plots


def _attack_stop(table: Table, rows: list[tuple[str, ...]], column: str) -> int:
    """The attack window's last round (``attack.stop``) of the column's runs, 0 if it never
    closes or the runs disagree."""
    stops = set()
    for row in rows:
        if (cell := _filled(table, row, column)) is None or not cell.has(PEAK):
            continue
        for run in cell.runs:
            try:
                scenario = parse_toml((run.folder / "scenario.toml").read_text(encoding="utf-8"), str(run.folder))
            except (OSError, UnicodeDecodeError, ScenarioError):
                return 0
            stops.add(int(scenario.get("attack", {}).get("stop", 0)))
    return stops.pop() if len(stops) == 1 else 0


def plot_success(table: Table, group: tuple[str, ...], rows: list[tuple[str, ...]], path: Path) -> Path:
    """One panel per attack: each defence's honest mean attack success per round (mean over
    seeds), a dotted line where the attack window closes."""
    import numpy as np

    from dfedrw.experiments.plots import accuracy_curve, new_figure, save_figure

    n = len(table.columns)
    fig = new_figure(3.2 * n + 2.2, 3.6)
    axes = fig.subplots(1, n, sharey=True, squeeze=False)[0]
    for ax, c in zip(axes, table.columns, strict=True):
        for row in rows:
            if (cell := _filled(table, row, c)) is None or not cell.has(PEAK):
                continue
            curves = [accuracy_curve(r, "attack_success") for r in cell.runs]
            rounds = sorted(set().union(*curves))
            if not rounds:
                continue
            mean = [np.mean([cv[r] for cv in curves if r in cv]) for r in rounds]
            ax.plot([r + 1 for r in rounds], mean, marker="o" if len(rounds) <= 20 else None, markersize=3,
                    label=table.row_label(row)[-1])
        stop = _attack_stop(table, rows, c)
        if stop:
            ax.axvline(stop, color="grey", linestyle=":", linewidth=1)
        ax.set_title(table.column_label(c), fontsize="medium")
        ax.set_xlabel("round")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("honest mean attack success (%)")
    handles, labels = next(((a.get_legend_handles_labels()) for a in axes if a.lines), ([], []))
    if handles:
        fig.legend(handles, labels, fontsize="small", loc="center right")
    title = group_title(table, group)
    fig.suptitle(f"Backdoor success per round{' — ' + title if title else ''} (dotted: the attack stops)", fontsize="medium")
    fig.subplots_adjust(left=0.06, right=1 - 2.0 / (3.2 * n + 2.2), bottom=0.15, top=0.84, wspace=0.08)
    return save_figure(fig, path)


def make_plots(table: Table, out_dir: Path) -> list[Path]:
    from dfedrw.experiments.plots import slug

    out_dir = Path(out_dir)
    return [
        plot_success(table, group, rows, out_dir / f"success_{i:02d}_{slug(group_label(table, group))}.png")
        for i, (group, rows) in enumerate(groups(table))
    ]
