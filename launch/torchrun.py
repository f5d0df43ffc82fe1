"""One client per torchrun rank: ``torchrun --nproc-per-node N -m dfedrw.launch.torchrun --scenario FILE``.

The flags are those of ``dfedrw peer`` without ``--id``.

torchrun tells each worker who it is (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT);
client id = RANK. Addresses are exchanged through the key-value store torchrun already runs
(the default store of ``init_process_group``): each rank sets ``dfedrw/addr/<rank>`` and reads
the keys of the clients it talks to (its neighbours and, for a colluding Byzantine client, the
other colluders); no other rendezvous service. After its run each rank sets
``dfedrw/done/<rank>``, and while it runs it beats every 3 s (``dfedrw/alive/<rank>``); rank 0
waits for every rank (bounded, and giving up on a rank whose heartbeat stopped for 15 s: a rank
killed outright) and writes ``summary.json`` in
the format of ``dfedrw run`` (and, with ``--tensorboard DIR``, the honest mean's event files,
each rank writing its own client's). The results folder must be one folder every rank writes to (on
several nodes: a shared file system).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dfedrw.peer.results.collect import collect_summary, collected_now, write_tensorboard_mean
from dfedrw.peer import cli as peer_cli
from dfedrw.peer.config.scenario import Scenario, dump_scenario, load_scenario
from dfedrw.peer.transport.identity import make_certificates
from dfedrw.peer.wiring.assembly import client_identity
from dfedrw.peer.client.client import Client
from dfedrw.peer.client.process import start_and_run
from dfedrw.peer.wiring.plan import role_of, scenario_graphs, scenario_topology
from dfedrw.peer.results.records import check_fresh_out_dir
from dfedrw.peer.results.tensorboard import check_fresh_event_dir, require_tensorboard
from dfedrw.peer.wiring.build import scenario_colluders, scenario_transport

log = logging.getLogger(__name__)

ADDR_KEY = "dfedrw/addr/{}"
DONE_KEY = "dfedrw/done/{}"
ALIVE_KEY = "dfedrw/alive/{}"
# Seconds between a rank's heartbeats in the store, and how many missed ones make rank 0 give
# up on a rank that is not done: a rank killed outright (its Slurm step cancelled, its node
# lost) is then summarised as failed within about 15 s, not after the whole finish_skew.
HEARTBEAT_SECONDS = 3.0
HEARTBEATS_MISSED = 5
CERTS_KEY = "dfedrw/certs"


@dataclass(frozen=True)
class RankEnv:
    """What torchrun tells a worker about itself."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RankEnv:
        """Read the torchrun variables; RANK and WORLD_SIZE are required."""
        if "RANK" not in environ or "WORLD_SIZE" not in environ:
            raise ValueError("not under torchrun: RANK and WORLD_SIZE are not set")
        world = int(environ["WORLD_SIZE"])
        return cls(
            rank=int(environ["RANK"]),
            world_size=world,
            local_rank=int(environ.get("LOCAL_RANK", "0")),
            local_world_size=int(environ.get("LOCAL_WORLD_SIZE", str(world))),
            master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(environ.get("MASTER_PORT", "29500")),
        )


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    addrs = {info[4][0].split("%")[0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a).is_loopback for a in addrs)


