"""A sweep's live board: runs done, running, skipped and failed, with an ETA from the runs
finished so far and from how far the running processes have come."""

from __future__ import annotations
import os
import re
import time
from pathlib import Path
from collections.abc import Hashable, Sequence
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from dfedrw.experiments.sweep_plan import PlannedRun


class SweepBoard:
    """Sweep progress: a rich bar on a terminal, plain lines otherwise (one per finished run)."""

    def __init__(
        self, console: Console, total: int, skipped: int, *, jobs: int = 1,
        prior_seconds: Sequence[float] = (), heartbeat: float = 30.0,
    ) -> None:
        self.console = console
        self.total = total
        self.skipped = skipped
        self.done = 0
        self.failed = 0
        self.running = 0
        self.to_run = total - skipped
        self.jobs = max(1, jobs)
        # Run times for the ETA: the runs finished in earlier sittings and in this one, each a
        # run's share of its process's wall time (a batch's time over its runs).
        self._seconds: list[float] = list(prior_seconds)
        # The running processes ("jobs": one run, or a batch of runs): when each started, its
        # runs, and how far it has come (a fraction of its rounds, where it says).
        self._jobs: dict[Hashable, tuple[float, set[str]]] = {}
        self._job_of: dict[str, Hashable] = {}
        self._fraction: dict[Hashable, float] = {}
        # (when, fraction) of its first progress line, and of the last that moved the fraction
        self._first: dict[Hashable, tuple[float, float]] = {}
        self._last: dict[Hashable, tuple[float, float]] = {}
        self.interactive = console.is_terminal
        self._heartbeat = heartbeat
        self._start = time.monotonic()
        self._next_beat = self._start + heartbeat
        self._progress = Progress(
            TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
            console=console, disable=not self.interactive,
        )
        self._task = self._progress.add_task("sweep", total=total, completed=skipped, info="", eta="?")

    def __enter__(self) -> "SweepBoard":
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.refresh()
        self._progress.__exit__(*exc)

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def eta(self) -> str:
        """Remaining work over the parallelism, in process-seconds: a running process has left
        what its progress says (its rounds to go at the pace between its first progress line
        and its last, less the time since that last line, so that its start-up is not scaled
        up with its rounds) or, without two lines apart, what is left of the mean run time for
        each of its runs (nothing once past it); each run not started takes the mean run time, or, before any run has finished,
        the time the running processes' pace predicts per run."""
        remaining = self.to_run - self.done - self.failed
        if remaining <= 0:
            return "0s"
        now = time.monotonic()
        paced = {job: self._pace(job, now) for job in self._jobs}
        # per-run times the running processes' pace predicts: start-up and the rounds before
        # the first line as they went, the rest at the pace
        predicted = [pace[1] / len(self._jobs[job][1]) for job, pace in paced.items() if pace]
        seconds = self._seconds or predicted
        if not seconds:
            return "?"
        mean = sum(seconds) / len(seconds)
        left_running = []
        for job, (start, runs) in self._jobs.items():
            pace = paced[job]
            left_running.append(pace[0] if pace else max(mean * len(runs) - (now - start), 0.0))
        queued = remaining - sum(len(runs) for _, runs in self._jobs.values())
        work = queued * mean + sum(left_running)
        if work <= 0:
            if self._jobs and all(self._fraction.get(job, 0.0) >= 1.0 for job in self._jobs):
                return "0s"  # every round done: the processes are writing their results
            return "?"  # only runs already past the mean run time are left: no telling when
        return seconds_text(max(work / self.jobs, max(left_running, default=0.0)))

    def _pace(self, job: Hashable, now: float) -> tuple[float, float] | None:
        """(seconds left, seconds in all) of process ``job`` from its progress, or None while
        its first and last progress lines are less than ``_MIN_FRACTION`` of its rounds apart."""
        fraction = self._fraction.get(job)
        if fraction is None:
            return None
        start = self._jobs[job][0]
        if fraction >= 1.0:
            return 0.0, now - start
        first_at, first = self._first[job]
        last_at, last = self._last[job]
        if last - first < _MIN_FRACTION - 1e-9:
            return None
        # the pace between the two lines; the time since the last line is spent on what is left
        per_fraction = (last_at - first_at) / (last - first)
        left = max(per_fraction * (1.0 - last) - (now - last_at), 0.0)
        return left, (first_at - start) + per_fraction * (1.0 - first)

    def progress(self, job: Hashable, fraction: float) -> None:
        """Process ``job`` (see :meth:`started`) has done ``fraction`` of its rounds."""
        if job not in self._jobs:
            return
        fraction, now = min(max(fraction, 0.0), 1.0), time.monotonic()
        self._first.setdefault(job, (now, fraction))
        if fraction != self._fraction.get(job):  # a line read again does not move the pace's end
            self._last[job] = (now, fraction)
        self._fraction[job] = fraction

    def info(self) -> str:
        known = [self._fraction[j] for j in self._jobs if j in self._fraction]
        at = f" ({round(100 * sum(known) / len(known))} % of their rounds)" if known else ""
        return f"done {self.done} · skipped {self.skipped} · running {self.running}{at} · failed {self.failed}"

    def line(self, text: str) -> None:
        self.console.print(f"[{self.elapsed():7.1f}s] {text}", highlight=False, markup=False, soft_wrap=True)

    def started(self, run: PlannedRun, job: Hashable | None = None) -> None:
        """``run`` has started, in process ``job`` (the runs of a batch share one; by default
        a process of its own)."""
        self.running += 1
        job = run.key if job is None else job
        start, runs = self._jobs.get(job, (time.monotonic(), set()))
        runs.add(run.key)
        self._jobs[job] = (start, runs)
        self._job_of[run.key] = job
        if not self.interactive:
            self.line(f"start {run.name} ({run.scenario.engine.name} engine)")

    def finished(self, run: PlannedRun, ok: bool, seconds: float, *, retried: bool = False) -> None:
        """``seconds``: the run's share of its process's time (a batch's time over its runs).
        ``retried``: its batch failed before it finished; it is queued to run alone."""
        self.running -= 1
        job = self._job_of.pop(run.key, None)
        if job is not None:
            runs = self._jobs[job][1]
            runs.discard(run.key)
            if not runs:
                del self._jobs[job]
                self._fraction.pop(job, None)
                self._first.pop(job, None)
                self._last.pop(job, None)
        if retried:
            if not self.interactive:
                self.line(f"retry {run.name} alone (its batch failed)")
            return
        if ok:
            self._seconds.append(seconds)
            self.done += 1
        else:
            self.failed += 1
        if not self.interactive:
            word = "done" if ok else "FAILED"
            n = self.done + self.failed + self.skipped
            self.line(f"{word} {run.name} ({seconds:.1f} s); {n}/{self.total} · {self.info()} · ETA {self.eta()}")

    def refresh(self) -> None:
        n = self.done + self.failed + self.skipped
        self._progress.update(self._task, completed=n, info=self.info(), eta=self.eta())
        now = time.monotonic()
        if not self.interactive and now >= self._next_beat:
            self._next_beat = now + self._heartbeat
            self.line(f"{n}/{self.total} · {self.info()} · ETA {self.eta()}")


# The least progress between a process's first and last progress lines before its pace is
# taken from them.
_MIN_FRACTION = 0.02


def seconds_text(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


_ROUND_LINE = re.compile(rb"^round (\d+)/(\d+)\s*$", re.MULTILINE)


def rounds_done(log: Path) -> float | None:
    """The fraction of its rounds a running process has done, from the last ``round R/N`` line
    in the end of its log (the batched engine prints one every 2 % of the rounds); None
    where it printed none."""
    try:
        with log.open("rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4096))
            tail = fh.read()
    except OSError:
        return None
    found = _ROUND_LINE.findall(tail)
    if not found:
        return None
    done, total = (int(x) for x in found[-1])
    return done / total if total > 0 else None
