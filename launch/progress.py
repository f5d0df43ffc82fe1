"""Live progress of a run, fed by client telemetry events (rich bars on a terminal, a plain
line every few seconds otherwise, e.g. in CI logs)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class ProgressBoard:
    def __init__(self, console: Console, roles: dict[int, str], rounds: int, *, plain_every: float = 10.0) -> None:
        self.console = console
        self.rounds = rounds
        self.interactive = console.is_terminal
        self._plain_every = plain_every
        self._next_plain = 0.0
        self._start = time.monotonic()
        self.round = {k: -1 for k in roles}
        self.last: dict[int, dict[str, Any]] = {k: {} for k in roles}
        self.status: dict[int, str] = {k: "starting" for k in roles}
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
            console=console, disable=not self.interactive,
        )
        self._tasks = {k: self._progress.add_task(f"client {k:>3} {role:<9}", total=rounds, info="starting") for k, role in roles.items()}

    def __enter__(self) -> "ProgressBoard":
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def event(self, msg: dict[str, Any]) -> None:
        # Events come from other processes: every field is checked here too, so an ill-typed
        # one is ignored rather than breaking the board (bool is an int to isinstance).
        k = msg.get("id")
        if not _is_int(k) or k not in self.round:
            return
        kind = msg.get("type")
        if kind == "round":
            r = msg.get("round")
            if not _is_int(r) or not 0 <= r < self.rounds:
                return
            self.round[k] = r
            self.last[k] = {key: msg[key] for key in ("train_loss", "accuracy") if _is_number(msg.get(key))}
            self.status[k] = "running"
        elif kind == "done":
            self.round[k] = self.rounds - 1
            self.status[k] = "done"

    def set_status(self, k: int, text: str) -> None:
        self.status[k] = text

    def _info(self, k: int) -> str:
        last = self.last[k]
        parts = []
        if "train_loss" in last:
            parts.append(f"loss {last['train_loss']:.3f}")
        if "accuracy" in last:
            parts.append(f"acc {last['accuracy']:.1f}%")
        status = self.status[k]
        if status not in ("running", "done") or not parts:
            parts.append(status)
        return " ".join(parts)

    def refresh(self) -> None:
        for k, task in self._tasks.items():
            self._progress.update(task, completed=self.round[k] + 1, info=self._info(k))
        now = time.monotonic()
        if not self.interactive and now >= self._next_plain:
            self._next_plain = now + self._plain_every
            done = [r + 1 for k, r in self.round.items() if self.status[k] in ("running", "done", "starting")]
            self.console.print(
                f"[{now - self._start:7.1f}s] rounds done: slowest {min(done, default=0)}/{self.rounds}, fastest {max(done, default=0)}/{self.rounds}"
            )


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    # Bounded ints only: formatting a huge int as a float overflows.
    return isinstance(x, float) or (_is_int(x) and abs(x) < 2**53)
