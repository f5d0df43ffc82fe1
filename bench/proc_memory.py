"""Memory of a process tree, sampled from ``/proc`` (Linux): what the benches that start real
client processes share.

Per process: PSS (its private pages plus its share of the pages it shares: shared pages
divided among the processes that map them), RSS (every page it maps that is in memory) and USS
(the pages no other process maps), from ``/proc/PID/smaps_rollup``, and its thread count.
"""

from __future__ import annotations

import statistics
import threading
from pathlib import Path
from typing import NamedTuple


class Memory(NamedTuple):
    pss: int
    rss: int
    uss: int


def memory(pid: int) -> Memory | None:
    """PSS, RSS and USS of ``pid`` in bytes, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[-1] == "kB":
            fields[name] = int(parts[0]) * 1024
    return Memory(fields.get("Pss", 0), fields.get("Rss", 0), fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0))


def threads(pid: int) -> int:
    try:
        return len(list(Path(f"/proc/{pid}/task").iterdir()))
    except OSError:
        return 0


def descendants(root: int) -> list[int]:
    """Every process under ``root`` (from /proc/PID/task/*/children)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found.extend(children)
            todo.extend(children)
    return found


class Sampler(threading.Thread):
    """Samples the memory and threads of a process (a launcher) and its descendants every
    ``interval`` seconds until :attr:`stop` is set."""

    def __init__(self, root: int, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.interval = interval
        self.samples: dict[int, list[Memory]] = {}
        self.threads: dict[int, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for pid in [self.root, *descendants(self.root)]:
                now = memory(pid)
                if now is not None:
                    self.samples.setdefault(pid, []).append(now)
                    self.threads[pid] = max(self.threads.get(pid, 0), threads(pid))
            self.stop.wait(self.interval)

    def typical(self, pid: int) -> tuple[int, int] | None:
        """(PSS, USS) of ``pid`` over its life: the median of its samples. (Right after a fork
        a client shares its pages with fewer processes than it will, so one early sample is
        higher than what it holds; the median is what it holds while it runs.)"""
        got = self.samples.get(pid)
        if not got:
            return None
        return int(statistics.median(m.pss for m in got)), int(statistics.median(m.uss for m in got))

    def peak(self, pid: int) -> Memory | None:
        """The highest PSS, RSS and USS ``pid`` had in any sample (each its own maximum)."""
        got = self.samples.get(pid)
        if not got:
            return None
        return Memory(max(m.pss for m in got), max(m.rss for m in got), max(m.uss for m in got))
