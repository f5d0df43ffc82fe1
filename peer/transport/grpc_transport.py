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
from collections import deque
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


class _Sender:
    """One neighbour's outgoing queue, drained by one thread making blocking calls.

    A thread per neighbour instead of ``.future()`` calls: gRPC Python starts a channel-spin
    thread for a future call whenever the channel has none in flight, i.e. once per message
    here, and those thread starts were the largest cost of a round over gRPC. Each sender has
    its own condition, so queueing a message wakes only the thread that sends it. One sender
    also keeps the messages to a neighbour in order. Only the newest few messages are kept: if
    a neighbour is so slow that more pile up, the oldest are dropped (they would arrive stale).
    """

    MAX_QUEUED = 4

    def __init__(self, peer: int, stub: pb_grpc.PeerStub, transport: "GrpcTransport") -> None:
        self.peer = peer
        self.stub = stub
        self.transport = transport
        self.cond = threading.Condition()
        self.queue: deque[list[pb.ModelChunk]] = deque()
        self.busy = False
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name=f"send-{peer}", daemon=True)
        self.thread.start()

    def put(self, chunks: list[pb.ModelChunk]) -> bool:
        """Queue one message; True when the oldest queued one was dropped to make room."""
        with self.cond:
            dropped = len(self.queue) >= self.MAX_QUEUED
            if dropped:
                self.queue.popleft()
            self.queue.append(chunks)
            self.cond.notify()
        return dropped

    def wait_idle(self, deadline: float) -> None:
        with self.cond:
            while self.queue or self.busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.cond.wait(left)

    def stop(self) -> None:
        with self.cond:
            self.closed = True
            self.queue.clear()
            self.cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait()
                if self.closed:
                    return
                chunks = self.queue.popleft()
                self.busy = True
            self._push(chunks)
            with self.cond:
                self.busy = False
                if not self.queue:
                    self.cond.notify_all()  # a flush() may be waiting

    def _push(self, chunks: list[pb.ModelChunk]) -> None:
        t = self.transport
        try:
            if len(chunks) == 1:
                reply = self.stub.PushOne(chunks[0], timeout=t.send_timeout)
            else:
                reply = self.stub.Push(iter(chunks), timeout=t.send_timeout)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                t._on_reachability(self.peer, False)
            else:
                log.debug("send to %d failed: %s", self.peer, err)
            return
        t._on_reachability(self.peer, True)
        if not reply.accepted:
            log.debug("peer %d refused our message: %s", self.peer, reply.reason)


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
        self._senders: dict[int, _Sender] = {}
        self._sized: tuple[list[pb.ModelChunk] | None, int] = (None, 0)
        self._on_reachability: Reachability = lambda peer, ok: None
        self.bytes_sent = 0
        self.dropped = 0

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
            self._senders[peer] = _Sender(peer, pb_grpc.PeerStub(channel), self)

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
        sender = self._senders.get(to)
        if sender is None:  # never connected (no address): nothing to send to
            return
        # The round loop sends one message object to every neighbour: size it once.
        last, size = self._sized
        if last is not chunks:
            size = sum(c.ByteSize() for c in chunks)
            self._sized = (chunks, size)
        if sender.put(chunks):
            self.dropped += 1
        self.bytes_sent += size

    def flush(self, timeout: float) -> None:
        """Wait until every queued message was sent (or failed), at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        for sender in self._senders.values():
            sender.wait_idle(deadline)

    def close(self) -> None:
        for sender in self._senders.values():
            sender.stop()
        for channel in self._channels.values():
            channel.close()
        for sender in self._senders.values():
            sender.thread.join(timeout=2.0)
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
        self._sized = (None, 0)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
