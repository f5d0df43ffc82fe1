"""The real network against its simulation, at length: the same scenario as client processes
(gRPC, mutual TLS) and in the batched engine, side by side.

    python bench/soak.py                                  # every case at full length (about an hour on 2 cores)
    python bench/soak.py --scenario ring --protocol async # one scenario and protocol, its four process cases
    python bench/soak.py --short --scenario ring           # the slow test's version (tests/multiprocess/test_soak.py)
    python bench/soak.py --json soak.json                 # the figures as JSON too

Scenarios: ``ring`` (digits, a ring of 6 honest clients, DFedAvg, no attack: the ring of issue
reports) and ``default`` (the built-in default scenario: 10 honest and 2 Gaussian clients,
DFedReweighting). Protocols: ``sync`` (3,000 rounds) and ``async`` (asynchronous gossip, 2,400
steps; the batched engine times its steps on the simulated clock, every client at the same
speed). For each scenario and protocol the batched engine runs once (the reference), then the
client processes four times: as they are; with one honest client killed (SIGKILL) a quarter of
the way in and started again with its command line ``--restart-after`` seconds later (it
resumes from its checkpoint; its process takes seconds more to start, ten under load, and an
asynchronous network runs on meanwhile: the run must be long enough for it to come back); with both cores kept busy by a bounded load generator (one
busy-looping process per core, each stopped at the end of the run, and after ``--max-seconds``
in any case); and with both.

Client processes are started as ``python -m dfedrw.peer`` with static addresses on loopback
(docs/several-hosts.md), each with its certificate of the run. Each row prints: the honest mean
and worst final accuracy and the gap to the batched engine's mean; the share of rounds (steps)
in which an honest client aggregated a neighbour's model (mean over the honest clients, the
lowest, and the restarted client's after its restart); honest senders an honest receiver shut
out for its rate bound (and every sender shut out, attackers included); rounds the lead bound
held back (docs/protocol.md); and the run's seconds. The process runs' warnings are those of
their ``summary.json``. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

SCENARIOS = {
    "ring": ["topology.kind=ring", "topology.honest=6", "topology.byzantine=0", "attack.name=none", "aggregation.rule=dfedavg"],
    "default": [],
}
LENGTHS = {"sync": 3000, "async": 2400}
# The slow test's lengths: past every burst (16 messages) and deadline, and long enough that a
# client restarted under load rejoins a running network. Its process start takes 7-8 s with both
# cores busy (more on a machine busier still), and meanwhile the other five go on at about 0.012 s
# a round (the dead one costs them nothing: its connection is refused): at 1,000 rounds the
# 750 after the kill took 9 s, and a restart that took longer found the network finished and
# ran its last rounds alone. At 3,000 rounds the restarted client ran 13 s (idle) to 23 s (both
# cores busy) beside the others. Asynchronous steps go faster (the 1,500 after the kill of a
# 2,000-step run took 13-19 s, and a restart on a busier machine came back after the network
# had ended). At 4,000 of each: about 25-40 s beside them.
SHORT = {"sync": 4000, "async": 4000}
# The batched engine times asynchronous steps on its clock: every client at this compute.
ASYNC_STEP_SECONDS = 0.01


def log(message: str) -> None:
    print(f"[soak] {message}", file=sys.stderr, flush=True)


@dataclass
class Case:
    scenario: str
    protocol: str
    engine: str  # "batched" or "processes"
    restart: bool = False
    load: bool = False

    @property
    def name(self) -> str:
        if self.engine == "batched":
            return f"{self.scenario}/{self.protocol}/batched"
        return f"{self.scenario}/{self.protocol}/processes" + ("+restart" if self.restart else "") + ("+load" if self.load else "")


@dataclass
class Figures:
    case: str
    rounds: int
    accuracy: float | None
    worst: float | None
    gap: float | None = None  # processes' mean minus the batched engine's, points
    with_neighbours: float | None = None  # mean share of rounds with a neighbour's model
    with_neighbours_min: float | None = None
    restarted_after: float | None = None  # the restarted client's share after its restart
    # Seconds the restarted client's loop ran while another honest client was still in its
    # loop: at or below 0 it came back to a network that had finished, with nobody to hear from.
    overlap: float | None = None
    honest_shut_out: int = 0
    shut_out: int = 0
    held_back: int = 0
    restarts: int = 0
    restarted: int | None = None  # the client killed and started again
    rounds_lost: int = 0
    seconds: float = 0.0
    failed: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def scenario_args(name: str, protocol: str, rounds: int, extra: list[str]) -> list[str]:
    args = [*SCENARIOS[name], f"rounds={rounds}", f"network.protocol={protocol}", *extra]
    return args


def free_ports(n: int) -> list[int]:
    """Loopback ports nobody listens on now, below the ephemeral range (a port bind(0) hands out
    could be taken meanwhile by an outgoing connection)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    ports: list[int] = []
    for _ in range(5000):
        if len(ports) == n:
            return ports
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    raise RuntimeError("no free loopback ports below the ephemeral range")


