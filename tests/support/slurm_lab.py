"""A one-node Slurm cluster for the tests, from Debian's ``slurm-wlm`` and ``munge``: munged,
slurmctld and slurmd on loopback in a network namespace of the test's, with a configuration,
state and key of their own under a temporary folder, stopped by their PIDs.

    with SlurmLab() as lab:
        job = lab.submit(script)            # sbatch, inside the namespace
        lab.steps(job)                      # {step name: step id}
        lab.run(["scancel", f"{job}.{step}"])
        lab.wait(job, timeout=600)

No cgroups: processes are tracked by ``proctrack/linuxproc`` and tasks are not bound
(``task/none``). The daemons enter only the namespace's network (``nsenter --net``), so they see
the machine's own ``/sys``. Besides ``lo`` the namespace has a veth pair with a private address
of its own (10.254.0.1/30, both ends inside it): Slurm resolves addresses with
``AI_ADDRCONFIG``, which finds no IPv4 address on a host whose only one is loopback. Nothing
leaves the namespace. The node offers 16 CPUs (``SlurmdParameters=config_overrides``), so
that a job of 12 one-CPU tasks runs on this 2-core machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.support.nslab import NamespaceLab

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sinfo", "nsenter")
_TIMEOUT = 60.0

CONF = """\
ClusterName=dfedrwtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=16 RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def unusable_reason() -> str | None:
    """Why a Slurm lab cannot start here, or None."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "a Slurm lab needs root (its daemons and a network namespace)"
    missing = [name for name in (*DAEMONS, "ip") if shutil.which(name) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install slurm-wlm munge iproute2)"
    return None


class SlurmLab(NamespaceLab):
    kind = "slurm"

    def __init__(self) -> None:
        super().__init__()
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.daemons: list[subprocess.Popen] = []

    def command(self, argv: Sequence[str]) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.ns}", *argv]

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", _TIMEOUT)
        return subprocess.run(self.command(argv), env=self.env, **kwargs)

    def _daemon(self, argv: Sequence[str], log: str) -> None:
        with open(self.root / log, "wb") as out:
            self.daemons.append(subprocess.Popen(self.command(argv), env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    def start(self) -> SlurmLab:
        for sub in ("state", "spool"):
            (self.root / sub).mkdir()
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(CONF.format(root=self.root))
        for argv in (
            ["ip", "netns", "add", self.ns],
            ["ip", "-n", self.ns, "link", "set", "lo", "up"],
            ["ip", "-n", self.ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
            ["ip", "-n", self.ns, "addr", "add", "10.254.0.1/30", "dev", "v0"],
            ["ip", "-n", self.ns, "link", "set", "v0", "up"],
            ["ip", "-n", self.ns, "link", "set", "v1", "up"],
        ):
            subprocess.run(argv, check=True, capture_output=True, timeout=20)
        r = str(self.root)
        self._daemon(
            ["munged", "--force", "--foreground", f"--socket={r}/munge.sock", f"--key-file={r}/munge.key", f"--pid-file={r}/munged.pid",
             f"--seed-file={r}/munged.seed", f"--log-file={r}/munged.log", "--origin=127.0.0.1"],
            "munged.out",
        )
        self._wait_for(lambda: (self.root / "munge.sock").exists(), "munged's socket")
        self._daemon(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld.out")
        self._daemon(["slurmd", "-D", "-N", "localhost", "-f", str(self.conf)], "slurmd.out")
        self._wait_for(lambda: self.run(["sinfo", "-h", "-o", "%T"]).stdout.strip() == "idle", "the node to be idle")
        return self

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + _TIMEOUT
        while time.monotonic() < deadline:
            if any(d.poll() is not None for d in self.daemons):
                break
            if ready():
                return
            time.sleep(0.3)
        logs = "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(self.root.glob("*.out")))
        raise RuntimeError(f"Slurm lab: no {what} within {_TIMEOUT:.0f} s\n{logs}")

    # -- jobs ----------------------------------------------------------------------------------
    def submit(self, script: Path) -> int:
        done = self.run(["sbatch", "--parsable", str(script)])
        if done.returncode != 0:
            raise RuntimeError(f"sbatch {script}: {done.stderr}")
        return int(done.stdout.strip().split(";")[0])

    def steps(self, job: int) -> dict[str, str]:
        """The job's running steps: name -> step id (``JOB.N``)."""
        out = self.run(["squeue", "-s", "-j", str(job), "-h", "-o", "%i %j"]).stdout
        return {name: step for step, name in (line.split(None, 1) for line in out.splitlines() if line.strip())}

    def running(self, job: int) -> bool:
        return bool(self.run(["squeue", "-j", str(job), "-h", "-o", "%i"]).stdout.strip())

    def wait(self, job: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.running(job):
            if time.monotonic() > deadline:
                self.run(["scancel", str(job)])
                raise TimeoutError(f"Slurm job {job} still running after {timeout:.0f} s (cancelled)")
            time.sleep(1.0)

    # -- stopping --------------------------------------------------------------------------------
    def _others(self) -> set[int]:
        return {d.pid for d in self.daemons if d.poll() is None}

    def close(self) -> None:
        super().close()
        for d in self.daemons:
            d.wait(timeout=10)
