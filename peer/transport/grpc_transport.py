"""gRPC transport: one server per client and a channel to each neighbour.

The servicer is thin: it hands the Push stream to the client's ``deliver`` callback and turns
the verdict into a reply. Message-size limits are explicit on both ends (a model larger than
one chunk streams in several), and ``grpc.so_reuseport`` is off so two clients can never share
a port silently.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent import futures

import grpc

from peer.transport.base import Deliver, Reachability
from peer.transport.pb import peer_pb2 as pb
from peer.transport.pb import peer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

# Room for the header and protobuf framing on top of one chunk of tensor bytes.
_FRAMING = 1 << 20


def handle_push(chunks: Iterable[pb.ModelChunk], deliver: Deliver) -> pb.PushReply:
    accepted, reason = deliver(chunks)
    return pb.PushReply(accepted=accepted, reason=reason)


class PeerServicer(pb_grpc.PeerServicer):
    def __init__(self, deliver: Deliver) -> None:
        self._deliver = deliver

    def Push(self, request_iterator, context):  # noqa: N802 - gRPC method name
        return handle_push(request_iterator, self._deliver)

    def PushOne(self, request, context):  # noqa: N802 - gRPC method name
        return handle_push(iter((request,)), self._deliver)


class GrpcTransport:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        chunk_bytes: int = 1 << 20,
        send_timeout: float = 30.0,
        max_workers: int = 8,
        advertise: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.advertise = advertise
        self.send_timeout = send_timeout
        self._limit = chunk_bytes + _FRAMING
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._channels: dict[int, grpc.Channel] = {}
        self._stubs: dict[int, pb_grpc.PeerStub] = {}
        self._inflight: set[grpc.Future] = set()
        self._lock = threading.Lock()
        self._on_reachability: Reachability = lambda peer, ok: None
        self.bytes_sent = 0

    def _options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_send_message_length", self._limit),
            ("grpc.max_receive_message_length", self._limit),
        ]

    def start(self, deliver: Deliver) -> str:
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="peer-rpc"),
            options=[*self._options(), ("grpc.so_reuseport", 0)],
        )
        pb_grpc.add_PeerServicer_to_server(PeerServicer(deliver), self._server)
        bound = self._server.add_insecure_port(f"{_bracket(self.host)}:{self.port}")
        if bound == 0:
            raise OSError(f"could not listen on {self.host}:{self.port} (port in use?)")
        self.port = bound
        self._server.start()
        return f"{_bracket(self.advertise or self.host)}:{bound}"

    def connect(self, addresses: Mapping[int, str], on_reachability: Reachability) -> None:
        self._on_reachability = on_reachability
        for peer, address in addresses.items():
            channel = grpc.insecure_channel(address, options=self._options())
            self._channels[peer] = channel
            self._stubs[peer] = pb_grpc.PeerStub(channel)

    def wait_ready(self, timeout: float) -> list[int]:
        pending = {peer: grpc.channel_ready_future(ch) for peer, ch in self._channels.items()}
        late = []
        for peer, ready in pending.items():
            try:
                ready.result(timeout=timeout)
            except grpc.FutureTimeoutError:
                late.append(peer)
        return late

    def send(self, to: int, chunks: list[pb.ModelChunk]) -> None:
        stub = self._stubs.get(to)
        if stub is None:  # never connected (no address): nothing to send to
            return
        size = sum(c.ByteSize() for c in chunks)
        if len(chunks) == 1:
            # Unary: a streaming call costs gRPC Python a thread per call to drain the iterator.
            future = stub.PushOne.future(chunks[0], timeout=self.send_timeout)
        else:
            future = stub.Push.future(iter(chunks), timeout=self.send_timeout)
        with self._lock:
            self._inflight.add(future)
            self.bytes_sent += size

        def done(f: grpc.Future, peer: int = to) -> None:
            with self._lock:
                self._inflight.discard(f)
            err = f.exception()
            if err is None:
                self._on_reachability(peer, True)
                reply = f.result()
                if not reply.accepted:
                    log.debug("peer %d refused our message: %s", peer, reply.reason)
            elif isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.UNAVAILABLE:
                self._on_reachability(peer, False)
            else:
                log.debug("send to %d failed: %s", peer, err)

        future.add_done_callback(done)

    def flush(self, timeout: float) -> None:
        with self._lock:
            pending = list(self._inflight)
        deadline = time.monotonic() + timeout
        for f in pending:
            try:
                f.exception(timeout=max(0.0, deadline - time.monotonic()))
            except grpc.FutureTimeoutError:
                return

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        if self._server is not None:
            self._server.stop(grace=0.5).wait()


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
