"""A round of the client processes against a floor: the least a round of the same job can cost
as processes on this machine.

    python bench/round_floor.py                        # both jobs, 3 pairs each
    python bench/round_floor.py --job lenet-ring --pairs 5
    python bench/round_floor.py --rounds 20,320 --json out.json

The floor is a minimal reference of the same round, written here with nothing of this project's
client: one process per client, each with its shard, its model and its seeded minibatch order
(the project's partition, graph, initialisation and seeds, so both do the same arithmetic), mutual
TLS sockets on loopback (the run's certificates, one connection per directed link, a thread
reading each), and per round: one SGD step, the parameters' bytes sent to each neighbour, the
neighbours' bytes of that round read, the candidates scored on the auxiliary rows when the rule
scores them, and the (weighted) average. A Byzantine client sends the mean of what it received
plus N(0, 30^2) noise. Nothing else: no records, no launcher, no checks of what arrives.

The processes are ``dfedrw run`` on the same scenario (mutual TLS, the default).

The jobs:

* ``lenet-ring``: LeNet-5 on Fashion-MNIST, 8 IID shards of 600 rows (the first 4,800 training
  rows, written to a temporary folder), a ring of 8, ``dfedavg``, SGD lr 0.05, batch 32, one local
  step a round, the test at the end;
* ``default``: the built-in default scenario (softmax regression on digits, 10 honest and 2
  Gaussian clients, Erdos-Renyi rho 0.7, DFedReweighting with the loss TPM and the loss clipped
  at the mean), the test at the end.

Each system runs each job at two lengths (``--rounds SHORT,LONG``; by default 20 and 320 rounds
for the LeNet-5 ring, 20 and 1,020 for the default scenario, whose rounds are short); a round's figures are the
differences between the two runs over the difference in rounds, so start-up and the end's test
cancel: seconds (launch to exit), CPU user and system seconds (``wait4`` on the processes, which
counts every process they waited for: the launcher's fork servers and clients). The two systems
alternate, pair by pair, so that a drift of the machine's speed falls on both; the medians over
the pairs and their ratios (processes / floor) are printed. One torch thread per process
(``OMP_NUM_THREADS=1``), as the client processes run by default. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LENET_ROWS = 4800
JOBS: dict[str, list[str]] = {
    "lenet-ring": [
        "data.name=fashion-mnist", "train.model=lenet5", "topology.kind=ring", "topology.honest=8", "topology.byzantine=0",
        "attack.name=none", "aggregation.rule=dfedavg", "train.lr=0.05", "train.batch_size=32", "train.local_steps=1", "eval.every=0",
    ],
    "default": ["eval.every=0"],
}
# Each job's two lengths (its rounds are short: enough of them that start-up's noise is small)
LENGTHS = {"lenet-ring": (20, 320), "default": (20, 1020)}
HEADER = struct.Struct("<qqq")  # round, sender, payload bytes


def log(message: str) -> None:
    print(f"[round_floor] {message}", file=sys.stderr, flush=True)


# -- the floor's client ----------------------------------------------------------------------


def _read_exact(conn: ssl.SSLSocket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


class Inbox:
    """Round -> sender -> bytes, filled by one reading thread per incoming link."""

    def __init__(self) -> None:
        self.held: dict[int, dict[int, bytearray]] = {}
        self.cond = threading.Condition()

    def read(self, conn: ssl.SSLSocket) -> None:
        header = bytearray(HEADER.size)
        while _read_exact(conn, memoryview(header)):
            r, sender, size = HEADER.unpack(header)
            if r < 0:
                break
            payload = bytearray(size)
            if not _read_exact(conn, memoryview(payload)):
                break
            self.put(r, sender, payload)

    def put(self, r: int, sender: int, payload: bytearray) -> None:
        with self.cond:
            self.held.setdefault(r, {})[sender] = payload
            self.cond.notify_all()

    def put_message(self, message: bytes) -> None:
        """A whole message (header, then payload), as one gRPC message carries it."""
        r, sender, _ = HEADER.unpack_from(message)
        self.put(r, sender, bytearray(memoryview(message)[HEADER.size :]))

    def wait(self, r: int, senders: list[int], timeout: float = 120.0) -> dict[int, bytearray]:
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.held.get(r, {})) >= len(senders), timeout):
                raise TimeoutError(f"round {r}: models of {sorted(set(senders) - set(self.held.get(r, {})))} did not come")
            return self.held.pop(r)


def floor_client(spec: dict[str, Any]) -> None:
    import torch
    from torch.nn import functional as F

    from dfedrw.peer.config.scenario import load_scenario
    from dfedrw.peer.learning.datacache import test_set
    from dfedrw.peer.learning.training import BatchOrder
    from dfedrw.peer.wiring.assembly import client_data, initial_model, scenario_model
    from dfedrw.peer.wiring.build import scenario_dataset
    from dfedrw.peer.wiring.plan import derive_seed, scenario_topology

    torch.set_num_threads(1)
    k, ports, certs, rounds = spec["id"], spec["ports"], Path(spec["certs"]), spec["rounds"]
    sc = load_scenario(None, spec["overrides"])
    topo = scenario_topology(sc)
    neighbours = sorted(topo.graph.neighbors(k))
    byzantine = k in topo.byzantine
    if not byzantine:
        data = client_data(sc, topo, k)
        model = initial_model(sc, k)
        scratch = scenario_model(sc)
        batches = BatchOrder(len(data.train), sc.train.batch_size, derive_seed(sc.seed, "batches", k))
    noise = torch.Generator().manual_seed(derive_seed(sc.seed, "attack", k))
    scores = sc.aggregation.rule != "dfedavg"

    inbox = Inbox()
    links = {"": _socket_links, "sync": _grpc_links, "aio": _grpc_aio_links}[spec.get("grpc", "")]
    send_bytes, close = links(k, neighbours, ports, certs, inbox)

    def send(r: int, vector: torch.Tensor) -> None:
        send_bytes(HEADER.pack(r, k, 4 * vector.numel()) + vector.numpy().tobytes())

    def loss_of(vector: torch.Tensor) -> float:
        torch.nn.utils.vector_to_parameters(vector, scratch.parameters())
        with torch.no_grad():
            return float(F.cross_entropy(scratch(data.aux.x), data.aux.y))

    for r in range(rounds):
        if byzantine:
            got = inbox.wait(r, neighbours)
            base = torch.stack([torch.frombuffer(b, dtype=torch.float32) for b in got.values()]).mean(0)
            send(r, base + 30.0 * torch.randn(base.shape, generator=noise))
            continue
        idx = batches.next()
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(data.train.x[idx]), data.train.y[idx]).backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-sc.train.lr)
        own = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        send(r, own)
        got = inbox.wait(r, neighbours)
        candidates = [own, *(torch.frombuffer(got[j], dtype=torch.float32) for j in neighbours)]
        if scores:  # the loss on the auxiliary rows, clipped at the mean, as weights
            losses = [loss_of(v) for v in candidates]
            finite = [x for x in losses if x == x and x != float("inf")]
            mean = sum(finite) / len(finite)
            weights = [x if x in finite and x <= mean else 0.0 for x in losses]
        else:
            weights = [1.0] * len(candidates)
        total = sum(weights) or 1.0
        mixed = sum((w / total) * v for w, v in zip(weights, candidates, strict=True))
        torch.nn.utils.vector_to_parameters(mixed, model.parameters())
    close()
    result: dict[str, Any] = {"id": k}
    if not byzantine:
        test = test_set(scenario_dataset(sc.data))
        with torch.no_grad():
            hits = sum(int((model(x).argmax(1) == y).sum()) for x, y in zip(test.x.split(1000), test.y.split(1000), strict=True))
        result["accuracy"] = 100.0 * hits / len(test.y)
    Path(spec["result"]).write_text(json.dumps(result))


def _socket_links(k: int, neighbours: list[int], ports: list[int], certs: Path, inbox: Inbox):
    """Mutual-TLS sockets, one per directed link, a thread reading each incoming one; returns
    (send a message to every neighbour, close)."""

    def context(purpose: ssl.Purpose) -> ssl.SSLContext:
        ctx = ssl.create_default_context(purpose, cafile=str(certs / "ca.pem"))
        ctx.load_cert_chain(certs / f"client-{k}.pem", certs / f"client-{k}.key")
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    server = socket.create_server(("127.0.0.1", ports[k]))
    serve_ctx = context(ssl.Purpose.CLIENT_AUTH)
    # No TLS 1.3 session tickets: the connecting side never reads, and bytes left unread when
    # it closes would make its close a reset that can drop its last round at the other end.
    serve_ctx.num_tickets = 0

    def accept() -> None:
        for _ in neighbours:
            conn, _ = server.accept()
            threading.Thread(target=inbox.read, args=(serve_ctx.wrap_socket(conn, server_side=True),), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    connect_ctx = context(ssl.Purpose.SERVER_AUTH)
    out: dict[int, ssl.SSLSocket] = {}
    deadline = time.monotonic() + 120
    for j in neighbours:
        while True:
            try:
                out[j] = connect_ctx.wrap_socket(socket.create_connection(("127.0.0.1", ports[j])))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def send(message: bytes) -> None:
        for j in neighbours:
            out[j].sendall(message)

    def close() -> None:
        for conn in out.values():
            conn.sendall(HEADER.pack(-1, k, 0))
            conn.close()

    return send, close


def _grpc_links(k: int, neighbours: list[int], ports: list[int], certs: Path, inbox: Inbox):
    """The same links over gRPC (its synchronous API, mutual TLS with the run's certificates): one
    client-streaming call per directed link that carries every round's message, no reply per
    message, raw bytes (no protocol buffers); returns (send a message to every neighbour, close)."""
    import queue
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from dfedrw.peer.transport.grpc.tls import channel_credentials, identity_options, server_credentials
    from dfedrw.peer.transport.identity import load_identity

    identity = load_identity(certs, k)
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]

    def push(requests, context):
        for message in requests:
            inbox.put_message(message)
        return b""

    server = grpc.server(ThreadPoolExecutor(max_workers=len(neighbours) + 2), options=options)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.Floor", {"Push": grpc.stream_unary_rpc_method_handler(push)}),))
    server.add_secure_port(f"127.0.0.1:{ports[k]}", server_credentials(identity))
    server.start()
    queues: dict[int, queue.Queue] = {}
    calls = []
    for j in neighbours:
        channel = grpc.secure_channel(f"127.0.0.1:{ports[j]}", channel_credentials(identity), options=[*options, *identity_options(identity, j)])
        grpc.channel_ready_future(channel).result(timeout=120)
        queues[j] = queue.Queue()
        calls.append((channel, channel.stream_unary("/floor.Floor/Push").future(iter(queues[j].get, None))))

    def send(message: bytes) -> None:
        for q in queues.values():
            q.put(message)

    def close() -> None:
        for q in queues.values():
            q.put(None)
        for channel, call in calls:
            call.result(timeout=120)
            channel.close()
        server.stop(grace=5).wait()

    return send, close



def _grpc_aio_links(k: int, neighbours: list[int], ports: list[int], certs: Path, inbox: Inbox):
    """The links of :func:`_grpc_links` over gRPC's asyncio API (the one the client processes
    use), its event loop in a thread of its own: the round's messages handed to it at once."""
    import asyncio

    import grpc

    from dfedrw.peer.transport.grpc.tls import channel_credentials, identity_options, server_credentials
    from dfedrw.peer.transport.identity import load_identity

    identity = load_identity(certs, k)
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def push(requests, context):
        async for message in requests:
            inbox.put_message(message)
        return b""

    async def outgoing(q: asyncio.Queue):
        while (message := await q.get()) is not None:
            yield message

    async def start():
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.Floor", {"Push": grpc.stream_unary_rpc_method_handler(push)}),))
        server.add_secure_port(f"127.0.0.1:{ports[k]}", server_credentials(identity))
        await server.start()
        links = []
        for j in neighbours:
            channel = grpc.aio.secure_channel(f"127.0.0.1:{ports[j]}", channel_credentials(identity), options=[*options, *identity_options(identity, j)])
            await asyncio.wait_for(channel.channel_ready(), 120)
            q: asyncio.Queue = asyncio.Queue()
            links.append((channel, q, channel.stream_unary("/floor.Floor/Push")(outgoing(q))))
        return server, links

    server, links = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=150)

    def hand_over(message: bytes | None) -> None:
        for _, q, _ in links:
            q.put_nowait(message)

    async def stop():
        hand_over(None)
        for channel, _, call in links:
            await call
            await channel.close()
        await server.stop(grace=5)

    def send(message: bytes) -> None:
        loop.call_soon_threadsafe(hand_over, message)

    def close() -> None:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=150)

    return send, close


