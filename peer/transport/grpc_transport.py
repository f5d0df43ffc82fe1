"""gRPC transport: one server per client and a channel to each neighbour.

Models go to a neighbour on one long-lived ``Exchange`` call, one message at a time: the next
goes out once the receiver's reply to the previous one came back. The servicer is thin: it cuts
the call into messages at their header chunks, hands each to the client's ``deliver`` callback
and turns the verdict into a reply. ``Push``/``PushOne`` take one message per call, for tools
and tests. Message-size limits are explicit on both ends (a model larger than one chunk streams
in several), and ``grpc.so_reuseport`` is off so two clients can never share a port silently.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent import futures

import grpc

from peer.transport.base import Deliver, Reachability
from peer.transport.pb import peer_pb2 as pb
from peer.transport.pb import peer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

# Room for the header and protobuf framing on top of one chunk of tensor bytes.
_FRAMING = 1 << 20


def handle_push(chunks: Iterable[pb.ModelChunk], deliver: Deliver) -> pb.PushReply:
    accepted, reason, round_ = deliver(chunks)
    return pb.PushReply(accepted=accepted, reason=reason, round=round_)


def split_messages(chunks: Iterable[pb.ModelChunk], max_bytes: int) -> Iterator[list[pb.ModelChunk]]:
    """Cut an ``Exchange`` call into messages: a header chunk starts one, and it is complete
    when its data reaches ``header.total_bytes``. A data chunk outside a message comes out on
    its own (the receiver rejects it: no header); a message whose header declares more than
    ``max_bytes`` comes out at once (rejected: too large) and its data is skipped, so a message
    never holds more than ``max_bytes`` in memory; a message cut short by the next header or
    the end of the call comes out as it is (rejected: size mismatch). One message out, one
    reply back: the sender counts on it."""
    current: list[pb.ModelChunk] = []
    need = have = 0
    skipping = False
    for chunk in chunks:
        if chunk.HasField("header"):
            if current:
                yield current
            current, need, have, skipping = [chunk], chunk.header.total_bytes, len(chunk.data), False
            if need > max_bytes:
                yield current
                current, skipping = [], True
                continue
        elif skipping:
            continue
        elif not current:
            yield [chunk]
            continue
        else:
            current.append(chunk)
            have += len(chunk.data)
        if have >= need:
            yield current
            current = []
    if current:
        yield current


class PeerServicer(pb_grpc.PeerServicer):
    def __init__(self, deliver: Deliver, max_bytes: int) -> None:
        self._deliver = deliver
        self._max_bytes = max_bytes

    def Push(self, request_iterator, context):  # noqa: N802 - gRPC method name
        return handle_push(request_iterator, self._deliver)

    def PushOne(self, request, context):  # noqa: N802 - gRPC method name
        return handle_push(iter((request,)), self._deliver)

    def Exchange(self, request_iterator, context):  # noqa: N802 - gRPC method name
        for message in split_messages(request_iterator, self._max_bytes):
            reply = handle_push(message, self._deliver)
            yield reply
            if reply.reason == "not_neighbour":
                return  # a stranger does not get to hold one of our server threads


class _Sender:
    """One neighbour's outgoing queue and the ``Exchange`` call that carries it.

    A long-lived call instead of a call per message: a unary call costs gRPC Python several
    thread hand-offs on each side (about 0.4 ms of CPU per message on loopback), a message and
    its reply on an open call less than half that.

    One message in flight at a time. gRPC counts a message as sent once it is in the
    connection's buffer, so without the wait for the reply every queued message would go there
    at once, and on a lossy link the fresh model would sit behind a backlog of ones that arrive
    stale. Here they wait in the queue, where only the newest few are kept (older ones are
    dropped), as with a call per message. Each reply carries the receiver's round: queued
    messages for earlier rounds would arrive stale and are dropped unsent.

    The sender thread opens a call when there is something to send and reads its replies; gRPC's
    own thread takes the messages from :meth:`_messages`. A call that fails, or whose reply is
    more than ``send_timeout`` late (the call is cancelled), loses the message in flight; the
    next message opens a new call. Each sender has its own condition, so queueing a message
    wakes only its own threads.
    """

    MAX_QUEUED = 4

    def __init__(self, peer: int, stub: pb_grpc.PeerStub, transport: "GrpcTransport") -> None:
        self.peer = peer
        self.stub = stub
        self.transport = transport
        self.cond = threading.Condition()
        self.queue: deque[list[pb.ModelChunk]] = deque()  # each message starts with its header chunk
        self.in_flight = False  # a message awaits its reply
        self.skipped_stale = 0  # queued messages for rounds the receiver had already passed
        self.sent_at = 0.0  # when it went out
        self.call: grpc.Call | None = None
        self.call_id = 0  # a new id ends the message iterator of the previous call
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
            self.cond.notify_all()
        return dropped

    def wait_idle(self, deadline: float) -> None:
        """Wait (until ``deadline``) for every queued message to be answered or lost."""
        with self.cond:
            self.cond.wait_for(lambda: not (self.queue or self.in_flight), deadline - time.monotonic())

    def stop(self) -> None:
        with self.cond:
            self.closed = True
            self.queue.clear()
            self.cond.notify_all()

    def _messages(self, call_id: int) -> Iterator[pb.ModelChunk]:
        timeout = self.transport.send_timeout
        while True:
            with self.cond:
                while not self.closed and self.call_id == call_id and (self.in_flight or not self.queue):
                    if not self.in_flight:
                        self.cond.wait()
                        continue
                    left = self.sent_at + timeout - time.monotonic()
                    if left <= 0:
                        log.debug("no reply from %d in %.0f s; cancelling the call", self.peer, timeout)
                        if self.call is not None:
                            self.call.cancel()
                        return
                    self.cond.wait(left)
                if self.closed or self.call_id != call_id:
                    return
                chunks = self.queue.popleft()
                self.in_flight, self.sent_at = True, time.monotonic()
            yield from chunks

    def _on_reply(self, reply: pb.PushReply) -> None:
        with self.cond:
            self.in_flight = False
            while self.queue and self.queue[0][0].header.round < reply.round:
                self.queue.popleft()  # queued in round order: the oldest go first
                self.skipped_stale += 1
            self.cond.notify_all()
        self.transport._on_reachability(self.peer, True)
        if not reply.accepted:
            log.debug("peer %d refused a message of ours: %s", self.peer, reply.reason)

    def _loop(self) -> None:
        t = self.transport
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait()
                if self.closed:
                    return
                self.call_id += 1
                call_id = self.call_id
            try:
                call = self.stub.Exchange(self._messages(call_id))
                with self.cond:
                    self.call = call
                for reply in call:
                    self._on_reply(reply)
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.UNAVAILABLE:
                    t._on_reachability(self.peer, False)
                else:
                    log.debug("call to %d ended: %s", self.peer, err)
            finally:
                with self.cond:
                    self.call_id += 1
                    self.call = None
                    self.in_flight = False
                    self.cond.notify_all()


class GrpcTransport:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        chunk_bytes: int = 1 << 20,
        send_timeout: float = 30.0,
        max_message_bytes: int = 256 << 20,
        max_workers: int = 8,
        advertise: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.advertise = advertise
        self.send_timeout = send_timeout
        self.max_message_bytes = max_message_bytes
        self._limit = chunk_bytes + _FRAMING
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._channels: dict[int, grpc.Channel] = {}
        self._senders: dict[int, _Sender] = {}
        self._sized: tuple[list[pb.ModelChunk] | None, int] = (None, 0)
        self._on_reachability: Reachability = lambda peer, ok: None
        self.bytes_sent = 0
        self.dropped = 0  # queued messages pushed out by newer ones

    @property
    def skipped_stale(self) -> int:
        """Queued messages dropped unsent because the receiver had passed their round."""
        return sum(s.skipped_stale for s in self._senders.values())

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
        pb_grpc.add_PeerServicer_to_server(PeerServicer(deliver, self.max_message_bytes), self._server)
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
