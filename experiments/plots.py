"""Figures for ``dfedrw report`` (matplotlib, Agg, PNG; file names depend only on the table).

- ``accuracy_<i>_<row>.png``: honest mean accuracy per evaluation round, one line per column
  (method), averaged over seeds; one figure per row. Where every run of the row has a clock
  (its records give seconds: client processes and threads, a batched engine that keeps one),
  ``accuracy_seconds_<i>_<row>.png`` and ``accuracy_bytes_sent_<i>_<row>.png`` too: the same
  curves against the seconds and the bytes sent by that round.
- ``clients_<i>_<row>.png``: each honest client's final accuracy, a box per method, all seeds
  pooled; one figure per row.
- ``weights_<i>_<row>__<j>_<column>.png``: the mean aggregation weight each honest client gave
  each sender over all rounds, for the first-seed run of a cell that has Byzantine clients;
  Byzantine senders are marked in red.
- ``local_vs_global.png`` (fairness tables whose runs give both accuracies): one panel per row,
  one point per method, the honest mean local accuracy (each client on its own test set)
  against the global one (the whole test set), means over seeds with their std as bars.

Figures are built on ``matplotlib.figure.Figure`` directly (no pyplot), so no global state or
GUI backend is involved. Curves and weights come from each run's compact record
(:mod:`experiments.record`), built from the per-round files when a run has none.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from dfedrw.experiments.record import curve, peer_ids, run_record, weights
from dfedrw.experiments.table import Cell, RunResult, Table

# PNG metadata would otherwise carry the matplotlib version.
_SAVE = {"dpi": 110, "metadata": {"Software": None}}


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "all"


def _accuracy_key(table: Table) -> str:
    """The per-client accuracy field behind the table's metric."""
    return "global_accuracy" if table.metric == "honest_mean_global_accuracy" else "accuracy"


def _ids(run: RunResult, role: str) -> list[int]:
    return peer_ids(run.summary or {}, role)


def _record(run: RunResult) -> dict:
    if run.record is None:
        run.record = run_record(run.folder, run.summary or {})
    return run.record


def accuracy_curve(run: RunResult, key: str) -> dict[int, float]:
    """Round -> mean over honest clients of ``key`` on the evaluation rounds of one run."""
    return curve(_record(run), key)


def mean_weights(run: RunResult) -> tuple[list[int], list[int], np.ndarray]:
    """(honest receivers, all senders, matrix): the mean weight each honest client gave each
    sender over its rounds; NaN where it never received from that sender (not a neighbour)."""
    return weights(_record(run))


def new_figure(width: float = 7.0, height: float = 4.5):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def save_figure(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, **_SAVE)
    return path


# What accuracy can be plotted against besides the round: a curve of the runs' records (those
# with a clock), and its axis label.
AGAINST = {"seconds": "seconds (honest mean)", "bytes_sent": "MB sent per honest client (mean)"}


def timed(table: Table, row: tuple[str, ...]) -> bool:
    """Whether every run of the row's cells has a clock (its record gives seconds)."""
    runs = [r for c in table.columns if (cell := table.cells.get((row, c))) is not None for r in cell.runs]
    return bool(runs) and all(accuracy_curve(r, "seconds") for r in runs)


