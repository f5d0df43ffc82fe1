"""A sweep's live board: runs done, running, skipped and failed, with an ETA from the runs
finished so far."""

from __future__ import annotations
import time
from collections.abc import Sequence
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
        # Run times for the ETA: the runs finished in earlier sittings and in this one.
        self._seconds: list[float] = list(prior_seconds)
        self._started: dict[str, float] = {}
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
        """Remaining work over the parallelism: the runs not started take the mean run time
        each, a running one what is left of the mean (nothing once it is past it)."""
        remaining = self.to_run - self.done - self.failed
        if remaining <= 0:
            return "0s"
        if not self._seconds:
            return "?"
        mean = sum(self._seconds) / len(self._seconds)
        now = time.monotonic()
        left_running = [max(mean - (now - t), 0.0) for t in self._started.values()]
        work = (remaining - len(left_running)) * mean + sum(left_running)
        if work <= 0:
            return "?"  # only runs already past the mean run time are left: no telling when
        return seconds_text(max(work / self.jobs, max(left_running, default=0.0)))

    def info(self) -> str:
        return f"done {self.done} · skipped {self.skipped} · running {self.running} · failed {self.failed}"

    def line(self, text: str) -> None:
        self.console.print(f"[{self.elapsed():7.1f}s] {text}", highlight=False, markup=False, soft_wrap=True)

    def started(self, run: PlannedRun) -> None:
        self.running += 1
        self._started[run.key] = time.monotonic()
        if not self.interactive:
            self.line(f"start {run.name} ({run.scenario.engine.name} engine)")

    def finished(self, run: PlannedRun, ok: bool, seconds: float, *, retried: bool = False) -> None:
        """``seconds``: the run's share of its process's time (a batch's time over its runs).
        ``retried``: its batch failed before it finished; it is queued to run alone."""
        self.running -= 1
        self._started.pop(run.key, None)
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


def seconds_text(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
