"""Running things from a test and waiting on them: polling for a condition, a console that
prints nowhere, a command run to completion in its own session."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Callable

from rich.console import Console


def wait_for(predicate: Callable[[], object], timeout: float, what: str, step: float = 0.2, detail: Callable[[], str] | None = None) -> None:
    """Polls ``predicate`` every ``step`` seconds until it is true; fails naming ``what`` (and
    ``detail()``, if given) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}" + (f"\n{detail()}" if detail else ""))


def quiet_console() -> Console:
    """A rich Console that prints nowhere."""
    return Console(file=open(os.devnull, "w"))


def run_job(cmd: list, *, cwd, timeout: float, env: dict | None = None) -> tuple[int, str]:
    """Run ``cmd`` (e.g. a torchrun job) in its own session to completion, bounded by
    ``timeout`` seconds; the whole session is killed if it outlives it. Returns (exit status,
    stdout and stderr together)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return proc.returncode, output