def route_address(master_addr: str, master_port: int) -> str:
    """This host's address on the route to the master: what other nodes can reach it at.

    Connecting a UDP socket only asks the kernel for a route; no packet is sent.
    """
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(master_addr, master_port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return s.getsockname()[0]
    except OSError as exc:  # gaierror included
        raise OSError(
            f"no route to MASTER_ADDR {master_addr}:{master_port} to find this host's address ({exc}); "
            "set DFEDRW_ADVERTISE to the address other nodes reach this one at"
        ) from exc


def interface_of(address: str) -> str | None:
    """The name of the local network interface that holds IPv4 ``address`` (None if none)."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
        if socket.inet_ntoa(raw[20:24]) == address:
            return name
    return None


def gloo_interface(env: RankEnv, environ: Mapping[str, str]) -> str | None:
    """The interface gloo should bind for a multi-node job, when the user did not choose one.

    Left alone, gloo binds the address this host's name resolves to, often 127.0.0.1, and
    ranks on other nodes then cannot connect. The interface on the route to MASTER_ADDR is
    the one other nodes reach this host through.
    """
    if environ.get("GLOO_SOCKET_IFNAME") or is_loopback(env.master_addr):
        return None
    try:
        return interface_of(route_address(env.master_addr, env.master_port))
    except OSError:
        return None


def listen_and_advertise(host: str, env: RankEnv, override: str | None = None) -> tuple[str, str | None]:
    """(address the gRPC server listens on, address it advertises; None = the listen address).

    On one node (a loopback MASTER_ADDR) nothing changes. With a master on another address the
    clients span nodes: a server on a loopback address could not be reached, so it listens on
    every interface and advertises the address that routes to the master. ``override``
    (DFEDRW_ADVERTISE) replaces the advertised address in every case.
    """
    if is_loopback(env.master_addr):
        return host, override or None
    if _is_wildcard(host):
        listen = host
    elif is_loopback(host):
        listen = "::" if ":" in host else "0.0.0.0"
    else:
        return host, override or None  # the scenario names an address of this host
    return listen, override or route_address(env.master_addr, env.master_port)


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a host name
        return False


def exchange_addresses(store, rank: int, address: str, peers: Iterable[int], timeout: float) -> dict[int, str]:
    """Publish this client's address and read its peers' (id -> address) from the store.

    Waits at most ``timeout`` seconds in all; a peer whose key did not appear by then is left
    out (the client goes on without it, as with ``dfedrw run``).
    """
    store.set(ADDR_KEY.format(rank), address)
    deadline = time.monotonic() + timeout
    book: dict[int, str] = {}
    for k in sorted(peers):
        key = ADDR_KEY.format(k)
        try:
            store.wait([key], timedelta(seconds=max(0.001, deadline - time.monotonic())))
        except RuntimeError:  # DistStoreError: the key did not appear in time
            log.warning("client %d: no address from %d within %.0f s", rank, k, timeout)
            continue
        book[k] = store.get(key).decode()
    return book


class StoreRendezvous:
    """Addresses through torchrun's store (:func:`exchange_addresses`)."""

    def __init__(self, store, role: str, world_size: int, device: torch.device) -> None:
        self.store, self.role, self.world_size, self.device = store, role, world_size, device

    def exchange(self, client_id: int, address: str, neighbours: Iterable[int], timeout: float) -> dict[int, str]:
        log.info("client %d (%s) of %d: device %s, address %s", client_id, self.role, self.world_size, self.device, address)
        return exchange_addresses(self.store, client_id, address, neighbours, timeout)


def mark_done(store, rank: int, ok: bool) -> None:
    """Tell rank 0 this client has finished (``ok``) or failed."""
    store.set(DONE_KEY.format(rank), "ok" if ok else "failed")


class Heartbeat:
    """A daemon thread that sets this rank's ``ALIVE_KEY`` (a counter) every ``every`` seconds
    until :meth:`stop`: rank 0 tells a rank that still runs from one that is gone."""

    def __init__(self, store, rank: int, every: float = HEARTBEAT_SECONDS) -> None:
        self._store, self._key, self._every = store, ALIVE_KEY.format(rank), every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        beat = 0
        while True:
            try:
                self._store.set(self._key, str(beat))
            except RuntimeError:  # the store is gone (rank 0 ended): nobody is waiting
                return
            beat += 1
            if self._stop.wait(self._every):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._every + 5)


def wait_done(
    store, ranks: Iterable[int], timeout: float, *, beat: float = HEARTBEAT_SECONDS, missed: int = HEARTBEATS_MISSED,
) -> dict[int, str | None]:
    """Each rank's done status ("ok" / "failed"), None for one not done within ``timeout`` s or
    whose heartbeat (:class:`Heartbeat`) has not moved for ``missed`` beats of ``beat`` s (a rank
    that never beat counts from when the wait began)."""
    start = time.monotonic()
    deadline = start + timeout
    pending = set(ranks)
    status: dict[int, str | None] = {}
    seen: dict[int, tuple[bytes | None, float]] = {k: (None, start) for k in pending}
    while pending:
        now = time.monotonic()
        for k in sorted(pending):
            if store.check([DONE_KEY.format(k)]):
                status[k] = store.get(DONE_KEY.format(k)).decode()
                pending.discard(k)
                continue
            key = ALIVE_KEY.format(k)
            value = store.get(key) if store.check([key]) else None
            if value != seen[k][0]:
                seen[k] = (value, now)
            elif now - seen[k][1] > beat * missed or now > deadline:
                status[k] = None
                pending.discard(k)
        if pending:
            time.sleep(min(0.2, max(0.0, deadline - now)) or 0.01)
    return {k: status[k] for k in sorted(status)}


