"""``engine.name = "batched"`` launched: a run (:func:`run_batched`, what ``dfedrw run`` calls for
it) or a batch of runs (``python -m dfedrw.launch.batched_engine --run REQUEST OUT ...``, what a sweep
starts) in this process, checked before it starts, with progress shown and stopped cleanly on
a signal. The engine itself, every client of a run at once, is :mod:`dfedrw.engines.together`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from dfedrw.engines.together import run_together
from dfedrw.engines.run import BatchedRun
from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.results.collect import write_tensorboard_mean


def run_batched(scenario: Scenario, out_dir: Path, *, console: Console, tensorboard: Path | None = None) -> dict[str, Any]:
    """Run ``scenario`` in the batched engine, with a progress bar; returns the summary.
    ``tensorboard``: a folder for the honest clients' event files (the caller writes the mean)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from dfedrw.launch.preflight import preflight

    preflight(scenario)
    run = BatchedRun(scenario, out_dir, tensorboard=tensorboard)
    label = f"batched engine, {len(run.honest)} + {len(run.byzantine)} clients on {run.device}"
    if not console.is_terminal:
        every = max(1, scenario.rounds // 10)
        console.print(label)
        return run_together([run], lambda r: (r + 1) % every == 0 and console.print(f"round {r + 1}/{scenario.rounds}"))[0]
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task("rounds", total=scenario.rounds)
        return run_together([run], lambda r: bar.update(task, completed=r + 1))[0]


def run_many(jobs: list[tuple[Path, Path]], *, console: Console, tensorboard: Path | None = None) -> list[dict[str, Any]]:
    """``python -m dfedrw.launch.batched_engine --run REQUEST OUT ...``: the scenarios ``REQUEST``
    (TOML files) as one batch (:func:`run_together`), each writing its results folder ``OUT``
    (and, with ``tensorboard``, its event files in ``tensorboard/<name of OUT>``). What a sweep
    runs for runs of one :func:`batch_key`."""
    from dfedrw.launch.preflight import check_batch_memory, preflight
    from dfedrw.peer.config.scenario import load_scenario
    from dfedrw.peer.results.records import check_fresh_out_dir
    from dfedrw.peer.results.tensorboard import check_fresh_event_dir, require_tensorboard

    scenarios = []
    for request, _ in jobs:
        try:
            scenarios.append(load_scenario(request))
        except ValueError as exc:
            if str(request) in str(exc):
                raise
            raise ValueError(f"{request}: {exc}") from None  # which of the batch's files
    boards = [None if tensorboard is None else Path(tensorboard) / Path(out).name for _, out in jobs]
    if tensorboard is not None:
        require_tensorboard()
    for scenario, (request, out), board in zip(scenarios, jobs, boards, strict=True):
        if scenario.engine.name != "batched":
            raise ValueError(f"{request}: engine.name is {scenario.engine.name!r}; a batch of runs needs the batched engine")
        check_fresh_out_dir(out, range(scenario.num_clients))
        if board is not None:
            check_fresh_event_dir(board, range(scenario.num_clients))
        preflight(scenario)
    if len(scenarios) > 1:
        # Each run fits alone (preflight); the batch holds them all in this one process.
        check_batch_memory(scenarios)
    runs = [BatchedRun(scenario, out, tensorboard=board) for scenario, (_, out), board in zip(scenarios, jobs, boards, strict=True)]
    rounds = scenarios[0].rounds
    console.print(f"batched engine: {len(runs)} runs as one batch, {sum(len(r.honest) for r in runs)} honest clients on {runs[0].device}")
    # Every 2 % of the rounds: the sweep reads the last of these lines for its ETA.
    every = max(1, rounds // 50)
    summaries = run_together(runs, lambda r: (r + 1) % every == 0 and console.print(f"round {r + 1}/{rounds}"))
    for run in runs:
        if run.tensorboard is not None:
            write_tensorboard_mean(run.out_dir, run.scenario, run.tensorboard)
    return summaries


def run_batch(pairs: list[tuple[Path, Path]], *, console: Console, tensorboard: Path | None = None) -> int:
    """:func:`run_many` as a command: its exit status (0, 2 for a bad setting, 130 when
    interrupted), each run's honest mean accuracy or the error printed on ``console``. What
    ``python -m dfedrw.launch.batched_engine`` runs, and a sweep's batch on a Ray node
    (:mod:`dfedrw.experiments.sweep_ray`)."""
    try:
        summaries = run_many(pairs, console=console, tensorboard=tensorboard)
    except KeyboardInterrupt:  # before the rounds began
        console.print("interrupted: the batch's runs are unfinished", markup=False)
        return 130
    except (ValueError, RuntimeError, OSError) as exc:
        console.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        return 2
    if any(summary.get("interrupted") for summary in summaries):
        console.print("interrupted: the batch's runs are unfinished (their summaries say so)", markup=False)
        return 130
    for (_, out), summary in zip(pairs, summaries, strict=True):
        console.print(f"{out}: honest mean accuracy {summary.get('honest_mean_accuracy')}", markup=False, highlight=False, soft_wrap=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    from dfedrw.launch.procs import stop_on_signals
    from dfedrw.peer.cli import folder_path

    parser = argparse.ArgumentParser(prog="python -m dfedrw.launch.batched_engine", description=run_many.__doc__.split("\n\n")[0])
    parser.add_argument("--run", nargs=2, action="append", required=True, type=Path, metavar=("REQUEST", "OUT"), help="a scenario file and its results folder (repeat)")
    parser.add_argument("--tensorboard", type=folder_path, default=None, metavar="DIR", help="TensorBoard event files of each run in DIR/<name of its OUT>")
    args = parser.parse_args(argv)
    stop_on_signals()
    return run_batch([tuple(pair) for pair in args.run], console=Console(stderr=True), tensorboard=args.tensorboard)


if __name__ == "__main__":
    import sys

    sys.exit(main())