# -- the two systems, timed from outside -----------------------------------------------------------


def free_ports(n: int) -> list[int]:
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    try:
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_all(procs: list[subprocess.Popen], timeout: float) -> tuple[float, float]:
    """Wait for every process (``wait4``: its CPU and that of every process it waited for);
    returns (user, system) seconds."""
    user = system = 0.0
    deadline = time.monotonic() + timeout
    for p in procs:
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                p.returncode = os.waitstatus_to_exitcode(status)
                user, system = user + usage.ru_utime, system + usage.ru_stime
                break
            if time.monotonic() > deadline:
                for q in procs:
                    q.kill()
                raise TimeoutError(f"still running after {timeout:g} s")
            time.sleep(0.01)
        if p.returncode != 0:
            raise RuntimeError(f"{p.args[:6]} exited with {p.returncode}")
    return user, system


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def run_floor(overrides: list[str], rounds: int, work: Path, *, grpc: str = "") -> dict[str, float]:
    from dfedrw.peer.config.scenario import load_scenario
    from dfedrw.peer.transport.identity import make_certificates

    n = load_scenario(None, overrides).num_clients
    certs = work / f"floor-certs-{n}"
    if not certs.exists():
        make_certificates(n, certs)
    ports = free_ports(n)
    procs = []
    start = time.monotonic()
    for k in range(n):
        spec = {"id": k, "ports": ports, "certs": str(certs), "rounds": rounds, "overrides": overrides, "result": str(work / f"floor-{k}.json"), "grpc": grpc}
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--floor-client", json.dumps(spec)], env=_env()))
    user, system = _wait_all(procs, 1800)
    seconds = time.monotonic() - start
    results = [json.loads((work / f"floor-{k}.json").read_text()) for k in range(n)]
    accuracies = [r["accuracy"] for r in results if "accuracy" in r]
    return {"seconds": seconds, "user": user, "system": system, "accuracy": statistics.fmean(accuracies)}


