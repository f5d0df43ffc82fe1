"""A real Ray cluster on this machine for the tests and the bench (bench/ray_sweep.py): a head
and worker nodes started with ``ray start``, each node its own raylet and daemons, all on
loopback inside a network namespace of their own, and stopped by their PIDs.

    with RayLab(workers=2) as lab:
        lab.run([dfedrw, "sweep", GRID, "--ray", lab.address, ...])   # inside the namespace
        lab.kill_node(1)                                              # node 1's processes, by PID

Why a namespace: Ray binds some of its servers to the host's first address whatever
``--node-ip-address`` says. Inside a namespace of ours with only ``lo`` up, that address is
127.0.0.1 and nothing can leave. Needs root and iproute2 (:func:`unusable_reason` says why not).
The head offers no CPU (``--num-cpus 0``), so that tasks run on the worker nodes.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.nslab import NamespaceLab

PORT = 6379
# Ray's own settings for a cluster on one machine: nodes marked dead within seconds of their
# raylet's end, and no usage report.
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_initial_delay_ms": "1000",
}
_START_TIMEOUT = 120.0
# The grid the tests and the bench run on a lab (format it with ``rounds``): 6 seeds x 2 rules x
# 2 attacks, 24 runs of softmax regression on digits, the batched engine.
GRID = """
set = ["engine.name=batched", "rounds={rounds}", "eval.every=100"]
[axes]
seed = [1, 2, 3, 4, 5, 6]
"aggregation.rule" = ["dfedavg", "dfedreweighting"]
"attack.name" = ["gaussian", "sign_flip"]
"""


def ray_bin() -> str | None:
    """The ``ray`` command beside this Python, or on the PATH."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else shutil.which("ray")


def unusable_reason() -> str | None:
    """Why a lab cannot start here, or None."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install 'dfedrw[ray]')"
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "a Ray lab needs Linux network namespaces, that is root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if ray_bin() is None:
        return "the ray command is not installed"
    name = f"dfrw-{os.getpid()}-probe-ray"
    done = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None if done.returncode == 0 else f"cannot make a network namespace here: {done.stderr.strip()}"


def _descendants(pids: set[int]) -> set[int]:
    """``pids`` and every live process below them."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo.extend(children.get(pid, []))
    return out


class RayLab(NamespaceLab):
    """A head and ``workers`` worker nodes (``cpus`` CPUs each; ``memory``: the bytes each offers
    tasks, Ray's default where None) in a network namespace of their own."""

    kind = "ray"

    def __init__(self, workers: int = 2, cpus: int = 1, memory: int | None = None) -> None:
        super().__init__()
        self.workers, self.cpus, self.memory = workers, cpus, memory
        self.address = f"127.0.0.1:{PORT}"
        self.nodes: list[set[int]] = []  # each node's daemons, head first
        self.env = {**os.environ, **RAY_ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    # -- the namespace -------------------------------------------------------------------
    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the lab's namespace."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), env=kwargs.pop("env", self.env), **kwargs)

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), env=kwargs.pop("env", self.env), **kwargs)

    # -- nodes ---------------------------------------------------------------------------------
    def _start_node(self, args: Sequence[str], mounts: Mapping[str, str | None] | None = None) -> None:
        before = self._pids()
        argv = [ray_bin(), "start", "--node-ip-address", "127.0.0.1", "--disable-usage-stats", *args]
        if mounts:
            # The node's own view of the file system: a mount namespace in which each folder
            # named is empty (None) or another folder.
            steps = [
                f"mount -t tmpfs tmpfs {shlex.quote(path)}" if other is None else f"mount --bind {shlex.quote(other)} {shlex.quote(path)}"
                for path, other in mounts.items()
            ]
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", " && ".join([*steps, "exec " + shlex.join(argv)])]
        done = self.run(argv, capture_output=True, text=True, timeout=_START_TIMEOUT)
        if done.returncode != 0:
            raise RuntimeError(f"ray start {' '.join(args)}: exit {done.returncode}: {done.stderr[-2000:]}")
        self.nodes.append(self._pids() - before)

    def start(self) -> RayLab:
        subprocess.run(["ip", "netns", "add", self.ns], check=True, capture_output=True, timeout=20)
        subprocess.run(["ip", "-n", self.ns, "link", "set", "lo", "up"], check=True, capture_output=True, timeout=20)
        self._start_node(["--head", "--port", str(PORT), "--num-cpus", "0", "--include-dashboard", "false", "--temp-dir", str(self.root)])
        for _ in range(self.workers):
            self.add_worker()
        return self

    def add_worker(self, mounts: Mapping[str, str | None] | None = None) -> int:
        """Start one more worker node; returns its index in :attr:`nodes`. ``mounts``: folders
        this node sees empty (None) or as another folder (a machine with other files)."""
        memory = [] if self.memory is None else ["--memory", str(self.memory)]
        self._start_node(["--address", self.address, "--num-cpus", str(self.cpus), *memory], mounts)
        return len(self.nodes) - 1

    def node_processes(self, index: int) -> set[int]:
        """Node ``index``'s processes now (its daemons and the workers they started)."""
        return _descendants(self.nodes[index]) & self._pids()

    def kill_node(self, index: int) -> list[int]:
        """Kill node ``index`` (0: the head) outright: its processes, by PID; returns them."""
        pids = sorted(self.node_processes(index))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids
