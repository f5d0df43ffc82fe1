"""``dfedrw run``: one OS process per client on this machine, over loopback.

The launcher binds a zmq ROUTER on a loopback port the OS picks; every client starts its gRPC
server on a port the OS picks (so no two processes ever race for a port), registers its
address, and gets the address book back once all have registered (a handshake, never a sleep).
Clients then stream per-round telemetry to the same socket, which drives the live progress.
Results come from the files the clients write, so they never depend on telemetry arriving.

The socket binds 127.0.0.1 only, yet any local user can reach it: each client gets its own
secret through its environment and must show it to register; telemetry is taken only from the
connection a client registered from, and every other frame is dropped and counted (see
``launch.link``; the messages are in ``peer.client.link_messages``), the counts going into
``summary.json`` under ``launcher_link``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from rich.console import Console
from rich.table import Table

from dfedrw.peer.results.collect import collect_summary
from dfedrw.launch.forkserver import START_METHODS, ForkServer, client_env, fork_available, take_prestarted
from dfedrw.launch.link import LinkGate, new_token
from dfedrw.launch.preflight import preflight
from dfedrw.launch.progress import ProgressBoard
from dfedrw.peer.client import link_messages
from dfedrw.peer.client.link_messages import MAX_FRAME_BYTES, TOKEN_ENV
from dfedrw.peer.config.scenario import SCENARIO_DIGEST_ENV, Scenario, dump_scenario
from dfedrw.peer.transport.identity import load_identity, make_certificates
from dfedrw.peer.wiring.plan import role_of, scenario_topology
from dfedrw.peer.results.records import write_json_atomic

# Grace given to children between SIGTERM and SIGKILL when the run is stopped.
_TERM_GRACE = 5.0
# Frames taken from the socket before the loop looks at the children again, so a flood of
# frames cannot keep it from noticing exits or sending the address book.
_DRAIN_MAX = 1000
# Seconds between two log lines about dropped frames.
_DROP_LOG_EVERY = 5.0


@dataclass
class Child:
    id: int
    role: str
    proc: subprocess.Popen
    log_path: Path
    registered: bool = False
    address: str | None = None
    exit_code: int | None = None
    reported: bool = False


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def check_certificates(scenario: Scenario, certs: Path | None) -> None:
    """A given certificate folder must hold a valid identity for every client of the scenario."""
    if certs is not None and scenario.network.tls == "mutual":
        for k in range(scenario.num_clients):
            load_identity(certs, k)


class LocalRun:
    def __init__(
        self,
        scenario: Scenario,
        out_dir: Path,
        *,
        console: Console | None = None,
        python: str = sys.executable,
        certs: Path | None = None,
        tensorboard: Path | None = None,
        start: str = "fork" if fork_available() else "spawn",
    ) -> None:
        if start not in START_METHODS or (start == "fork" and not fork_available()):
            raise ValueError(f"start must be one of {', '.join(m for m in START_METHODS if m != 'fork' or fork_available())}, got {start!r}")
        self.start = start
        self.fork_server: ForkServer | None = None
        self.scenario = scenario
        self.out_dir = Path(out_dir)
        self.certs = Path(certs) if certs is not None else None
        self.tensorboard = Path(tensorboard) if tensorboard is not None else None
        self.console = console or Console(stderr=True)
        self.python = python
        self.children: dict[int, Child] = {}
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        # Loopback only: the clients run on this machine.
        self._sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.gate = LinkGate({})
        self._book_sent = False
        self._next_drop_log = 0.0
        self._drops_unlogged = 0

    # -- processes ----------------------------------------------------------------------
    def spawn(self) -> None:
        topology = scenario_topology(self.scenario)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "logs").mkdir(exist_ok=True)
        scenario_path = self.out_dir / "scenario.toml"
        digest = dump_scenario(self.scenario, scenario_path)
        certs = self._certificates()
        # The clients read the scenario this launcher validated as it is, without checking it again.
        env = {**client_env(), SCENARIO_DIGEST_ENV: digest}
        self._start_fork_server()
        if self.fork_server is not None:
            self.fork_server.attach_log(self.out_dir / "logs" / "fork-server.log")
            # A client watches the process that started it: here, the fork server.
            env["DFEDRW_PARENT_PID"] = str(self.fork_server.pid)
        for k in range(topology.num_clients):
            role = role_of(topology, k)
            self.gate.tokens[k] = new_token()
            log_path = self.out_dir / "logs" / f"{k}.log"
            cmd = [
                self.python, "-m", "dfedrw.peer",
                "--scenario", str(scenario_path),
                "--id", str(k),
                "--rendezvous", self.endpoint,
                "--out", str(self.out_dir),
            ]
            if certs is not None:
                cmd += ["--certs", str(certs)]
            if self.tensorboard is not None:
                cmd += ["--tensorboard", str(self.tensorboard)]
            child_env = {**env, TOKEN_ENV: self.gate.tokens[k]}
            if self.fork_server is not None:
                proc = self.fork_server.start(cmd[3:], child_env, log_path)
            else:
                with log_path.open("w") as log_file:
                    # A new session: Ctrl-C in the terminal reaches the launcher only, which
                    # then stops every child itself, in order.
                    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
            self.children[k] = Child(k, role, proc, log_path)
        # Written at once so an operator (or a test) can find every client process of the run.
        write_json_atomic(self.out_dir / "pids.json", {"launcher": os.getpid(), "clients": {str(k): c.proc.pid for k, c in self.children.items()}})

    def _start_fork_server(self) -> None:
        """With ``start = "fork"``: the fork server, started first so that its imports overlap
        the launcher's checks and certificates (or before the launcher's own imports, by the
        command line: :func:`~dfedrw.launch.forkserver.prestart`)."""
        if self.start == "fork" and self.fork_server is None:
            # Its log goes to logs/fork-server.log once the results folder is made (spawn).
            self.fork_server = take_prestarted(self.python) or ForkServer(self.python, client_env())

    def _certificates(self) -> Path | None:
        """The clients' certificate folder: the one given, else a new CA and certificates for
        this run only, in the results folder."""
        if self.scenario.network.tls == "off":
            self.console.print("[yellow]network.tls = 'off': senders are not authenticated; any local process can send models in a client's name[/yellow]")
            return None
        if self.certs is not None:
            return self.certs
        certs = self.out_dir / "certs"
        make_certificates(self.scenario.num_clients, certs)
        return certs

    def stop_all(self) -> None:
        alive = [c for c in self.children.values() if c.proc.poll() is None]
        for c in alive:
            c.proc.terminate()
        deadline = time.monotonic() + _TERM_GRACE
        for c in alive:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
        for c in self.children.values():
            c.exit_code = c.proc.poll()
        if self.fork_server is not None:
            self.fork_server.close()

    # -- messages -----------------------------------------------------------------------
    def _handle(self, frames: list[bytes]) -> dict[str, Any] | None:
        """The message to show on the progress board, or None when the frames were dropped."""
        msg = self.gate.admit(frames)
        if isinstance(msg, str):
            self._log_drop(msg, frames)
            return None
        if msg["type"] == "register":
            child = self.children[msg["id"]]
            child.registered = True
            child.address = msg["address"]
        return msg

    def _receive(self, board: ProgressBoard, timeout_ms: int) -> None:
        """Handle what arrived within ``timeout_ms``, at most ``_DRAIN_MAX`` frames."""
        if not self._sock.poll(timeout_ms):
            return
        for _ in range(_DRAIN_MAX):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            msg = self._handle(frames)
            if msg is not None:
                board.event(msg)

    def _log_drop(self, reason: str, frames: list[bytes]) -> None:
        self._drops_unlogged += 1
        now = time.monotonic()
        if now < self._next_drop_log:
            return
        self._next_drop_log = now + _DROP_LOG_EVERY
        # repr escapes every byte; markup=False keeps rich from reading brackets in it.
        preview = repr(frames[-1][:60]) if frames else "(no frame)"
        self.console.print(
            f"launcher link: dropped {self._drops_unlogged} frame(s), last {reason}: {preview}",
            markup=False, highlight=False, emoji=False, style="yellow",
        )
        self._drops_unlogged = 0

    def _maybe_send_book(self) -> None:
        """Send the address book once every client that is still alive has registered."""
        if self._book_sent:
            return
        pending = [c for c in self.children.values() if not c.registered and c.proc.poll() is None]
        if pending:
            return
        book = link_messages.encode(link_messages.address_book({c.id: c.address for c in self.children.values() if c.registered}))
        for identity in self.gate.identities.values():
            self._sock.send_multipart([identity, book])
        self._book_sent = True

    def _poll_exits(self, board: ProgressBoard) -> None:
        for c in self.children.values():
            if c.exit_code is None:
                c.exit_code = c.proc.poll()
            if c.exit_code is not None and c.exit_code != 0 and not c.reported:
                c.reported = True
                board.set_status(c.id, f"[red]{_describe_exit(c.exit_code)}[/red]")
                self.console.print(f"[red]client {c.id} ({c.role}) {_describe_exit(c.exit_code)}: {_last_line(c.log_path)}[/red]")
                self.console.print(f"[red]  log: {c.log_path}[/red]")

    # -- main loop ----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        start = time.monotonic()
        try:
            self._start_fork_server()
            preflight(self.scenario)
            check_certificates(self.scenario, self.certs)
            self.spawn()
        except BaseException:
            self.stop_all()
            raise
        interrupted = False
        board = ProgressBoard(self.console, {k: c.role for k, c in self.children.items()}, self.scenario.rounds)
        try:
            with board:
                while any(c.exit_code is None for c in self.children.values()):
                    self._receive(board, 200)
                    self._poll_exits(board)
                    self._maybe_send_book()
                    board.refresh()
        except KeyboardInterrupt:
            interrupted = True
            self.console.print("[yellow]interrupted: stopping every client[/yellow]")
        finally:
            self.stop_all()
            self._sock.close()
            self._ctx.term()
        summary = collect_summary(
            self.out_dir,
            self.scenario,
            pids={k: c.proc.pid for k, c in self.children.items()},
            exit_codes={k: c.exit_code for k, c in self.children.items()},
            wall_seconds=time.monotonic() - start,
            extra={
                "interrupted": interrupted,
                "launcher_pid": os.getpid(),
                "transport": "grpc",
                "launcher_link": {"registered": len(self.gate.identities), "dropped": dict(self.gate.dropped)},
            },
        )
        return summary


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else "(no output)"


def _network_note(summary: dict[str, Any]) -> str:
    """The closing line's word on what the network did to honest clients (empty when nothing):
    who ran alone, who was shut out; the summary's warnings say it in full."""
    alone = summary.get("alone_peers") or {}
    shut = summary.get("honest_senders_shut_out") or {}
    parts = []
    if alone:
        parts.append("alone " + ", ".join(f"{k} ({100 * v:.0f}%)" for k, v in alone.items()))
    if shut:
        parts.append("honest shut out " + ", ".join(f"{s} by {k}" for k, v in shut.items() for s in v))
    return "".join(f"[yellow]{p}[/yellow]; " for p in parts)