def run_processes(overrides: list[str], rounds: int, work: Path) -> dict[str, float]:
    out = work / f"run-{rounds}"
    cmd = [sys.executable, "-m", "dfedrw.experiments.cli", "run", "--out", str(out), *(f"--set={o}" for o in [*overrides, f"rounds={rounds}"])]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    user, system = _wait_all([proc], 1800)
    seconds = time.monotonic() - start
    summary = json.loads((out / "summary.json").read_text())
    subprocess.run(["rm", "-rf", str(out)], check=False)
    return {"seconds": seconds, "user": user, "system": system, "accuracy": float(summary["honest_mean_accuracy"])}


def lenet_data(folder: Path) -> None:
    """The first ``LENET_ROWS`` training rows of Fashion-MNIST and its whole test set, as IDX
    files in ``folder``."""
    import gzip

    source = Path("/usr/share/datasets/fashion-mnist")
    folder.mkdir(parents=True, exist_ok=True)
    for stem, rows in (("train-images-idx3-ubyte", LENET_ROWS), ("train-labels-idx1-ubyte", LENET_ROWS), ("t10k-images-idx3-ubyte", None), ("t10k-labels-idx1-ubyte", None)):
        raw = gzip.decompress((source / f"{stem}.gz").read_bytes())
        dims = raw[3]
        shape = list(struct.unpack(f">{dims}I", raw[4 : 4 + 4 * dims]))
        item = 1
        for d in shape[1:]:
            item *= d
        if rows is not None:
            shape[0] = rows
        head = raw[:4] + struct.pack(f">{dims}I", *shape)
        (folder / stem).write_bytes(head + raw[4 + 4 * dims : 4 + 4 * dims + shape[0] * item])