def finish_skew(scenario: Scenario) -> float:
    """How long one client may still run after another has finished.

    Each client waits (at most a round deadline) for its neighbours' last models, so clients
    finish at most about one deadline per hop apart; fewer hops than clients.
    """
    net = scenario.network
    return net.connect_timeout + scenario.num_clients * net.round_timeout


def pick_device(env: RankEnv) -> torch.device:
    """The GPU LOCAL_RANK maps to (ranks share GPUs round-robin), or the CPU without CUDA."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = env.local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def shared_certificates(scenario: Scenario, store, rank: int, out_dir: Path, certs: Path | None, timeout: float) -> Path | None:
    """The run's certificate folder: the one given (``dfedrw certs``, copied to every node), or,
    when none is given, one rank 0 makes in the results folder, which every rank shares."""
    if not scenario_transport(scenario).uses_tls or scenario.network.tls == "off":
        return None
    if certs is not None:
        return Path(certs)
    folder = Path(out_dir) / "certs"
    if rank == 0:
        make_certificates(scenario.num_clients, folder)
        store.set(CERTS_KEY, str(folder))
    else:
        store.wait([CERTS_KEY], timedelta(seconds=timeout))
    return folder


def transport_edges(scenario: Scenario) -> list[tuple[int, int]]:
    """Who exchanges messages on the torch transport: the graph's edges (under a schedule,
    every pair that may exchange in some round: the union of every round's edges, as the
    schedule bounds it) and, with ``attack.colluding``, every pair of colluders (their pools),
    whether neighbours or not. The same list on every rank: each creates a process group per
    edge, in one order."""
    colluders = scenario_colluders(scenario)
    pairs = {(a, b) for i, a in enumerate(colluders) for b in colluders[i + 1 :]}
    graphs = scenario_graphs(scenario)
    edges = {(min(k, j), max(k, j)) for k in range(graphs.num_clients) for j in graphs.possible(k)}
    return sorted(edges | pairs)


def _transport(scenario: Scenario, env: RankEnv, device: torch.device, environ: Mapping[str, str], certs: Path | None = None):
    net = scenario.network
    kind = scenario_transport(scenario)
    if kind.placement == "processes":
        host, advertise = listen_and_advertise(net.host, env, environ.get("DFEDRW_ADVERTISE") or None)
        return kind.process_transport(
            scenario, env.rank, host=host, port=0, advertise=advertise, identity=client_identity(scenario, certs, env.rank)
        )
    if kind.placement == "torchrun":
        note = None
        if device.type == "cuda" and env.local_world_size > torch.cuda.device_count():
            # NCCL refuses two ranks on one GPU (a communicator per device and process), so
            # the messages go through gloo, from the CPU; the model still trains on the GPU.
            note = (
                f"{env.local_world_size} ranks share {torch.cuda.device_count()} GPU(s) on this node and NCCL needs one GPU per rank: "
                f"messages go through gloo on the CPU, the model stays on {device}"
            )
            log.warning("client %d: %s", env.rank, note)
            device = torch.device("cpu")
        transport = kind.rank_transport(scenario, env.rank, edges=transport_edges(scenario), device=device, linger=finish_skew(scenario))
        if note is not None:
            transport.backend_note = note  # in the client's final record, beside transport_backend
        return transport
    raise ValueError(f"network.transport = {net.transport!r} cannot run under torchrun: it runs its clients as {kind.placement}")


def run_torchrun(
    scenario: Scenario,
    out_dir: Path,
    *,
    environ: Mapping[str, str] | None = None,
    certs: Path | None = None,
    tensorboard: Path | None = None,
) -> dict[str, Any]:
    """Run this rank's client to completion; rank 0 also writes ``summary.json``. ``tensorboard``:
    a folder for TensorBoard event files (this rank's client, and on rank 0 the honest mean).

    Returns the client's final record (``peers/<id>.json``).
    """
    environ = os.environ if environ is None else environ
    start = time.monotonic()
    env = RankEnv.from_environ(environ)
    if env.world_size != scenario.num_clients:
        raise ValueError(
            f"torchrun started WORLD_SIZE={env.world_size} ranks but the scenario has {scenario.num_clients} clients "
            f"(topology.honest + topology.byzantine); use --nproc-per-node (x --nnodes) = {scenario.num_clients}"
        )
    placement = scenario_transport(scenario).placement
    if placement not in ("processes", "torchrun"):
        raise ValueError(f"network.transport = {scenario.network.transport!r} cannot run under torchrun: it runs its clients as {placement}")
    out_dir = Path(out_dir)
    # Every rank writes into the same folder at once: each checks only its own round log.
    check_fresh_out_dir(out_dir, [env.rank])
    if tensorboard is not None:
        require_tensorboard()
        check_fresh_event_dir(tensorboard, [env.rank], mean=env.rank == 0)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    # Each rank's log in the results folder, as `dfedrw run` keeps them.
    handler = logging.FileHandler(out_dir / "logs" / f"{env.rank}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        device = pick_device(env)
        iface = gloo_interface(env, environ)
        if iface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = iface
            logging.getLogger(__name__).info("gloo binds interface %s (on the route to %s)", iface, env.master_addr)
        dist.init_process_group(backend="gloo", timeout=timedelta(seconds=scenario.network.connect_timeout))
        try:
            return _run_rank(scenario, out_dir, env, device, environ, start, certs, tensorboard)
        finally:
            dist.destroy_process_group()
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def _run_rank(
    scenario: Scenario,
    out_dir: Path,
    env: RankEnv,
    device: torch.device,
    environ: Mapping[str, str],
    start: float,
    certs: Path | None,
    tensorboard: Path | None = None,
) -> dict[str, Any]:
    net = scenario.network
    store = dist.distributed_c10d._get_default_store()
    certs = shared_certificates(scenario, store, env.rank, out_dir, certs, net.connect_timeout)
    if env.rank == 0:
        dump_scenario(scenario, out_dir / "scenario.toml")
    ok = interrupted = False
    heartbeat = Heartbeat(store, env.rank)
    try:
        rendezvous = StoreRendezvous(store, role_of(scenario_topology(scenario), env.rank), env.world_size, device)
        transport = _transport(scenario, env, device, environ, certs)
        client = Client(scenario, env.rank, out_dir, transport=transport, device=device, tensorboard=tensorboard)
        final = start_and_run(client, rendezvous)
        ok = True
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        heartbeat.stop()
        mark_done(store, env.rank, ok)
        # Rank 0 writes the summary even when its own client failed: the others' results stand.
        if env.rank == 0:
            _summarize(scenario, out_dir, store, env, start, interrupted, tensorboard)
    return final


def _summarize(scenario: Scenario, out_dir: Path, store, env: RankEnv, start: float, interrupted: bool, tensorboard: Path | None = None) -> None:
    status = wait_done(store, range(env.world_size), finish_skew(scenario))
    late = sorted(k for k, s in status.items() if s is None)
    if late:
        log.warning("no done mark from ranks %s (their heartbeat stopped, or %.0f s passed); summarising without them", late, finish_skew(scenario))
    collect_summary(
        out_dir,
        scenario,
        exit_codes={k: None if s is None else (0 if s == "ok" else 1) for k, s in status.items()},
        wall_seconds=time.monotonic() - start,
        # The keys `dfedrw run` adds, so both summaries have one format.
        extra={"launcher": "torchrun", "collected_at": collected_now(), "launcher_pid": os.getppid(), "interrupted": interrupted, "transport": scenario.network.transport},
    )
    if tensorboard is not None:
        write_tensorboard_mean(out_dir, scenario, tensorboard)


def cmd_peer(args) -> int:
    """``dfedrw peer`` (and ``-m dfedrw.launch.torchrun``): under torchrun (no --id, RANK and WORLD_SIZE
    set) this rank's client, addresses through torchrun's store; otherwise the client alone."""
    if not peer_cli.under_torchrun(args):
        if args.id is None and args.scenario is not None:
            raise SystemExit(
                "dfedrw.launch.torchrun: RANK and WORLD_SIZE are not set: start it under torchrun "
                "(torchrun --standalone --nproc-per-node N -m dfedrw.launch.torchrun --scenario FILE), or give --id for one client"
            )
        return peer_cli.cmd_peer(args)
    if args.scenario is None:
        raise SystemExit("dfedrw peer: --scenario is required (or DFEDRW_SCENARIO)")
    final = run_torchrun(load_scenario(args.scenario, args.set), Path(args.out), certs=args.certs, tensorboard=args.tensorboard)
    logging.getLogger("dfedrw.peer").info("client %s done: %s", final["id"], final)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``torchrun ... -m dfedrw.launch.torchrun --scenario FILE [--out DIR] [--certs DIR] [--tensorboard DIR] [--set K=V ...]``."""
    parser, sub = peer_cli.new_parser()
    peer_cli.add_peer_command(sub, cmd_peer)
    return peer_cli.dispatch(parser, ["peer", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
