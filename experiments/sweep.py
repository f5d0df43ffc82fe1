"""``dfedrw sweep``: run a grid of scenarios, each distinct scenario once, in parallel, resumably.

A grid file (TOML) names a base scenario, fixed overrides, axes whose product gives the points,
named variants (labelled bundles of overrides), exclusions and the layout of the report::

    base = "../fashion_iid.toml"        # optional, relative to the grid file; absent = built-in default
    set = ["rounds=3000", "network.transport=inproc"]   # optional, applied to every point

    [axes]                              # scenario key -> list of values; the product is taken
    seed = [43, 44, 45, 46]
    "data.partition" = ["iid", "dirichlet:0.1"]

    [[variants.method]]                 # a named axis whose values are labelled override bundles
    label = "DFedAvg"
    set = ["aggregation.rule=dfedavg"]

    [[exclude]]                         # drop every point matching all of these (a list = any of)
    "data.partition" = "iid"
    method = ["DFedAvg"]

    [report]                            # read by ``dfedrw report``; see experiments.report

Overrides apply in this order: the base file, ``set``, the plain axes (grid order), then the
variants (grid order). Variants come last so that a bundle such as a No-attack baseline
(``attack.name=none``, ``topology.byzantine=0``) wins over an attack axis; the points it covers
then resolve to one scenario and run once.

Results go under ``OUT``:

    OUT/sweep.json                  the grid path, the report spec, every point (its labels, its
                                    overrides and its run folder), the sittings and their wall time
                                    (saved at each finished run and every minute, so that a sweep
                                    killed outright keeps its time up to then; marked ``killed``)
    OUT/sweep.lock                  the PID of the sweep running there (refuses a second one)
    OUT/runs/<slug>-<hash>/         one folder per distinct resolved scenario (``hash``: the first
                                    10 hex digits of the SHA-256 of its resolved TOML), holding
                                    scenario.request.toml, run.log, run.pid (while it runs) and
                                    what ``dfedrw run`` writes

Running the same command again resumes: a folder with a finished summary of the same scenario
is skipped, an interrupted or crashed one is deleted and run again. A run whose ``dfedrw run``
is still alive (its sweep was killed outright, so it never stopped its children) is never
deleted under it: the sweep refuses to start until it has ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from dfedrw.launch.forkserver import ForkedProcess, ForkServer, fork_available
from dfedrw.peer.results.records import write_json_atomic
from dfedrw.experiments.record import read_record, write_record
from dfedrw.experiments.grid import SweepError, load_grid
from dfedrw.experiments.sweep_board import SweepBoard, rounds_done, seconds_text  # noqa: F401 - rounds_done named from here too
from dfedrw.experiments.sweep_settle import _clear, log_tail, settle  # noqa: F401 - log_tail named from here too
from dfedrw.experiments.sweep_record import check_same_grid, now_text, previous_nodes, previous_sittings, sweep_lock, sweep_record
from dfedrw.experiments.sweep_plan import (  # noqa: F401 - print_plan named from here too
    DEFAULT_BATCH, LOG_FILE, PID_FILE, REQUEST_FILE, SWEEP_FILE, print_plan, warn_unused, Plan, PlannedRun, plan_batches, plan_sweep, run_seconds, run_state,
    still_running,
)


# Between SIGINT (the child writes an interrupted summary and stops its clients) and SIGTERM,
# then SIGKILL, when a sweep is stopped.
_INT_GRACE = 10.0
_TERM_GRACE = 5.0
_POLL = 0.2
# Seconds between reads of the running processes' progress from their logs.
_PROGRESS_EVERY = 5.0
# The last line of a run's or a batch's log saying how far its rounds have come.
# How often (seconds) a sitting's time is saved to sweep.json besides at each finished run.
_CHECKPOINT_EVERY = 60.0


# ---------------------------------------------------------------------------------------------
# The grid


# ---------------------------------------------------------------------------------------------
# Resolved scenarios and their folders


# ---------------------------------------------------------------------------------------------
# Running


def child_command(request: Path, folder: Path) -> list[str]:
    """The command that runs one scenario: a subprocess isolates crashes and uses its own core."""
    return [sys.executable, "-m", "dfedrw.launch.cli", "run", str(request), "--out", str(folder)]


def batch_arguments(runs: Sequence[PlannedRun]) -> list[str]:
    """The arguments of ``python -m dfedrw.launch.batched_engine`` that run ``runs`` as one batch."""
    return [x for run in runs for x in ("--run", str(run.folder / REQUEST_FILE), str(run.folder))]


def batch_command(runs: Sequence[PlannedRun]) -> list[str]:
    """The command that runs several scenarios of the batched engine as one batch of runs."""
    return [sys.executable, "-m", "dfedrw.launch.batched_engine", *batch_arguments(runs)]


def batch_server(env: dict[str, str]) -> ForkServer | None:
    """Where the sweep forks its batches from: a fork server with the batched engine imported
    (:mod:`dfedrw.launch.forkserver`), so that a batch does not spend its first two seconds
    importing torch and the engine, and ends without tearing an interpreter down. None where
    ``os.fork`` is missing: each batch is then a fresh ``python -m dfedrw.launch.batched_engine``."""
    return ForkServer(sys.executable, env, entry="batched") if fork_available() else None


def _child_env() -> dict[str, str]:
    from dfedrw.peer.cli import without_flag_variables

    # A run's flags (its results folder, its TensorBoard folder) are on its command line.
    env = without_flag_variables(os.environ)
    # Several runs share the cores; torch's default of one thread per core would oversubscribe.
    env["OMP_NUM_THREADS"] = "1"
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


@dataclass
class Failure:
    run: str
    points: list[str]
    reason: str
    log_tail: str = ""


@dataclass
class SweepResult:
    out_dir: Path
    total: int
    done: int = 0
    skipped: int = 0
    failures: list[Failure] = field(default_factory=list)
    interrupted: bool = False
    wall_seconds: float = 0.0
    total_wall_seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 1 if self.failures else 0


class _BatchForker:
    """Forks a sweep's batches from one fork server (:func:`batch_server`, started at the first
    batch). Where there is none, or it fails to start or fork one, it forks nothing more and
    :meth:`start` returns None: each batch is then a new process."""

    def __init__(self, env: dict[str, str], console: Console) -> None:
        self.env, self.console = env, console
        self.server: ForkServer | None = None
        self.off = False

    def start(self, argv: list[str], log: Path) -> ForkedProcess | None:
        if self.off:
            return None
        try:
            if self.server is None:
                self.server = batch_server(self.env)
                self.off = self.server is None
                if self.off:
                    return None
            return self.server.start(argv, self.env, log)
        except (OSError, RuntimeError) as exc:
            self.console.print(f"could not fork a batch ({exc}); starting each batch as a new process", markup=False, highlight=False, soft_wrap=True)
            self.close()
            self.off = True
            return None

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


@dataclass
class _Job:
    runs: list[PlannedRun]
    proc: subprocess.Popen | ForkedProcess
    log: Any  # the open log file of a subprocess; None for a forked batch (it opened its own)
    start: float


def _stop(jobs: Sequence[_Job]) -> None:
    """Stop the runs this sweep started, by their PIDs: SIGINT (the run stops its clients and
    writes an interrupted summary), then SIGTERM, then SIGKILL. A second Ctrl-C skips the grace."""
    try:
        for sig, grace in ((signal.SIGINT, _INT_GRACE), (signal.SIGTERM, _TERM_GRACE)):
            alive = [j for j in jobs if j.proc.poll() is None]
            if not alive:
                break
            for j in alive:
                j.proc.send_signal(sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(j.proc.poll() is None for j in alive):
                time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        # The children live in their own sessions, so nothing else would ever stop them.
        for j in jobs:
            if j.proc.poll() is None:
                j.proc.kill()
            j.proc.wait()
            if j.log is not None:
                j.log.close()


def _execute(
    runs: Sequence[PlannedRun], jobs: int, board: SweepBoard, on_done, on_failure, on_tick, *, batch: int = 1, console: Console | None = None,
    tensorboard: Path | None = None,
) -> None:
    """Run ``runs`` with at most ``jobs`` processes at a time (each one run, or a batch of runs
    of the batched engine: :func:`plan_batches`), calling ``on_done(run)`` or
    ``on_failure(run, reason, log_tail)`` as each ends, and ``on_tick()`` on every pass of the
    polling loop. A batch that fails has its unfinished runs run again one by one, so that one
    broken run does not fail the others.

    On KeyboardInterrupt every running child is stopped and the interrupt re-raised; finished
    runs are left as they are.
    """
    queue = deque(plan_batches(runs, jobs, batch))
    running: list[_Job] = []
    env = _child_env()
    forker = _BatchForker(env, board.console)
    next_progress = time.monotonic()
    try:
        while queue or running:
            while queue and len(running) < jobs:
                group = queue.popleft()
                for run in group:
                    run.folder.mkdir(parents=True, exist_ok=True)
                    (run.folder / REQUEST_FILE).write_text(run.toml, encoding="utf-8")
                head = group[0]
                for run in group[1:]:
                    (run.folder / LOG_FILE).write_text(f"run in a batch of {len(group)} runs; its log: ../{head.name}/{LOG_FILE}\n", encoding="utf-8")
                # `dfedrw run` writes where it is told; a batch puts each run in DIR/<its folder name> itself.
                board_flag = [] if tensorboard is None else ["--tensorboard", str(Path(tensorboard) / head.name) if len(group) == 1 else str(tensorboard)]
                proc = forker.start(batch_arguments(group) + board_flag, head.folder / LOG_FILE) if len(group) > 1 else None
                log = None
                if proc is None:
                    log = (head.folder / LOG_FILE).open("wb")
                    command = child_command(head.folder / REQUEST_FILE, head.folder) if len(group) == 1 else batch_command(group)
                    proc = subprocess.Popen(
                        command + board_flag, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                        # Its own session: a Ctrl-C at the terminal reaches only the sweep, which
                        # then stops each child in order (a forked batch has its own session too).
                        start_new_session=True,
                    )
                for run in group:
                    (run.folder / PID_FILE).write_text(str(proc.pid))
                job = _Job(group, proc, log, time.monotonic())
                running.append(job)
                for run in group:
                    board.started(run, id(job))
            for job in list(running):
                rc = job.proc.poll()
                if rc is None:
                    continue
                running.remove(job)
                if job.log is not None:
                    job.log.close()
                seconds = (time.monotonic() - job.start) / len(job.runs)
                for run in job.runs:
                    (run.folder / PID_FILE).unlink(missing_ok=True)
                queue.extend([run] for run in settle(job.runs, rc, seconds, board, on_done, on_failure, console=console, tensorboard=tensorboard))
            now = time.monotonic()
            if now >= next_progress:
                next_progress = now + _PROGRESS_EVERY
                for job in running:
                    fraction = rounds_done(job.runs[0].folder / LOG_FILE)
                    if fraction is not None:
                        board.progress(id(job), fraction)
            board.refresh()
            on_tick()
            if running:
                time.sleep(_POLL)
    except KeyboardInterrupt:
        board.console.print("interrupted: stopping the running runs (finished runs are kept)", markup=False, soft_wrap=True)
        _stop(running)
        raise
    finally:
        forker.close()


def run_sweep(
    grid_path: str | Path,
    out_dir: str | Path,
    *,
    jobs: int | None = None,
    batch: int = DEFAULT_BATCH,
    dry_run: bool = False,
    console: Console | None = None,
    check_runnable: bool = True,
    tensorboard: Path | None = None,
    ray: str | None = None,
) -> SweepResult:
    """Run every distinct scenario of a grid under ``out_dir`` (see the module docstring).

    Finished runs are skipped, interrupted ones redone; up to ``jobs`` processes at a time,
    each a ``dfedrw run`` subprocess or, for runs of the batched engine, a batch of up to
    ``batch`` runs of one shape (:func:`plan_batches`). Returns counts, failures and wall time;
    the caller maps :attr:`SweepResult.exit_code` to the process exit status. ``ray``: run the
    batches on the Ray cluster at that address (``""``: ``RAY_ADDRESS`` or ``auto``), up to
    ``jobs`` (default: the cluster's CPUs) at a time (:mod:`experiments.sweep_ray`).
    """
    console = console or Console(stderr=True)
    if jobs is not None and jobs < 1:
        raise SweepError(f"--jobs {jobs}: must be at least 1")
    if batch < 1:
        raise SweepError(f"--batch {batch}: must be at least 1")
    grid = load_grid(grid_path)
    plan = plan_sweep(grid, out_dir, check_runnable=check_runnable and not dry_run, here=ray is None)
    check_same_grid(plan)
    warn_unused(plan, console)
    result = SweepResult(plan.out_dir, total=len(plan.runs))
    if dry_run:
        print_plan(plan)
        return result
    cluster = None
    if ray is not None:
        from dfedrw.experiments.sweep_ray import RayCluster

        cluster = RayCluster.connect(ray or None)
        console.print(f"Ray cluster {cluster.address}: {cluster.nodes} node(s), {cluster.cpus} CPU(s)", markup=False, highlight=False, soft_wrap=True)
    try:
        jobs = jobs or (cluster.cpus if cluster is not None else os.cpu_count()) or 1
        if cluster is not None:
            from dfedrw.experiments.sweep_ray import check_fits, ray_batches

            check_fits(ray_batches(list(plan.runs.values()), jobs, batch), cluster)  # before anything is submitted
        plan.out_dir.mkdir(parents=True, exist_ok=True)
        with sweep_lock(plan.out_dir):
            return _run_plan(plan, jobs, console, result, batch=batch, tensorboard=tensorboard, cluster=cluster)
    finally:
        if cluster is not None:
            cluster.close()


def _run_plan(plan: Plan, jobs: int, console: Console, result: SweepResult, *, batch: int = 1, tensorboard: Path | None = None, cluster=None) -> SweepResult:
    orphans = {run.name: pid for run in plan.runs.values() if (pid := still_running(run.folder)) is not None}
    if orphans:
        listed = ", ".join(f"{name} (pid {pid})" for name, pid in orphans.items())
        raise SweepError(
            f"{len(orphans)} run(s) in {plan.out_dir} are still running from a sweep that was killed "
            f"without stopping them: {listed}; wait for them to end or stop them (kill -INT PID), then run again"
        )
    statuses: dict[str, str] = {}
    to_run: list[PlannedRun] = []
    prior_seconds: list[float] = []
    for key, run in plan.runs.items():
        state = run_state(run.folder, run.scenario)
        if state == "done":
            statuses[key] = "done"
            result.skipped += 1
            seconds = run_seconds(run.folder)
            if seconds is not None:
                prior_seconds.append(seconds)
        elif state == "different":
            statuses[key] = "failed"
            result.failures.append(Failure(
                run.name, [plan.points[i].describe() for i in run.points],
                f"{run.folder} holds a finished run of a different scenario; move it away to rerun this one",
            ))
        else:
            if state == "unfinished":
                # Clients append to their JSONL files, so leftovers would mix two runs.
                _clear(run, tensorboard)
            to_run.append(run)

    sittings = previous_sittings(plan.out_dir)
    nodes = previous_nodes(plan)  # where each run ran, on a Ray cluster
    sitting: dict[str, Any] = {"start": now_text(), "jobs": jobs, "batch": batch, "runs_total": len(plan.runs)}
    if cluster is not None:
        sitting["ray"] = cluster.address
    sittings.append(sitting)
    start = time.monotonic()
    last_save = start

    def save(final: bool = False) -> None:
        # Written at every finished run and once a minute, so that a sweep killed outright
        # (no chance to write its final entry) still counts its time up to the last save.
        nonlocal last_save
        result.wall_seconds = time.monotonic() - start
        sitting.update(
            end=now_text(), wall_seconds=round(result.wall_seconds, 3), runs_done=result.done,
            runs_skipped=result.skipped, runs_failed=len(result.failures),
            interrupted=result.interrupted if final else None,
        )
        record = sweep_record(plan, statuses, sittings, nodes)
        result.total_wall_seconds = record["wall_seconds"]
        write_json_atomic(plan.out_dir / SWEEP_FILE, record)
        last_save = time.monotonic()

    save()

    def on_tick() -> None:
        if time.monotonic() - last_save >= _CHECKPOINT_EVERY:
            save()

    def on_done(run: PlannedRun) -> None:
        # The compact record (curves, mean weights) that the report and `dfedrw export` read:
        # every run writes it with its summary; built here only where it is missing (without it
        # they rebuild it from the per-round files, so a failure here is not fatal).
        try:
            if read_record(run.folder) is None:
                write_record(run.folder)
        except (OSError, ValueError) as exc:
            console.print(f"run {run.name}: could not write its record.json ({exc})", markup=False, highlight=False, soft_wrap=True)
        statuses[run.key] = "done"
        result.done += 1
        save()

    def on_failure(run: PlannedRun, reason: str, tail: str) -> None:
        statuses[run.key] = "failed"
        result.failures.append(Failure(run.name, [plan.points[i].describe() for i in run.points], reason, tail))
        save()
        console.print(f"run {run.name} failed ({reason}); last lines of {run.folder / LOG_FILE}:\n{tail}", markup=False, highlight=False, soft_wrap=True)

    console.print(
        f"sweep: {len(plan.points)} points, {len(plan.runs)} distinct runs, {result.skipped} already done, "
        f"{len(to_run)} to run, {jobs} at a time; results in {plan.out_dir}",
        markup=False, highlight=False, soft_wrap=True,
    )
    restore = _sigterm_as_interrupt()
    try:
        with SweepBoard(console, len(plan.runs), result.skipped, jobs=jobs, prior_seconds=prior_seconds) as board:
            if cluster is None:
                _execute(to_run, jobs, board, on_done, on_failure, on_tick, batch=batch, console=console, tensorboard=tensorboard)
            else:
                from dfedrw.experiments.sweep_ray import execute_on_ray

                execute_on_ray(cluster, to_run, jobs, board, on_done, on_failure, on_tick, batch=batch, console=console, tensorboard=tensorboard, nodes=nodes)
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        restore()
        save(final=True)

    console.print(
        f"sweep wall time: {seconds_text(result.wall_seconds)} this sitting, {seconds_text(result.total_wall_seconds)} "
        f"over {len(sittings)} sitting(s); {result.done} run, {result.skipped} skipped, {len(result.failures)} failed"
        + (" (interrupted)" if result.interrupted else ""),
        markup=False, highlight=False, soft_wrap=True,
    )
    if result.failures:
        console.print("failed runs:", markup=False, soft_wrap=True)
        for f in result.failures:
            console.print(f"  {f.run}: {f.reason} [points: {'; '.join(f.points)}]", markup=False, highlight=False, soft_wrap=True)
    return result


def _sigterm_as_interrupt():
    """Make SIGTERM stop the sweep the way Ctrl-C does (children stopped, results kept)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)