def print_summary(summary: dict[str, Any], console: Console) -> None:
    interrupted = bool(summary.get("interrupted"))
    table = Table(title="per-client results" + (" (interrupted)" if interrupted else ""))
    for col in ("id", "role", "pid", "local acc %", "global acc %", "rejected", "status"):
        table.add_column(col, justify="right" if col not in ("role", "status") else "left")
    for k, p in summary["peers"].items():
        fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        stopped = "[yellow]stopped" if interrupted else "[red]failed"
        status = ("ok" if not p.get("notes") else f"[yellow]ok, {'; '.join(p['notes'])}[/]") if p["completed"] else f"{stopped} ({p.get('rounds_done', 0)} rounds)[/]"
        table.add_row(k, p["role"], str(p["pid"]), fmt(p["accuracy"]), fmt(p["global_accuracy"]), str(p["rejected_messages"] if p["rejected_messages"] is not None else "-"), status)
    console.print(table)

    def f(key: str, unit: str = "") -> str:
        v = summary.get(key)
        return "-" if v is None else f"{v:.4g}{unit}"

    if summary.get("tls") == "off":
        console.print("[yellow]network.tls was 'off': no sender was authenticated in this run[/yellow]")
    console.print(
        f"honest mean accuracy {f('honest_mean_accuracy', '%')} (variance {f('accuracy_variance', ' %^2')}, worst {f('worst_accuracy', '%')}); "
        f"global {f('honest_mean_global_accuracy', '%')}; Byzantine weight share {f('byzantine_weight_share')}; "
        + (
            f"interrupted after {summary['wall_seconds']:.1f} s, before the last of its {summary['rounds']} rounds"
            if interrupted
            else f"failed {summary['failed_peers'] or 'none'}; {_network_note(summary)}{summary['rounds']} rounds in {summary['wall_seconds']:.1f} s"
        )
    )
    for line in summary.get("warnings") or []:
        console.print(f"[yellow]warning: {line}[/yellow]")
    success = summary.get("attack_success")
    if success:
        console.print(
            f"backdoor success rate: honest mean {success['mean']:.4g}% (worst {success['worst']:.4g}%); "
            f"the mean's peak {success['peak_mean']:.4g}% at round {success['peak_round']}"
        )
    for k in summary.get("restarted_peers") or []:
        p = summary["peers"][str(k)]
        console.print(f"client {k} was restarted {p['restarts']} time(s) and resumed from its checkpoint; {p['rounds_lost']} rounds lost")
