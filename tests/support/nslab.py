"""What the tests' clusters share (tests/support/ray_lab.py, tests/support/slurm_lab.py): a network
namespace of their own named ``dfrw-<pid>-<kind><n>``, a short temporary folder, and stopping
every process in the namespace (all of them started there by the lab) by its PID, then removing
the namespace and the folder."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

_labs = itertools.count(1)


class NamespaceLab:
    """Subclasses start their processes in :attr:`ns` in :meth:`start`."""

    kind = "lab"

    def __init__(self) -> None:
        self.ns = f"dfrw-{os.getpid()}-{self.kind}{next(_labs)}"
        # Short: daemons put sockets under it, and a socket's path is at most 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix=self.kind[:2], dir="/tmp"))

    def start(self) -> NamespaceLab:
        raise NotImplementedError

    def _pids(self) -> set[int]:
        """The processes in the namespace now."""
        done = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True, timeout=20)
        return {int(p) for p in done.stdout.split()}

    def _others(self) -> set[int]:
        """Processes of the lab outside the namespace's list (still starting, say): none here."""
        return set()

    def close(self) -> None:
        """Stop every process in the namespace (SIGTERM, then SIGKILL), then remove it and the folder."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self._pids() | self._others()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while pids and time.monotonic() < deadline:
                time.sleep(0.2)
                pids = self._pids() | self._others()
            if not pids:
                break
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=20)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()
