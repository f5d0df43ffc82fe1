"""``dfedrw``: the whole command line, the launchers' commands (:mod:`launch.cli`) plus the
experiments' ones.

    dfedrw sweep GRID.toml [--out DIR] [--jobs N] [--batch N] [--dry-run] [--tensorboard DIR] [--ray [ADDRESS]]
    dfedrw report DIR... [--out OUTDIR] [--no-plots]
    dfedrw export SWEEP_DIR --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dfedrw.launch.forkserver import prestart


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dfedrw.experiments.sweep import run_sweep
    from dfedrw.launch.procs import stop_on_signals

    out = args.out if args.out is not None else Path("sweeps") / args.grid.stem
    if args.tensorboard is not None:
        from dfedrw.peer.results.tensorboard import require_tensorboard

        require_tensorboard()
    stop_on_signals()
    try:
        result = run_sweep(
            args.grid, out, jobs=args.jobs, batch=args.batch, dry_run=args.dry_run, console=Console(stderr=True), tensorboard=args.tensorboard, ray=args.ray,
        )
    except KeyboardInterrupt:
        # Before any run started (while checking the grid): nothing to stop or record.
        print("dfedrw sweep: interrupted", file=sys.stderr)
        return 130
    if not args.dry_run:
        print(f"results: {result.out_dir}")
    return result.exit_code


def cmd_report(args: argparse.Namespace) -> int:
    from dfedrw.experiments.report import write_report

    out = args.out if args.out is not None else args.dirs[0] / "report"
    written = write_report(args.dirs, out, plots=not args.no_plots)
    print((out / "table.md").read_text(encoding="utf-8"), end="")
    print(f"\nwrote {len(written)} files to {out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from dfedrw.experiments.record import export_sweep

    exported, left_out = export_sweep(args.sweep, args.out)
    print(f"exported {exported} finished runs of {args.sweep} to {args.out}")
    if left_out:
        print(f"left out {len(left_out)} runs that have not finished: {', '.join(left_out[:5])}{' ...' if len(left_out) > 5 else ''}", file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    """Add sweep, report and export to the subcommands ``sub``."""
    from dfedrw.peer.cli import add_tensorboard_flag, folder_path

    sw = sub.add_parser("sweep", help="run every scenario of a grid file, in parallel and resumably")
    sw.add_argument("grid", type=Path, help="grid TOML (base, set, [axes], [[variants.NAME]], [[exclude]], [report])")
    sw.add_argument("--out", type=folder_path, default=None, help="sweep folder (default: sweeps/<grid name>); rerun to resume")
    sw.add_argument("--jobs", type=int, default=None, help="runs (or batches) at a time (default: the number of CPUs; with --ray, the cluster's CPUs)")
    sw.add_argument(
        "--batch", type=int, default=16, metavar="N",
        help="runs of the batched engine per process: runs of one model, training and number of rounds go as rows of one batch (default: 16; 1: each run alone)",
    )
    sw.add_argument("--dry-run", action="store_true", help="print the points and their run folders, run nothing")
    sw.add_argument(
        "--ray", nargs="?", const="", default=None, metavar="ADDRESS",
        help="run the batches as tasks on the Ray cluster at ADDRESS (HOST:PORT, ray://HOST:PORT or auto; default: $RAY_ADDRESS, else auto); needs pip install 'dfedrw[ray]'",
    )
    add_tensorboard_flag(sw, what="each run's honest clients and their honest mean (a subfolder per run, named like its run folder)")
    sw.set_defaults(func=cmd_sweep)

    rp = sub.add_parser("report", help="tables, paper comparison and plots from sweep folders")
    rp.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="sweep folders (merged; same [report] required)")
    rp.add_argument("--out", type=folder_path, default=None, help="output folder (default: DIR/report of the first DIR)")
    rp.add_argument("--no-plots", action="store_true", help="write the tables only")
    rp.set_defaults(func=cmd_report)

    ex = sub.add_parser("export", help="copy a sweep's results in compact form (summary, scenario, curves, mean weights per run)")
    ex.add_argument("sweep", type=Path, metavar="SWEEP_DIR", help="folder written by `dfedrw sweep`")
    ex.add_argument("--out", type=folder_path, required=True, metavar="DIR", help="destination: a new or empty folder, or an earlier export (replaced); `dfedrw report DIR` reads it like the sweep")
    ex.set_defaults(func=cmd_export)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        # This process's own command line: for a `run` of client processes, their fork
        # server imports while this process does.
        prestart(sys.argv[1:])
    from dfedrw.launch.cli import build_parser
    from dfedrw.peer.cli import dispatch

    return dispatch(build_parser(more=add_commands), argv)


if __name__ == "__main__":
    sys.exit(main())
