"""How a sweep settles a process (or a Ray task) that ran a batch of runs: which runs are done,
which failed (with their log's tail), which run again one by one; and what an unfinished attempt
at a run leaves, cleared."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from dfedrw.experiments.sweep_board import SweepBoard
from dfedrw.experiments.sweep_plan import LOG_FILE, PlannedRun, run_state

_LOG_TAIL_LINES = 20


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def settle(
    runs: Sequence[PlannedRun], rc: int, seconds: float, board: SweepBoard, on_done, on_failure, *, console: Console | None = None,
    tensorboard: Path | None = None,
) -> list[PlannedRun]:
    """A process (or a Ray task) that ran ``runs`` ended with exit status ``rc``: each run that
    finished is done (in a batch, even if the batch then failed); a lone run that did not is a
    failure with its log's tail; the unfinished runs of a batch that failed are cleared and
    returned, to run again one by one, so that one broken run does not fail the others. The
    batch's log is its first run's."""
    head_log = runs[0].folder / LOG_FILE
    retry = []
    for run in runs:
        state = run_state(run.folder, run.scenario)
        ok = state == "done" and (rc == 0 or len(runs) > 1)
        if not ok and len(runs) > 1:
            board.finished(run, False, seconds, retried=True)
            retry.append(run)
        elif ok:
            board.finished(run, True, seconds)
            on_done(run)
        else:
            board.finished(run, False, seconds)
            reason = f"exit code {rc}" if rc != 0 else f"exit code 0 but the run folder is {state}"
            on_failure(run, reason, log_tail(head_log))
    if retry:
        if console is not None:
            console.print(
                f"a batch of {len(runs)} runs failed (exit code {rc}; log {head_log}); running its {len(retry)} "
                f"unfinished runs one by one:\n{log_tail(head_log, 5)}",
                markup=False, highlight=False, soft_wrap=True,
            )
        for run in retry:
            _clear(run, tensorboard)
    return retry


def _clear(run: PlannedRun, tensorboard: Path | None) -> None:
    """Delete what an unfinished attempt at ``run`` left (its folder, its event files)."""
    if run.folder.exists():
        shutil.rmtree(run.folder)
    if tensorboard is not None:
        shutil.rmtree(Path(tensorboard) / run.name, ignore_errors=True)
