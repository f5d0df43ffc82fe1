"""Throughput of one link: model messages from one client process to another over gRPC with
mutual TLS, against a raw mutual-TLS socket (Python ``ssl``, loopback, the same certificates)
carrying the same bytes, in one invocation.

    python bench/link_bench.py                          # 44 MB models (11,018,670 float32), 8 messages a try, 3 tries each
    python bench/link_bench.py --params 2000000 --messages 20 --chunk-bytes 262144 1048576 4194304

Each try starts a receiving process (this script with ``--serve``) and sends it ``--messages``
models from this one, one message in flight: the next goes once the receiver answered the
previous one, as a client sends to a neighbour. Over gRPC the receiver is a client's receive
path: the gRPC server, the intake (each message decoded into a buffer sized once from its
header, its checksum and values checked) and the inbox, which it advances as each message
arrives. Over the raw socket the receiver reads each message into one preallocated buffer
(``recv_into``) and answers with one byte: the most a TLS connection carries on this machine
from Python. Tries alternate raw, gRPC, raw, gRPC, ... so that a machine whose speed drifts
affects both alike; printed: MB/s of every try (model bytes / seconds from the first byte
sent to the last answer) and the CPU seconds each end spent per GB, the medians, and the ratio
gRPC/raw of each pair of tries with their median: the figure to quote (on a busy machine the
CPU seconds per GB vary less than the speeds).
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_ACK = b"\x01"
_cpu_at_ready = 0.0


def _frozen() -> None:
    """Imports done: their objects out of the garbage collector's reach, as in a client process
    (forked from the fork server, which freezes them: launch/forkserver.py)."""
    gc.collect()
    gc.freeze()


def _ready(port: int) -> None:
    """A receiver tells the sender its port; its CPU time is counted from here."""
    global _cpu_at_ready
    _frozen()
    _cpu_at_ready = time.process_time()
    print(port, flush=True)


# ----------------------------------------------------------------------------- the raw TLS socket


def _tls_context(certs: Path, client: int, server: bool) -> ssl.SSLContext:
    from dfedrw.peer.transport.identity import CA_FILE, cert_file, key_file

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_cert_chain(certs / cert_file(client), certs / key_file(client))
    ctx.load_verify_locations(certs / CA_FILE)
    ctx.verify_mode = ssl.CERT_REQUIRED  # mutual: each end proves it holds a certificate of the run
    return ctx


def _recv_exactly(conn: ssl.SSLSocket, view: memoryview) -> None:
    while view:
        got = conn.recv_into(view)
        if not got:
            raise ConnectionError("the sender closed the connection")
        view = view[got:]


def serve_raw(certs: Path, size: int, messages: int) -> None:
    ctx = _tls_context(certs, 1, server=True)
    buffer = memoryview(bytearray(size))
    header = memoryview(bytearray(8))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        _ready(listener.getsockname()[1])
        plain, _ = listener.accept()
        with ctx.wrap_socket(plain, server_side=True) as conn:
            for _ in range(messages):
                _recv_exactly(conn, header)
                if int.from_bytes(header, "little") != size:
                    raise ValueError("unexpected message size")
                _recv_exactly(conn, buffer)
                conn.sendall(_ACK)


def send_raw(certs: Path, port: int, payload: memoryview, messages: int) -> float:
    from dfedrw.peer.transport.identity import run_id_of, server_name

    ctx = _tls_context(certs, 0, server=False)
    header = len(payload).to_bytes(8, "little")
    ack = memoryview(bytearray(1))
    with socket.create_connection(("127.0.0.1", port)) as plain:
        with ctx.wrap_socket(plain, server_hostname=server_name(run_id_of(certs), 1)) as conn:
            conn.do_handshake()
            start = time.perf_counter()
            for _ in range(messages):
                conn.sendall(header)
                conn.sendall(payload)
                _recv_exactly(conn, ack)
            return time.perf_counter() - start


# ----------------------------------------------------------------------------- gRPC


def _specs(params: int):
    from dfedrw.peer.transport.serde import TensorSpec

    return (TensorSpec("weight", "float32", (params,)),)


def serve_grpc(certs: Path, params: int, messages: int, chunk_bytes: int) -> None:
    from dfedrw.peer.transport.identity import load_identity
    from dfedrw.peer.transport.intake import ModelIntake
    from dfedrw.peer.transport.grpc.transport import GrpcTransport
    from dfedrw.peer.transport.inbox import Inbox
    from dfedrw.peer.transport.serde import Plausible

    specs = _specs(params)
    size = params * 4
    inbox = Inbox(1, [0], 2, window=2, model_size=params)
    intake = ModelIntake(inbox, specs, Plausible(), size + 1)
    done = threading.Event()
    transport = GrpcTransport("127.0.0.1", 0, chunk_bytes=chunk_bytes, max_message_bytes=size, identity=load_identity(certs, 1))
    address = transport.start(intake)
    _ready(int(address.rsplit(":", 1)[1]))

    def advance() -> None:
        for r in range(messages):
            inbox.wait(r, {0}, 120.0)
            inbox.advance(r + 1)
        done.set()

    threading.Thread(target=advance, daemon=True).start()
    done.wait(600.0)
    transport.close()
    if inbox.accepted != messages:
        raise SystemExit(f"received {inbox.accepted} of {messages} messages; rejected {dict(inbox.rejected)}")


def send_grpc(certs: Path, port: int, vector, messages: int, chunk_bytes: int) -> float:
    from dfedrw.peer.transport.identity import load_identity
    from dfedrw.peer.transport.grpc.transport import GrpcTransport
    from dfedrw.peer.transport.serde import message_out

    specs = _specs(len(vector))
    transport = GrpcTransport("127.0.0.1", 0, chunk_bytes=chunk_bytes, max_message_bytes=len(vector) * 4, identity=load_identity(certs, 0))
    try:
        transport.connect({1: f"127.0.0.1:{port}"}, lambda peer, state: None)
        if transport.wait_ready(30.0):
            raise RuntimeError("the receiver is not reachable")
        start = time.perf_counter()
        for r in range(messages):
            transport.send(1, message_out(0, r, vector, specs, chunk_bytes=chunk_bytes))
            transport.flush(120.0)
        seconds = time.perf_counter() - start
        replies = transport.peer_replies.get(1)
        if replies is None or replies[0] < messages - 1 or not replies[1]:
            raise RuntimeError(f"the receiver's last reply was {replies}")
        return seconds
    finally:
        transport.close()


# ----------------------------------------------------------------------------- driver


def _receiver(kind: str, certs: Path, args: argparse.Namespace, chunk_bytes: int) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, __file__, "--serve", kind, "--certs", str(certs), "--params", str(args.params), "--messages", str(args.messages),
           "--chunk-bytes", str(chunk_bytes)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = proc.stdout.readline()
    if not line.strip():
        proc.wait(10)
        raise RuntimeError(f"the {kind} receiver did not start (exit {proc.returncode})")
    return proc, int(line)


def _one_try(kind: str, certs: Path, args: argparse.Namespace, vector, chunk_bytes: int) -> tuple[float, float, float]:
    """(MB/s, sender CPU seconds per GB, receiver CPU seconds per GB) of one try."""
    proc, port = _receiver(kind, certs, args, chunk_bytes)
    try:
        cpu = time.process_time()
        if kind == "raw":
            seconds = send_raw(certs, port, memoryview(vector.numpy()).cast("B"), args.messages)
        else:
            seconds = send_grpc(certs, port, vector, args.messages, chunk_bytes)
        cpu = time.process_time() - cpu
        receiver_cpu = float(proc.stdout.readline() or "nan")
        if proc.wait(60) != 0:
            raise RuntimeError(f"the {kind} receiver exited with {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    gigabytes = args.messages * len(vector) * 4 / 1e9
    return gigabytes * 1e3 / seconds, cpu / gigabytes, receiver_cpu / gigabytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=int, default=11_018_670, help="float32 values a model holds (default: the 11 M-parameter MLP, 44 MB)")
    parser.add_argument("--messages", type=int, default=8, help="messages a try sends (default 8)")
    parser.add_argument("--tries", type=int, default=3, help="tries of each (default 3)")
    parser.add_argument("--chunk-bytes", type=int, nargs="+", default=[1 << 20], help="gRPC chunk sizes to measure (default 1 MiB)")
    parser.add_argument("--serve", choices=["raw", "grpc"], help=argparse.SUPPRESS)
    parser.add_argument("--certs", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not (1 <= args.messages <= 1000 and 1 <= args.tries <= 20 and 1 <= args.params <= 100_000_000):
        parser.error("--messages 1..1000, --tries 1..20, --params 1..1e8")
    if args.serve:
        if args.serve == "raw":
            serve_raw(args.certs, args.params * 4, args.messages)
        else:
            serve_grpc(args.certs, args.params, args.messages, args.chunk_bytes[0])
        print(time.process_time() - _cpu_at_ready, flush=True)  # its CPU seconds receiving, for the sender to read
        return 0

    import torch

    from dfedrw.peer.transport.identity import make_certificates

    vector = torch.randn(args.params, generator=torch.Generator().manual_seed(0))
    _frozen()
    size_mb = args.params * 4 / 1e6
    print(f"{args.messages} messages of {size_mb:.1f} MB a try, one in flight, loopback, mutual TLS, {args.tries} tries each", flush=True)
    with tempfile.TemporaryDirectory(prefix="link-bench-") as tmp:
        certs = Path(tmp) / "certs"
        make_certificates(2, certs)
        for chunk_bytes in args.chunk_bytes:
            tries: dict[str, list[tuple[float, float, float]]] = {"raw": [], "grpc": []}
            ratios = []
            for i in range(args.tries):
                for kind in ("raw", "grpc"):
                    tries[kind].append(_one_try(kind, certs, args, vector, chunk_bytes))
                    speed, sender_cpu, receiver_cpu = tries[kind][-1]
                    print(f"try {i + 1} {kind:>4}: {speed:8.1f} MB/s   CPU s per GB: sender {sender_cpu:5.2f}, receiver {receiver_cpu:5.2f}", flush=True)
                ratios.append(tries["grpc"][-1][0] / tries["raw"][-1][0])
            med = {kind: [statistics.median(t[j] for t in tries[kind]) for j in range(3)] for kind in tries}
            print(
                f"chunk {chunk_bytes} B: raw TLS socket {med['raw'][0]:.1f} MB/s, gRPC model messages {med['grpc'][0]:.1f} MB/s (medians); "
                f"ratio gRPC/raw {statistics.median(ratios):.2f} (median of the tries' ratios; each {', '.join(f'{r:.2f}' for r in ratios)}); "
                f"CPU s per GB sender/receiver: raw {med['raw'][1]:.2f}/{med['raw'][2]:.2f}, gRPC {med['grpc'][1]:.2f}/{med['grpc'][2]:.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
