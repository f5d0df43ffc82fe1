"""Small helpers about OS processes, shared by the launchers and the sweep."""

from __future__ import annotations

import os
import signal


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def stop_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, which stops every child and records the stop.

    Set explicitly because the inherited disposition cannot be trusted: a background job of a
    non-interactive shell starts with SIGINT ignored, and Python then installs no handler, so
    Ctrl-C or ``kill -INT`` would be lost. A handler (unlike SIG_IGN) is reset at exec, so the
    processes started from here get the default disposition back.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