class Processes:
    """Client processes of one run, started by hand with static addresses, and their ends."""

    def __init__(self, out: Path, scenario_file: Path, certs: Path, n: int) -> None:
        self.out, self.scenario_file, self.certs = out, scenario_file, certs
        self.ports = free_ports(n)
        self.procs: dict[int, subprocess.Popen] = {}
        self.starts: dict[int, int] = {}
        (out / "logs").mkdir(parents=True, exist_ok=True)

    def argv(self, k: int) -> list[str]:
        book = [f"--peer={j}=127.0.0.1:{p}" for j, p in enumerate(self.ports)]
        return [
            sys.executable, "-m", "dfedrw.peer", "--scenario", str(self.scenario_file), "--id", str(k), "--out", str(self.out),
            "--listen-port", str(self.ports[k]), "--certs", str(self.certs), *book,
        ]

    def start(self, k: int) -> None:
        self.starts[k] = self.starts.get(k, 0) + 1
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        name = f"{k}.log" if self.starts[k] == 1 else f"{k}.{self.starts[k]}.log"
        with (self.out / "logs" / name).open("w") as out:
            self.procs[k] = subprocess.Popen(self.argv(k), cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)

    def kill(self, k: int) -> None:
        self.procs[k].send_signal(signal.SIGKILL)
        self.procs[k].wait(timeout=30)

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs.values())

    def exit_codes(self) -> dict[int, int | None]:
        return {k: p.poll() for k, p in self.procs.items()}

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        for p in self.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass


class Load:
    """One busy-looping process per core, each bounded in time (``seconds``), stopped by
    :meth:`stop` at the latest."""

    def __init__(self, cores: int, seconds: float) -> None:
        code = f"import time\nend = time.monotonic() + {float(seconds)!r}\nwhile time.monotonic() < end:\n    pass\n"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(cores)]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


def last_round(out: Path, k: int) -> int:
    from dfedrw.peer.results.records import read_rounds

    records = read_rounds(out, k)
    return records[-1]["round"] if records else -1


