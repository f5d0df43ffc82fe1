"""Several hosts on one machine: Linux network namespaces joined by a bridge.

    with Lab(hosts=3) as lab:
        proc = lab.run(0, [python, "-m", "dfedrw.peer", ...], env=env, log=path)
        lab.cut(1)            # host 1 drops off the network (its link goes down)
        lab.packet_loss(20)   # every host drops 20% of the packets it receives

Layout, for a lab tagged ``dfrw-<pid>-<n>``:

    dfrw-<pid>-<n>-br   bridge namespace: br0, and one port h<k> per host (no address)
    dfrw-<pid>-<n>-h<k> host k: eth0 = 10.201.<x>.<k+1>/24, the other end of port h<k>; lo up

Safety: the root namespace gets no address in the lab subnet and no route into it; every
veth is created inside the lab's own namespaces (``ip -n``), so not even an interface of the
lab appears in the root namespace. Processes started by :meth:`Lab.run` live in a host
namespace and can reach only the other hosts of the same lab and their own loopback.

Packet loss uses nftables (``numgen random``), or iptables' statistic module when nft is
missing, on the input path of each host's eth0: ``tc netem`` is not available on every kernel,
and a filter rule drops packets the same way for every protocol. Only packets arriving from
the lab network are dropped, never a host's loopback traffic.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from dfedrw.launch.procs import pid_alive

# Host interface name inside each host namespace; the same in every host so that a program
# (e.g. gloo's GLOO_SOCKET_IFNAME) can be told which interface faces the lab network.
HOST_IF = "eth0"
BRIDGE_IF = "br0"
PREFIX = "dfrw-"
_NFT_TABLE = "dfrw_lab"
_IP_TIMEOUT = 20.0
_labs = itertools.count()


class LabError(RuntimeError):
    """A lab command failed; the message carries the command and its stderr."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _cmd(["ip", *args], check=check)


