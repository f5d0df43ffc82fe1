"""``network.transport = "inproc"``: every client of a scenario as a thread of this process.

Same client code (``peer.client.client.Client``) and the same on-disk results as the process launcher;
messages go through the in-process transport. Meant for fast tests and large sweeps.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from rich.console import Console

from dfedrw.peer.results.collect import collect_summary
from dfedrw.launch.progress import ProgressBoard
from dfedrw.peer.config.scenario import Scenario, dump_scenario
from dfedrw.peer.client.client import Client
from dfedrw.peer.client.process import start_and_run
from dfedrw.peer.learning.device import engine_device
from dfedrw.peer.wiring.plan import role_of, scenario_topology
from dfedrw.peer.client.rendezvous import SharedRendezvous
from dfedrw.peer.transport.kinds import TRANSPORT_REGISTRY
from dfedrw.peer.wiring.build import scenario_transport

log = logging.getLogger(__name__)


class QueueLink:
    """Telemetry to the launcher in the same process."""

    dropped = 0

    def __init__(self, events: queue.SimpleQueue) -> None:
        self._events = events

    def send(self, event: dict[str, Any]) -> None:
        self._events.put_nowait(event)

    def close(self) -> None:
        pass


def run_inproc(scenario: Scenario, out_dir: Path, *, console: Console, tensorboard: Path | None = None) -> dict[str, Any]:
    from dfedrw.launch.preflight import preflight

    start = time.monotonic()
    preflight(scenario)
    out_dir = Path(out_dir)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    dump_scenario(scenario, out_dir / "scenario.toml")
    topology = scenario_topology(scenario)
    roles = {k: role_of(topology, k) for k in range(topology.num_clients)}
    # Clients put one event per round here; the loop below drains it every 0.2 s instead of
    # being woken for each (a wake-up per client-round costs the clients thread switches).
    events: queue.SimpleQueue = queue.SimpleQueue()
    kind, transport_name = scenario_transport(scenario), scenario.network.transport
    if kind.placement != "threads":  # a scenario of another transport runs over the in-process one
        kind, transport_name = TRANSPORT_REGISTRY.build("inproc"), "inproc"
    network = kind.network(scenario)
    device = engine_device(scenario.engine.device)  # every thread's model on it
    peers = {
        k: Client(scenario, k, out_dir, transport=kind.thread_transport(network, k), link=QueueLink(events), device=device, tensorboard=tensorboard)
        for k in roles
    }
    # Every client publishes its address once its server is up and waits for the others'.
    rendezvous = SharedRendezvous(roles)
    exit_codes: dict[int, int | None] = {k: None for k in roles}

    def client(k: int) -> None:
        try:
            start_and_run(peers[k], rendezvous)
            exit_codes[k] = 0
        except BaseException:  # noqa: BLE001 - any failure of one client is reported, the rest go on
            rendezvous.leave(k)
            exit_codes[k] = 1
            (out_dir / "logs" / f"{k}.log").write_text(traceback.format_exc())
            events.put({"type": "failed", "id": k})

    # All clients share this process's log: keep their per-round progress lines out of it (the
    # progress board shows progress); warnings still come through.
    peer_log = logging.getLogger("dfedrw.peer.client.client")
    peer_level = peer_log.level
    peer_log.setLevel(max(logging.WARNING, peer_level))
    threads = {k: threading.Thread(target=client, args=(k,), name=f"client-{k}", daemon=True) for k in roles}
    for t in threads.values():
        t.start()
    interrupted = False
    board = ProgressBoard(console, roles, scenario.rounds)
    try:
        with board:
            while any(t.is_alive() for t in threads.values()):
                time.sleep(0.2)
                while not events.empty():
                    msg = events.get_nowait()
                    board.event(msg)
                    if msg.get("type") == "failed":
                        k = msg["id"]
                        board.set_status(k, "[red]failed[/red]")
                        console.print(f"[red]client {k} ({roles[k]}) failed; log: {out_dir / 'logs' / f'{k}.log'}[/red]")
                board.refresh()
    except KeyboardInterrupt:
        interrupted = True
        console.print("[yellow]interrupted: stopping every client[/yellow]")
        for p in peers.values():
            p.stop_requested.set()
        for t in threads.values():
            t.join(timeout=scenario.network.round_timeout + 5)
    peer_log.setLevel(peer_level)
    summary = collect_summary(
        out_dir,
        scenario,
        pids={k: os.getpid() for k in roles},
        exit_codes=exit_codes,
        wall_seconds=time.monotonic() - start,
        extra={"interrupted": interrupted, "launcher_pid": os.getpid(), "transport": transport_name},
    )
    return summary