def per_round(short: dict[str, float], long: dict[str, float], rounds: int) -> dict[str, float]:
    return {key: (long[key] - short[key]) / rounds for key in ("seconds", "user", "system")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", choices=[*JOBS, "all"], default="all")
    parser.add_argument("--pairs", type=int, default=3, help="alternated pairs of the two systems (default 3)")
    parser.add_argument("--rounds", default=None, help="SHORT,LONG: the two lengths each system runs (default: lenet-ring 20,320, default 20,1020)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--grpc-floor", action="store_true", help="also run the floor with its links over gRPC, its synchronous and its asyncio API (two more systems, in the same alternation)")
    parser.add_argument("--floor-client", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_client is not None:
        floor_client(json.loads(args.floor_client))
        return 0
    lengths = dict(LENGTHS)
    if args.rounds is not None:
        try:
            short, long = (int(x) for x in args.rounds.split(","))
        except ValueError:
            parser.error(f"--rounds {args.rounds!r}: expected SHORT,LONG")
        lengths = dict.fromkeys(LENGTHS, (short, long))
    if any(not 1 <= a < b for a, b in lengths.values()) or args.pairs < 1:
        parser.error("--rounds needs 1 <= SHORT < LONG, --pairs at least 1")
    jobs = list(JOBS) if args.job == "all" else [args.job]
    report: dict[str, Any] = {"pairs": args.pairs, "cpus": os.cpu_count(), "jobs": {}}
    with tempfile.TemporaryDirectory(prefix="round-floor-") as tmp:
        work = Path(tmp)
        lenet_data(work / "lenet-data")
        for job in jobs:
            short, long = lengths[job]
            overrides = [*JOBS[job], *([f"data.dir={work / 'lenet-data'}"] if job == "lenet-ring" else [])]
            systems = {"processes": run_processes, "floor": run_floor}
            if args.grpc_floor:
                systems["grpc floor"] = functools.partial(run_floor, grpc="sync")
                systems["grpc aio floor"] = functools.partial(run_floor, grpc="aio")
            figures: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
            accuracy: dict[str, float] = {}
            for pair in range(args.pairs):
                for name, run in systems.items():
                    a = run(overrides, short, work)
                    b = run(overrides, long, work)
                    figures[name].append(per_round(a, b, long - short))
                    accuracy[name] = b["accuracy"]
                    f = figures[name][-1]
                    log(f"{job} pair {pair + 1}/{args.pairs}: {name}: {1000 * f['seconds']:.1f} ms a round, CPU user {1000 * f['user']:.1f} ms, system {1000 * f['system']:.1f} ms; accuracy after {long} rounds {b['accuracy']:.2f}%")
            med = {name: {key: statistics.median(f[key] for f in rows) for key in ("seconds", "user", "system")} for name, rows in figures.items()}
            ratios = {
                name: {key: statistics.median(p[key] / f[key] for p, f in zip(figures[name], figures["floor"], strict=True)) for key in ("seconds", "user", "system")}
                for name in systems
                if name != "floor"
            }
            report["jobs"][job] = {"rounds": [short, long], "per_round": figures, "median": med, "ratio_median": ratios, "accuracy": accuracy}
    spans = ", ".join(f"{job} {rep['rounds'][0]} and {rep['rounds'][1]}" for job, rep in report["jobs"].items())
    print(f"round_floor: a round's figures, medians of {args.pairs} alternated pairs, the rounds of two runs differenced ({spans}); {os.cpu_count()} CPUs")
    print("| job | system | seconds a round | CPU user a round | CPU system a round | accuracy % |")
    print("|---|---|---:|---:|---:|---:|")
    for job, rep in report["jobs"].items():
        for name, m in rep["median"].items():
            print(f"| {job} | {name} | {m['seconds'] * 1000:.1f} ms | {m['user'] * 1000:.1f} ms | {m['system'] * 1000:.1f} ms | {rep['accuracy'][name]:.2f} |")
        for name, r in rep["ratio_median"].items():
            print(f"| {job} | {name} / floor | {r['seconds']:.2f}x | {r['user']:.2f}x | {r['system']:.2f}x | |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