def _cmd(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=_IP_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{' '.join(argv)}: no answer in {_IP_TIMEOUT:.0f} s") from exc
    if check and done.returncode != 0:
        raise LabError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def _netns_names() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    # Lines look like "name" or "name (id: 3)".
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def filter_backend() -> str | None:
    """``"nft"``, ``"iptables"``, or None when neither is installed."""
    if shutil.which("nft"):
        return "nft"
    if shutil.which("iptables"):
        return "iptables"
    return None


def unusable_reason() -> str | None:
    """Why a lab cannot be built on this machine, or None when it can.

    Checks root, ``ip``, a packet filter for loss injection, and then really builds and removes
    a two-namespace veth pair, since containers often refuse namespaces to root as well.
    """
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if filter_backend() is None:
        return "neither nft nor iptables is installed (apt-get install -y nftables)"
    a, b = f"{PREFIX}{os.getpid()}-probe-a", f"{PREFIX}{os.getpid()}-probe-b"
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
        _ip("-n", a, "link", "add", HOST_IF, "type", "veth", "peer", "name", "p0", "netns", b)
        _ip("-n", b, "link", "add", BRIDGE_IF, "type", "bridge")
    except LabError as exc:
        return f"cannot build network namespaces here: {exc}"
    finally:
        for ns in (a, b):
            _ip("netns", "del", ns, check=False)
    return None


def remove_stale_labs() -> list[str]:
    """Delete ``dfrw-<pid>-...`` namespaces whose creating process is gone; returns their names.

    Processes still inside such a namespace are left alone (this process did not start them);
    with the bridge namespace gone they cannot reach anything but their own loopback.
    """
    removed = []
    for name in _netns_names():
        m = re.match(rf"{re.escape(PREFIX)}(\d+)-", name)
        if m is None:
            continue
        pid = int(m.group(1))
        if pid != os.getpid() and not pid_alive(pid):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    return removed


class Lab:
    """``hosts`` network namespaces on one bridge; a context manager that always tears down.

    Host k has address :meth:`address` (k) on its ``eth0``. Everything the lab starts is
    recorded by PID and stopped at teardown.
    """

    def __init__(self, hosts: int, *, subnet: int | None = None) -> None:
        if not 1 <= hosts <= 250:
            raise ValueError(f"hosts must be in 1..250, got {hosts}")
        self.hosts = hosts
        self.tag = f"{PREFIX}{os.getpid()}-{next(_labs)}"
        # Each lab has its own bridge, so subnets never meet; deriving the subnet from the pid
        # only makes logs of parallel runs easier to tell apart.
        self.subnet = subnet if subnet is not None else os.getpid() % 250 + 1
        if not 0 <= self.subnet <= 255:
            raise ValueError(f"subnet must be in 0..255, got {self.subnet}")
        self.backend = filter_backend()
        self.procs: list[subprocess.Popen] = []
        self._created: list[str] = []

    # -- names -----------------------------------------------------------------------------
    @property
    def bridge_ns(self) -> str:
        return f"{self.tag}-br"

    def ns(self, k: int) -> str:
        self._check_host(k)
        return f"{self.tag}-h{k}"

    def address(self, k: int) -> str:
        self._check_host(k)
        return f"10.201.{self.subnet}.{k + 1}"

    def _check_host(self, k: int) -> None:
        if not 0 <= k < self.hosts:
            raise ValueError(f"host {k} out of range 0..{self.hosts - 1}")

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Lab:
        try:
            self.setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for problem in self.teardown():
            warnings.warn(f"lab {self.tag}: {problem}", RuntimeWarning, stacklevel=2)

    def setup(self) -> None:
        remove_stale_labs()
        br = self.bridge_ns
        self._add_ns(br)
        _ip("-n", br, "link", "add", BRIDGE_IF, "type", "bridge")
        _ip("-n", br, "link", "set", BRIDGE_IF, "up")
        for k in range(self.hosts):
            ns = self.ns(k)
            self._add_ns(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "add", HOST_IF, "type", "veth", "peer", "name", f"h{k}", "netns", br)
            _ip("-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", HOST_IF)
            _ip("-n", br, "link", "set", f"h{k}", "master", BRIDGE_IF)
            self.restore(k)

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)

    def teardown(self, grace: float = 5.0) -> list[str]:
        """Stop what the lab started, then delete its namespaces. Returns problems met (never
        raises, so the exception that ended a test is the one reported)."""
        problems: list[str] = []
        for proc in self.procs:
            self.stop(proc, grace)
        # Children of recorded processes (e.g. torchrun's workers) that outlived them: they are
        # in this lab's namespaces, which nothing but this lab enters.
        for ns in self._created:
            for pid in self._pids_in(ns):
                problems.append(f"pid {pid} was still running in {ns}; killed")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for ns in reversed(self._created):
            done = _ip("netns", "del", ns, check=False)
            if done.returncode != 0:
                problems.append(f"ip netns del {ns}: {done.stderr.strip()}")
        self._created.clear()
        return problems

    @staticmethod
    def _pids_in(ns: str) -> list[int]:
        out = _ip("netns", "pids", ns, check=False).stdout
        return [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]

    # -- processes -------------------------------------------------------------------------
    def run(
        self,
        k: int,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        *,
        cwd: Path | None = None,
    ) -> subprocess.Popen:
        """Start ``argv`` inside host k's namespace; its output goes to ``log`` (or is dropped).

        ``ip netns exec`` execs the command in place, so the Popen's pid is the command's own.
        """
        cmd = ["ip", "netns", "exec", self.ns(k), *argv]
        out = open(log, "ab") if log is not None else subprocess.DEVNULL
        try:
            # A session of its own: Ctrl-C reaches the test only, which then stops everything here.
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
            )
        finally:
            if log is not None:
                out.close()
        self.procs.append(proc)
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen, grace: float = 5.0) -> int:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns the exit code."""
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=grace)
        return proc.returncode

    # -- faults ----------------------------------------------------------------------------
    def cut(self, k: int) -> None:
        """Take host k off the network: both ends of its link go down, so nothing it sends
        leaves and nothing reaches it (no reset either: peers see silence, as with a pulled cable)."""
        _ip("-n", self.ns(k), "link", "set", HOST_IF, "down")
        _ip("-n", self.bridge_ns, "link", "set", f"h{k}", "down")

    def restore(self, k: int) -> None:
        _ip("-n", self.bridge_ns, "link", "set", f"h{k}", "up")
        _ip("-n", self.ns(k), "link", "set", HOST_IF, "up")

    def is_up(self, k: int) -> bool:
        out = _ip("-n", self.ns(k), "-j", "link", "show", HOST_IF).stdout
        return "UP" in json.loads(out)[0].get("flags", [])

    def packet_loss(self, percent: float) -> None:
        """Every host drops ``percent`` % of the packets arriving on its eth0, independently at
        random; 0 removes the rule. Replaces any earlier setting."""
        if not 0 <= percent <= 100:
            raise ValueError(f"percent must be in 0..100, got {percent}")
        for k in range(self.hosts):
            if self.backend == "nft":
                self._nft_loss(k, percent)
            elif self.backend == "iptables":
                self._iptables_loss(k, percent)
            else:
                raise LabError("no packet filter (nft or iptables) installed")

    def _nft_loss(self, k: int, percent: float) -> None:
        ns = self.ns(k)
        _cmd(["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", _NFT_TABLE], check=False)
        if percent == 0:
            return
        # numgen draws from 0..9999 so fractional percents keep two decimals.
        threshold = round(percent * 100)
        match = f"numgen random mod 10000 < {threshold} " if threshold < 10000 else ""
        rules = (
            f"table inet {_NFT_TABLE} {{\n"
            f"  chain input {{\n"
            f"    type filter hook input priority 0; policy accept;\n"
            f"    iifname \"{HOST_IF}\" {match}counter drop\n"
            f"  }}\n"
            f"}}\n"
        )
        done = subprocess.run(
            ["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, capture_output=True, text=True, timeout=_IP_TIMEOUT
        )
        if done.returncode != 0:
            raise LabError(f"nft in {ns}: {done.stderr.strip()}")

    def _iptables_loss(self, k: int, percent: float) -> None:
        ns = self.ns(k)
        base = ["ip", "netns", "exec", ns, "iptables"]
        rule = ["INPUT", "-i", HOST_IF, "-m", "statistic", "--mode", "random"]
        # Delete every copy a previous call left (bounded: one per earlier call at most).
        for _ in range(100):
            listed = _cmd([*base, "-S", "INPUT"]).stdout
            m = re.search(r"^-A (INPUT -i .* -m statistic .*)$", listed, re.M)
            if m is None:
                break
            _cmd([*base, "-D", *m.group(1).split()])
        if percent > 0:
            _cmd([*base, "-A", *rule, "--probability", f"{percent / 100:.4f}", "-j", "DROP"])

    def dropped_packets(self) -> int:
        """Packets the loss rules dropped so far, over all hosts (0 with no rule)."""
        total = 0
        for k in range(self.hosts):
            ns = self.ns(k)
            if self.backend == "nft":
                done = _cmd(["ip", "netns", "exec", ns, "nft", "list", "table", "inet", _NFT_TABLE], check=False)
                total += sum(int(n) for n in re.findall(r"counter packets (\d+)", done.stdout))
            elif self.backend == "iptables":
                done = _cmd(["ip", "netns", "exec", ns, "iptables", "-L", "INPUT", "-v", "-x", "-n"], check=False)
                for line in done.stdout.splitlines():
                    if "statistic" in line:
                        total += int(line.split()[0])
        return total