def run_processes(case: Case, args: list[str], out: Path, *, restart_after: float, max_seconds: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """One process run of ``case``: (its summary, what happened to the restarted client)."""
    from dfedrw.peer.config.scenario import dump_scenario, load_scenario
    from dfedrw.peer.results.collect import collect_summary
    from dfedrw.peer.transport.identity import make_certificates
    from dfedrw.peer.wiring.plan import scenario_topology

    scenario = load_scenario(None, args)
    topology = scenario_topology(scenario)
    n = topology.num_clients
    honest = [k for k in range(n) if k not in topology.byzantine]
    victim = honest[-1] if case.restart else None
    out.mkdir(parents=True, exist_ok=True)
    certs = out / "certs"
    make_certificates(n, certs)
    dump_scenario(scenario, out / "scenario.toml")
    procs = Processes(out, out / "scenario.toml", certs, n)
    load = Load(os.cpu_count() or 2, max_seconds) if case.load else None
    restart: dict[str, Any] = {}
    started = time.monotonic()
    try:
        for k in range(n):
            procs.start(k)
        deadline = started + max_seconds
        if victim is not None:
            kill_at = scenario.rounds // 4
            ckpt = out / "peers" / f"{victim}.ckpt.npz"
            while time.monotonic() < deadline and not (last_round(out, victim) >= kill_at and ckpt.exists()):
                if procs.procs[victim].poll() is not None:
                    break
                time.sleep(0.05)
            procs.kill(victim)
            restart["killed_after"] = last_round(out, victim)
            log(f"{case.name}: client {victim} killed after round {restart['killed_after']}; started again in {restart_after:g} s")
            time.sleep(restart_after)
            procs.start(victim)
        while procs.running() and time.monotonic() < deadline:
            time.sleep(0.2)
        if procs.running():
            log(f"{case.name}: still running after {max_seconds:g} s; stopped")
    finally:
        procs.stop_all()
        if load is not None:
            load.stop()
    seconds = time.monotonic() - started
    codes = procs.exit_codes()
    summary = collect_summary(out, scenario, exit_codes=codes, wall_seconds=seconds)
    restart["victim"] = victim
    return summary, restart


def run_batched(args: list[str], out: Path) -> dict[str, Any]:
    from rich.console import Console

    from dfedrw.launch.runner import run_scenario
    from dfedrw.peer.config.scenario import load_scenario

    scenario = load_scenario(None, [*args, "engine.name=batched"])
    _, summary = run_scenario(scenario, out, console=Console(stderr=True, quiet=True))
    return summary


def figures_of(case: Case, out: Path, summary: dict[str, Any], restart: dict[str, Any] | None = None) -> Figures:
    """What a run's folder says: accuracy, rounds with a neighbour's model, shut-outs, holds."""
    from dfedrw.peer.results.records import read_final, read_rounds

    peers = summary["peers"]
    honest = [int(k) for k, p in peers.items() if p["role"] == "honest"]
    shares, after, overlap, back = [], None, None, None
    ends: dict[int, float] = {}
    heard: set[int] = set()  # the restarted client's neighbours: the senders of its records' weights
    held = shut = restarts = lost = 0
    victim = (restart or {}).get("victim")
    for k in honest:
        records = read_rounds(out, k)
        if records:
            shares.append(sum(len(r.get("weights") or {}) > 1 for r in records) / len(records))
        final = read_final(out, k) or {}
        held += int((final.get("held_back") or {}).get("rounds", 0))
        restarts += int(final.get("restarts") or 0)
        lost += int(final.get("rounds_lost") or 0)
        if k == victim and final.get("resumed_from"):
            resumed_at = final["resumed_from"][0]["resumed_at"]
            later = [r for r in records if r["round"] >= resumed_at]
            after = sum(len(r.get("weights") or {}) > 1 for r in later) / len(later) if later else None
            back = final.get("loop_started_at")
            heard = {int(j) for r in records for j in (r.get("weights") or {})} - {k}
        elif final.get("loop_started_at") is not None and final.get("loop_seconds") is not None:
            ends[k] = final["loop_started_at"] + final["loop_seconds"]
    near = [end for j, end in ends.items() if j in heard]
    if after is not None and back is not None and near:
        overlap = round(max(near) - back, 1)
    for k in peers:
        final = read_final(out, int(k)) or {}
        shut += sum((final.get("shut_out") or {}).values())
    honest_shut = sum(n for v in (summary.get("honest_senders_shut_out") or {}).values() for n in v.values())
    return Figures(
        case=case.name, rounds=summary["rounds"], accuracy=summary.get("honest_mean_accuracy"), worst=summary.get("worst_accuracy"),
        with_neighbours=round(sum(shares) / len(shares), 4) if shares else None, with_neighbours_min=round(min(shares), 4) if shares else None,
        restarted_after=round(after, 4) if after is not None else None, overlap=overlap, honest_shut_out=honest_shut, shut_out=shut, held_back=held,
        restarts=restarts, restarted=victim, rounds_lost=lost, seconds=round(summary.get("wall_seconds") or 0.0, 1), failed=list(summary.get("failed_peers") or []),
        warnings=list(summary.get("warnings") or []),
    )


def folder_of(case: Case) -> str:
    """The run folder of ``case`` under the bench's ``--out``."""
    return case.name.replace("/", "-").replace("+", "-")


def run_case(case: Case, rounds: int, out_root: Path, *, extra: list[str], restart_after: float, max_seconds: float) -> Figures:
    args = scenario_args(case.scenario, case.protocol, rounds, extra)
    out = out_root / folder_of(case)
    log(f"{case.name}: {rounds} {'steps' if case.protocol == 'async' else 'rounds'}")
    if case.engine == "batched":
        if case.protocol == "async":
            args = [*args, f"clock.step_seconds={ASYNC_STEP_SECONDS}"]
        started = time.monotonic()
        summary = run_batched(args, out)
        summary["wall_seconds"] = time.monotonic() - started
        return figures_of(case, out, summary)
    summary, restart = run_processes(case, args, out, restart_after=restart_after, max_seconds=max_seconds)
    return figures_of(case, out, summary, restart)


def cases(scenarios: list[str], protocols: list[str], restarts: list[bool], loads: list[bool]) -> list[Case]:
    out = []
    for s in scenarios:
        for p in protocols:
            out.append(Case(s, p, "batched"))
            out.extend(Case(s, p, "processes", restart=r, load=ld) for r in restarts for ld in loads)
    return out


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def table(rows: list[Figures]) -> str:
    head = (
        f"{'case':<40} {'rounds':>6} {'acc %':>6} {'worst':>6} {'gap':>6} {'nbr %':>6} {'min %':>6} {'after':>6} "
        f"{'with':>5} {'h.out':>5} {'out':>4} {'held':>5} {'lost':>5} {'s':>7}"
    )
    lines = [head, "-" * len(head)]
    for f in rows:
        acc = "-" if f.accuracy is None else f"{f.accuracy:.2f}"
        worst = "-" if f.worst is None else f"{f.worst:.2f}"
        gap = "" if f.gap is None else f"{f.gap:+.2f}"
        lines.append(
            f"{f.case:<40} {f.rounds:>6} {acc:>6} {worst:>6} {gap:>6} {pct(f.with_neighbours):>6} {pct(f.with_neighbours_min):>6} "
            f"{pct(f.restarted_after):>6} {'-' if f.overlap is None else f'{f.overlap:.0f}':>5} {f.honest_shut_out:>5} {f.shut_out:>4} {f.held_back:>5} {f.rounds_lost:>5} {f.seconds:>7.1f}"
        )
        for w in f.warnings:
            lines.append(f"    warning: {w}")
        if f.failed:
            lines.append(f"    failed clients: {f.failed}")
    lines.append(
        "acc %: honest mean final accuracy; gap: against the batched engine's; nbr %: share of rounds with a neighbour's model "
        "(mean, lowest client, the restarted client after its restart); with: seconds the restarted client ran while its honest neighbours still ran; h.out/out: honest senders / all senders shut out; "
        "held: rounds the lead bound held back; lost: rounds a restart cost"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--protocol", choices=["sync", "async", "all"], default="all")
    parser.add_argument("--restart", choices=["yes", "no", "both"], default="both")
    parser.add_argument("--load", choices=["yes", "no", "both"], default="both")
    parser.add_argument(
        "--short", action="store_true",
        help="the slow test's version: 4,000 rounds, 4,000 steps, round_timeout 2 s, a checkpoint every 20 rounds, a restart after 1 s",
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds (steps) of every case (default: sync 3000, async 2400)")
    parser.add_argument("--restart-after", type=float, default=None, help="seconds a killed client stays down (default 2, --short 1)")
    parser.add_argument("--max-seconds", type=float, default=1800.0, help="a process run is stopped after this long")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE", help="more scenario settings")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs' folders here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    import tempfile

    scenarios = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    protocols = ["sync", "async"] if args.protocol == "all" else [args.protocol]
    both = {"yes": [True], "no": [False], "both": [False, True]}
    extra = list(args.extra)
    if args.short:
        extra = ["network.round_timeout=2", "checkpoint.every=20", *extra]
    restart_after = args.restart_after if args.restart_after is not None else (1.0 if args.short else 2.0)
    temp = None
    out_root = args.out
    if out_root is None:
        temp = tempfile.TemporaryDirectory(prefix="soak-")
        out_root = Path(temp.name)
    rows: list[Figures] = []
    reference: dict[tuple[str, str], float | None] = {}
    try:
        for case in cases(scenarios, protocols, both[args.restart], both[args.load]):
            rounds = args.rounds or (SHORT if args.short else LENGTHS)[case.protocol]
            f = run_case(case, rounds, out_root, extra=extra, restart_after=restart_after, max_seconds=args.max_seconds)
            if case.engine == "batched":
                reference[case.scenario, case.protocol] = f.accuracy
            else:
                ref = reference.get((case.scenario, case.protocol))
                f.gap = round(f.accuracy - ref, 2) if f.accuracy is not None and ref is not None else None
            rows.append(f)
            log(f"{case.name}: accuracy {f.accuracy}, gap {f.gap}, with neighbours {pct(f.with_neighbours)}%, honest shut out {f.honest_shut_out}, {f.seconds} s")
    finally:
        if temp is not None:
            temp.cleanup()
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(f) for f in rows], indent=1) + "\n")
    return 0 if all(not f.failed for f in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
