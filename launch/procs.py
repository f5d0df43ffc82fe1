"""Small helpers about OS processes, shared by the launchers and the sweep."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