def plot_accuracy(table: Table, row: tuple[str, ...], path: Path, against: str = "round") -> Path:
    """The row's honest mean accuracy per evaluation round, one line per column, against the
    round or (``against``: a key of :data:`AGAINST`) the seconds or bytes the runs' records give
    at that round, each the mean over seeds."""
    key = _accuracy_key(table)
    fig = new_figure(8.5, 4.5)
    ax = fig.add_subplot()
    for c in table.columns:
        cell = table.cells.get((row, c))
        if cell is None or not cell.n:
            continue
        curves = [accuracy_curve(r, key) for r in cell.runs]
        rounds = sorted(set().union(*curves))
        if not rounds:
            continue
        mean = [np.mean([cv[r] for cv in curves if r in cv]) for r in rounds]
        if against == "round":
            x = [r + 1 for r in rounds]
        else:
            axis = [accuracy_curve(r, against) for r in cell.runs]
            x = [np.mean([cv[r] for cv in axis if r in cv]) / (1e6 if against == "bytes_sent" else 1.0) for r in rounds]
        ax.plot(x, mean, marker="o" if len(x) <= 20 else None, label=f"{table.column_label(c)} (n={cell.n})")
    ax.set_xlabel(AGAINST.get(against, "round"))
    ax.set_ylabel(f"honest mean {'global' if key == 'global_accuracy' else 'local'} test accuracy (%)")
    ax.set_title(" / ".join(table.row_label(row)))
    ax.grid(alpha=0.3)
    if ax.lines:  # beside the axes: inside, it hides whichever curve runs under it
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_clients(table: Table, row: tuple[str, ...], path: Path) -> Path:
    key = _accuracy_key(table)
    data, labels = [], []
    for c in table.columns:
        cell = table.cells.get((row, c))
        values = []
        for r in cell.runs if cell else []:
            for k in _ids(r, "honest"):
                v = r.summary["peers"][str(k)].get(key)
                if v is not None:
                    values.append(float(v))
        data.append(values)
        labels.append(table.column_label(c))
    fig = new_figure(max(6.0, 1.1 * len(labels) + 2), 4.5)
    ax = fig.add_subplot()
    positions = list(range(1, len(data) + 1))
    ax.boxplot([d if d else [np.nan] for d in data], positions=positions, widths=0.5, showfliers=False)
    for x, d in zip(positions, data):
        ax.scatter([x] * len(d), d, s=10, alpha=0.5, color="tab:blue")
    ax.set_xticks(positions, labels, rotation=20, ha="right", fontsize="small")
    ax.set_ylabel(f"final {'global' if key == 'global_accuracy' else 'local'} test accuracy per client (%)")
    ax.set_title(f"{' / '.join(table.row_label(row))}: per-client accuracy, all seeds")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_weights(table: Table, row: tuple[str, ...], cell: Cell, run: RunResult, path: Path) -> Path:
    receivers, senders, matrix = mean_weights(run)
    byzantine = set(_ids(run, "byzantine"))
    n = len(senders)
    fig = new_figure(max(5.0, 0.45 * n + 2.5), max(4.0, 0.4 * len(receivers) + 2.0))
    grid = fig.add_gridspec(2, 2, height_ratios=[1, max(len(receivers), 1) * 2], width_ratios=[30, 1], hspace=0.05)
    marker = fig.add_subplot(grid[0, 0])
    ax = fig.add_subplot(grid[1, 0], sharex=marker)
    bar = fig.add_subplot(grid[1, 1])
    # A strip above the heatmap: red where the sender is Byzantine.
    marker.imshow([[1.0 if s in byzantine else 0.0 for s in senders]], aspect="auto", cmap="Reds", vmin=0, vmax=1.25)
    marker.set_yticks([0], ["Byzantine"], fontsize="small")
    marker.tick_params(axis="x", labelbottom=False, bottom=False)
    from matplotlib import colormaps

    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")
    vmax = float(np.nanmax(matrix)) if np.isfinite(matrix).any() else 1.0
    image = ax.imshow(np.ma.masked_invalid(matrix), aspect="auto", cmap=cmap, vmin=0.0, vmax=max(vmax, 1e-9))
    ax.set_xticks(range(n), [str(s) for s in senders])
    ax.set_yticks(range(len(receivers)), [str(k) for k in receivers])
    for tick, s in zip(ax.get_xticklabels(), senders):
        if s in byzantine:
            tick.set_color("red")
            tick.set_fontweight("bold")
    if n <= 16 and len(receivers) <= 16:
        for i in range(len(receivers)):
            for j in range(n):
                if np.isfinite(matrix[i, j]):
                    ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if matrix[i, j] < 0.6 * vmax else "black")
    ax.set_xlabel("sender (red: Byzantine; grey: not a neighbour)")
    ax.set_ylabel("honest receiver")
    fig.colorbar(image, cax=bar, label="mean weight")
    seed = f", seed {run.seed}" if run.seed is not None else ""
    marker.set_title(f"{' / '.join(table.row_label(row))} — {table.column_label(cell.column)}{seed}", fontsize="medium")
    return save_figure(fig, path)


LOCAL, GLOBAL = "honest_mean_accuracy", "honest_mean_global_accuracy"
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")


def _compact_labels(labels: list[str]) -> str:
    """"q-FDFL (q=0.1)", "q-FDFL (q=0.5)" -> "q-FDFL (q=0.1, q=0.5)": one name per group of
    points that lie on top of each other."""
    groups: dict[str, list[str]] = {}
    for label in labels:
        m = re.fullmatch(r"(.*\S) \((.*)\)", label)
        name, param = (m.group(1), m.group(2)) if m else (label, "")
        groups.setdefault(name, [])
        if param:
            groups[name].append(param)
    return "\n".join(f"{name} ({', '.join(params)})" if params else name for name, params in groups.items())


def _clusters(points: list[tuple[float, float, str]], radius: float) -> list[list[tuple[float, float, str]]]:
    """Points closer than ``radius`` (chained) in one group, in the order of their first point."""
    groups: list[list[tuple[float, float, str]]] = []
    for p in points:
        near = [g for g in groups if any(abs(p[0] - q[0]) <= radius and abs(p[1] - q[1]) <= radius for q in g)]
        groups = [g for g in groups if g not in near]
        groups.append([q for g in near for q in g] + [p])
    return groups


# Labels stay legible over the grid and the diagonal.
_LABEL_BOX = {"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 1.0}


def _label_clusters(ax, groups: list[list[tuple[float, float, str]]], renderer) -> None:
    from matplotlib.transforms import Bbox

    inside = ax.get_window_extent(renderer)
    mid = sum(ax.get_xlim()) / 2
    centres = [(float(np.mean([p[0] for p in g])), float(np.mean([p[1] for p in g]))) for g in groups]
    # The markers (about 8 points wide) are taken before any label.
    taken = []
    for x, y in centres:
        px, py = ax.transData.transform((x, y))
        taken.append(Bbox.from_bounds(px - 9, py - 9, 18, 18))
    for group, (x, y) in zip(groups, centres, strict=True):
        side = 1 if x < mid else -1
        tries = [(side * 12, -4, "top"), (side * 12, 4, "bottom"), (-side * 12, -4, "top"), (-side * 12, 4, "bottom"),
                 (side * 12, -40, "top"), (-side * 12, -40, "top")]
        chosen = None
        for dx, dy, va in tries:
            note = ax.annotate(
                _compact_labels([p[2] for p in group]), (x, y), xytext=(dx, dy), textcoords="offset points",
                ha="left" if dx > 0 else "right", va=va, fontsize=8, bbox=_LABEL_BOX,
            )
            box = note.get_window_extent(renderer)
            fits = inside.containsx(box.x0) and inside.containsx(box.x1) and inside.containsy(box.y0) and inside.containsy(box.y1)
            if fits and not any(box.overlaps(t) for t in taken):
                chosen = box
                break
            note.remove()
        if chosen is None:  # nowhere free: the first place, overlapping
            dx, dy, va = tries[0]
            note = ax.annotate(
                _compact_labels([p[2] for p in group]), (x, y), xytext=(dx, dy), textcoords="offset points",
                ha="left" if dx > 0 else "right", va=va, fontsize=8, bbox=_LABEL_BOX,
            )
            chosen = note.get_window_extent(renderer)
        taken.append(chosen)


def plot_local_vs_global(table: Table, path: Path) -> Path:
    from matplotlib import colormaps

    colours = colormaps["tab10"]
    n = len(table.rows)
    ncols = 2 if n > 1 else 1
    nrows = (n + ncols - 1) // ncols
    fig = new_figure(5.4 * ncols, 4.6 * nrows + 1.0)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    values = [
        v for cell in table.cells.values() if cell.n for v in (cell.mean(GLOBAL), cell.mean(LOCAL))
    ]
    lo, hi = (min(values), max(values)) if values else (0.0, 100.0)
    pad = max(3.0, 0.06 * (hi - lo))
    lo, hi = max(0.0, lo - pad), min(100.0, hi + pad)
    labelled = []
    for i, row in enumerate(table.rows):
        ax = axes[i // ncols][i % ncols]
        ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=0.8, zorder=0)
        points = []
        for j, c in enumerate(table.columns):
            cell = table.cells.get((row, c))
            if cell is None or not cell.n:
                continue
            x, y = cell.mean(GLOBAL), cell.mean(LOCAL)
            points.append((x, y, table.column_label(c)))
            ax.errorbar(
                x, y, xerr=cell.std(GLOBAL), yerr=cell.std(LOCAL), fmt=_MARKERS[j % len(_MARKERS)],
                markersize=8, markerfacecolor="none", markeredgewidth=1.5, color=colours(j % 10),
                elinewidth=0.8, capsize=2, alpha=0.9, label=table.column_label(c),
            )
        labelled.append((ax, _clusters(points, radius=0.03 * (hi - lo))))
        ax.set_title(" / ".join(table.row_label(row)))
        ax.grid(alpha=0.3)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal", adjustable="box")
    for k in range(n, nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("global accuracy (%, whole test set)")
    for ax in axes[:, 0]:
        ax.set_ylabel("local accuracy (%, own test set)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncols=min(len(labels), 4), fontsize="small", frameon=False)
    fig.suptitle("Honest mean accuracy, local against global: mean ± std over seeds (dashed: equal)")
    legend_height = 0.3 * ((len(labels) + 3) // 4) if handles else 0.0
    fig.tight_layout(rect=(0, (legend_height + 0.1) / fig.get_figheight(), 1, 1))
    # Methods that land on the same spot are named together beside it, once the layout is
    # final (the labels are placed where they overlap nothing already drawn).
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    for ax, groups in labelled:
        _label_clusters(ax, groups, renderer)
    return save_figure(fig, path)


def make_plots(table: Table, out_dir: Path) -> list[Path]:
    """Write every figure of the table under ``out_dir``; returns their paths in a fixed order."""
    out_dir = Path(out_dir)
    written: list[Path] = []
    for i, row in enumerate(table.rows):
        stem = f"{i:02d}_{slug('_'.join(table.row_label(row)))}"
        written.append(plot_accuracy(table, row, out_dir / f"accuracy_{stem}.png"))
        if timed(table, row):
            # Runs with a clock: accuracy against the time and the bytes it cost as well.
            for against in AGAINST:
                written.append(plot_accuracy(table, row, out_dir / f"accuracy_{against}_{stem}.png", against))
        written.append(plot_clients(table, row, out_dir / f"clients_{stem}.png"))
        for j, c in enumerate(table.columns):
            cell = table.cells.get((row, c))
            if cell is None or not cell.n:
                continue
            first = cell.runs[0]
            if not _ids(first, "byzantine"):
                continue
            name = f"weights_{stem}__{j:02d}_{slug(table.column_label(c))}.png"
            written.append(plot_weights(table, row, cell, first, out_dir / name))
    if table.kind == "fairness" and table.every_cell_has(LOCAL) and table.every_cell_has(GLOBAL):
        written.append(plot_local_vs_global(table, out_dir / "local_vs_global.png"))
    return written
