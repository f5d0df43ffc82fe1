"""gRPC transport: one server per client and a channel to each neighbour, on gRPC's asyncio API.

Models go to a neighbour on one long-lived ``Exchange`` call, one message at a time: the next
goes out once the receiver's reply to the previous one came back. The servicer is thin: it cuts
the call into messages at their header chunks, hands each to the client's ``deliver`` callback
and turns the verdict into a reply. ``Push``/``PushOne`` take one message per call, for tools
and tests. Message-size limits are explicit on both ends (a model larger than one chunk streams
in several), and ``grpc.so_reuseport`` is off so two clients can never share a port silently.

Every server, channel and call of a process runs on one event loop in one thread (``grpc-io``),
started on first use. The round loop hands a message over with one thread-safe call; gRPC's
threaded API would have passed each message and each reply between several threads per call
(request iterator, channel poller, sender, server poller, handler pool). ``deliver`` runs on
the event loop and must return promptly: the client's own validates, decodes and buffers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import grpc

from peer.identity import ClientIdentity, client_of_uri, server_name
from peer.transport.base import Deliver, Reachability
from peer.transport.pb import peer_pb2 as pb
from peer.transport.pb import peer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

# Room for the header and protobuf framing on top of one chunk of tensor bytes.
_FRAMING = 1 << 20

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def io_loop() -> asyncio.AbstractEventLoop:
    """The process's gRPC event loop, on a daemon thread started on first use. One loop for the
    whole process: gRPC's asyncio layer shares one completion queue among all loops."""
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            threading.Thread(target=run, name="grpc-io", daemon=True).start()
            started.wait()
            _loop = loop
        return _loop


def on_loop(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the gRPC event loop and wait (at most ``timeout`` s) for its result."""
    return asyncio.run_coroutine_threadsafe(coro, io_loop()).result(timeout)


def handle_push(chunks: Iterable[pb.ModelChunk], deliver: Deliver, sender: int | None = None) -> pb.PushReply:
    accepted, reason, round_ = deliver(chunks, sender)
    return pb.PushReply(accepted=accepted, reason=reason, round=round_)


def authenticated_sender(context, run_id: str | None) -> int | None:
    """The client id in the caller's verified certificate (gRPC checked it against the run's
    CA during the handshake); None when the server runs without TLS. Raises ``PermissionError``
    for a certificate that names no client of this run."""
    if run_id is None:
        return None
    uris = context.auth_context().get("peer_uri", [])
    ids = {client_of_uri(u.decode("ascii", "replace"), run_id) for u in uris}
    if len(ids) != 1 or None in ids:
        raise PermissionError("no client identity of this run in the peer certificate")
    return ids.pop()


class MessageSplitter:
    """Cuts an ``Exchange`` call into messages, one chunk at a time: a header chunk starts one,
    and it is complete when its data reaches ``header.total_bytes``. A data chunk outside a
    message comes out on its own (the receiver rejects it: no header); a message whose header
    declares more than ``max_bytes`` comes out at once (rejected: too large) and its data is
    skipped, so a message never holds more than ``max_bytes`` in memory; a message cut short by
    the next header or the end of the call comes out as it is (rejected: size mismatch). One
    message out, one reply back: the sender counts on it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.current: list[pb.ModelChunk] = []
        self.need = self.have = 0
        self.skipping = False

    def feed(self, chunk: pb.ModelChunk) -> list[list[pb.ModelChunk]]:
        """The messages this chunk completes (none, one, or two when it cuts one short)."""
        out = []
        if chunk.HasField("header"):
            if self.current:
                out.append(self.current)
            self.current, self.need, self.have = [chunk], chunk.header.total_bytes, len(chunk.data)
            self.skipping = self.need > self.max_bytes
            if self.skipping:
                out.append(self.current)
                self.current = []
                return out
        elif self.skipping:
            return out
        elif not self.current:
            return [[chunk]]
        else:
            self.current.append(chunk)
            self.have += len(chunk.data)
        if self.have >= self.need:
            out.append(self.current)
            self.current = []
        return out

    def end(self) -> list[list[pb.ModelChunk]]:
        """What is left when the call ends: a message cut short, if any."""
        out, self.current = ([self.current] if self.current else []), []
        return out


def split_messages(chunks: Iterable[pb.ModelChunk], max_bytes: int) -> Iterator[list[pb.ModelChunk]]:
    """The messages of a call's chunks (see :class:`MessageSplitter`)."""
    splitter = MessageSplitter(max_bytes)
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.end()


def server_credentials(identity: ClientIdentity) -> grpc.ServerCredentials:
    """Mutual TLS: a caller must present a certificate from the run's CA."""
    return grpc.ssl_server_credentials([(identity.key_pem, identity.cert_pem)], root_certificates=identity.ca_pem, require_client_auth=True)


def channel_credentials(identity: ClientIdentity) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=identity.ca_pem, private_key=identity.key_pem, certificate_chain=identity.cert_pem)


def identity_options(identity: ClientIdentity, peer: int) -> list[tuple[str, str]]:
    """Channel options that make the receiver prove it is client ``peer`` of this run, not only
    that the run's CA signed its certificate: its DNS name says which client it is."""
    return [("grpc.ssl_target_name_override", server_name(identity.run_id, peer))]


class PeerServicer(pb_grpc.PeerServicer):
    """Thin: who is calling (from the TLS handshake), then each message to ``deliver``.

    With TLS each authenticated client has one ``Exchange`` slot: a new call from the same
    client replaces its older one (a client that restarted opens a new call), so no one can
    take another's slot, and a stranger is turned away before it sends a byte of model."""

    def __init__(self, deliver: Deliver, max_bytes: int, run_id: str | None = None) -> None:
        self._deliver = deliver
        self._max_bytes = max_bytes
        self._run_id = run_id
        self._open_calls: set[asyncio.Task] = set()  # the tasks serving open Exchange calls
        self._slots: dict[int, asyncio.Task] = {}  # authenticated sender -> its Exchange call
        self.refused_calls = 0  # calls ended at once: no client identity of this run

    def end_calls(self) -> None:
        """Cancel every open ``Exchange`` call (on closing: neighbours that are still running
        keep theirs open). Stopping the server under them would abort each with a warning."""
        for task in self._open_calls:
            task.cancel()

    async def _sender(self, context) -> int | None:
        try:
            return authenticated_sender(context, self._run_id)
        except PermissionError:
            self.refused_calls += 1
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no client identity of this run")

    async def Push(self, request_iterator, context):  # noqa: N802 - gRPC method name
        sender = await self._sender(context)
        # Read no more than one message's worth: what is beyond is rejected unread.
        chunks, size = [], 0
        async for chunk in request_iterator:
            chunks.append(chunk)
            size += chunk.ByteSize()
            if size > self._max_bytes:
                break
        return handle_push(chunks, self._deliver, sender)

    async def PushOne(self, request, context):  # noqa: N802 - gRPC method name
        return handle_push((request,), self._deliver, await self._sender(context))

    async def Exchange(self, request_iterator, context):  # noqa: N802 - gRPC method name
        sender = await self._sender(context)
        task = asyncio.current_task()
        self._open_calls.add(task)
        if sender is not None:
            older = self._slots.get(sender)
            if older is not None and older is not task:
                older.cancel()
            self._slots[sender] = task
        try:
            splitter = MessageSplitter(self._max_bytes)
            async for message in _messages(request_iterator, splitter):
                reply = handle_push(message, self._deliver, sender)
                yield reply
                if reply.reason in _END_CALL:
                    return  # a stranger or an impostor does not get to keep a call open here
        finally:
            self._open_calls.discard(task)
            if sender is not None and self._slots.get(sender) is task:
                del self._slots[sender]


# Verdicts after which the receiver ends the call: nothing else on it can be accepted.
_END_CALL = frozenset({"not_neighbour", "unknown_sender", "impersonation"})


async def _messages(chunks: AsyncIterator[pb.ModelChunk], splitter: MessageSplitter) -> AsyncIterator[list[pb.ModelChunk]]:
    async for chunk in chunks:
        for message in splitter.feed(chunk):
            yield message
    for message in splitter.end():
        yield message


class _Sender:
    """One neighbour's outgoing queue and the ``Exchange`` call that carries it.

    A long-lived call instead of a call per message: a unary call costs gRPC several hand-offs
    per message, a message and its reply on an open call much less.

    One message in flight at a time. gRPC counts a message as sent once it is in the
    connection's buffer, so without the wait for the reply every queued message would go there
    at once, and on a lossy link the fresh model would sit behind a backlog of ones that arrive
    stale. Here they wait in the queue, where only the newest few are kept (older ones are
    dropped), as with a call per message. Each reply carries the receiver's round: queued
    messages for earlier rounds would arrive stale and are dropped unsent.

    :meth:`put` is called from the round loop's thread; everything else runs on the gRPC event
    loop, in one task per neighbour that opens a call when there is something to send. A call
    that fails, or whose reply is more than ``send_timeout`` late (the call is cancelled), loses
    the message in flight; the next message opens a new call.
    """

    MAX_QUEUED = 4

    def __init__(self, peer: int, channel: grpc.aio.Channel, transport: "GrpcTransport") -> None:
        self.peer = peer
        self.stub = pb_grpc.PeerStub(channel)
        self.transport = transport
        self.lock = threading.Lock()  # guards the queue, shared with the round loop's thread
        self.queue: deque[list[pb.ModelChunk]] = deque()  # each message starts with its header chunk
        self.in_flight = False  # a message awaits its reply
        self.skipped_stale = 0  # queued messages for rounds the receiver had already passed
        self.closed = False
        self.loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()  # set when a message was queued or the sender closed
        self.idle_waiters: list[asyncio.Future] = []
        self.task = self.loop.create_task(self._run(), name=f"send-{peer}")

    def put(self, chunks: list[pb.ModelChunk]) -> bool:
        """Queue one message (from any thread); True when the oldest queued one was dropped."""
        with self.lock:
            dropped = len(self.queue) >= self.MAX_QUEUED
            if dropped:
                self.queue.popleft()
            self.queue.append(chunks)
        self.loop.call_soon_threadsafe(self.wake.set)
        return dropped

    async def wait_idle(self) -> None:
        """Until every queued message was answered or lost."""
        if self._busy():
            waiter = self.loop.create_future()
            self.idle_waiters.append(waiter)
            await waiter

    def stop(self) -> None:
        self.closed = True
        with self.lock:
            self.queue.clear()
        self.task.cancel()
        self._settle()

    def _busy(self) -> bool:
        with self.lock:
            return bool(self.queue) or self.in_flight

    def _settle(self) -> None:
        if self.closed or not self._busy():
            for waiter in self.idle_waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self.idle_waiters.clear()

    async def _next(self) -> list[pb.ModelChunk]:
        """The oldest queued message, waiting for one."""
        while True:
            with self.lock:
                if self.queue:
                    self.in_flight = True
                    return self.queue.popleft()
            self._settle()
            self.wake.clear()  # a put() after the check above sets it again: its wake-up comes later
            await self.wake.wait()

    async def _run(self) -> None:
        try:
            while not self.closed:
                first = await self._next()
                try:
                    await self._call(first)
                except Exception:  # a bug here must not silence this neighbour for the rest of the run
                    log.exception("sending to %d failed", self.peer)
        finally:
            self._settle()  # _call cleared in_flight on its way out

    async def _call(self, first: list[pb.ModelChunk]) -> None:
        """One ``Exchange`` call: ``first`` and whatever is queued after it, until the call ends."""
        call = self.stub.Exchange()
        chunks = first
        try:
            while True:
                reply = await asyncio.wait_for(self._send(call, chunks), self.transport.send_timeout)
                if reply is grpc.aio.EOF:  # the receiver ended the call
                    return
                self._on_reply(reply)
                chunks = await self._next()
        except TimeoutError:
            log.debug("no reply from %d in %.0f s; cancelling the call", self.peer, self.transport.send_timeout)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            code = await call.code()
            if code == grpc.StatusCode.UNAVAILABLE:
                self.transport._on_reachability(self.peer, False)
            else:
                log.debug("call to %d ended: %s", self.peer, code)
        finally:
            call.cancel()  # no-op once it ended
            self.in_flight = False

    @staticmethod
    async def _send(call, chunks: list[pb.ModelChunk]):
        for chunk in chunks:
            await call.write(chunk)
        return await call.read()

    def _on_reply(self, reply: pb.PushReply) -> None:
        with self.lock:
            self.in_flight = False
            while self.queue and self.queue[0][0].header.round < reply.round:
                self.queue.popleft()  # queued in round order: the oldest go first
                self.skipped_stale += 1
        self.transport.peer_replies[self.peer] = (reply.round, reply.accepted, reply.reason)
        self.transport._on_reachability(self.peer, True)
        if not reply.accepted:
            log.debug("peer %d refused a message of ours: %s", self.peer, reply.reason)


class GrpcTransport:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        chunk_bytes: int = 1 << 20,
        send_timeout: float = 30.0,
        max_message_bytes: int = 256 << 20,
        max_calls: int = 8,
        advertise: str | None = None,
        identity: ClientIdentity | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.advertise = advertise
        self.send_timeout = send_timeout
        self.max_message_bytes = max_message_bytes
        self._limit = chunk_bytes + _FRAMING
        self._max_calls = max_calls
        self.identity = identity  # None: no TLS, and no sender is authenticated
        self._server: grpc.aio.Server | None = None
        self._servicer: PeerServicer | None = None
        self._channels: dict[int, grpc.aio.Channel] = {}
        self._senders: dict[int, _Sender] = {}
        self._sized: tuple[list[pb.ModelChunk] | None, int] = (None, 0)
        self._on_reachability: Reachability = lambda peer, ok: None
        self.bytes_sent = 0
        self.dropped = 0  # queued messages pushed out by newer ones
        self._closed_stale = 0  # skipped_stale of the senders already closed
        # Each neighbour's latest reply: (its round, accepted, reason). A client that resumed
        # from a checkpoint learns from it which round its neighbours are in.
        self.peer_replies: dict[int, tuple[int, bool, str]] = {}
        self._addresses: dict[int, str] = {}

    @property
    def skipped_stale(self) -> int:
        """Queued messages dropped unsent because the receiver had passed their round."""
        return self._closed_stale + sum(s.skipped_stale for s in self._senders.values())

    def _options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_send_message_length", self._limit),
            ("grpc.max_receive_message_length", self._limit),
        ]

    def _channel_options(self) -> list[tuple[str, int]]:
        # gRPC backs off up to 2 minutes between reconnection attempts to a neighbour that is
        # down; one that restarts must be reachable again within a round or two.
        return [*self._options(), ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000)]

    def start(self, deliver: Deliver) -> str:
        """Listen; ``deliver`` gets each incoming message, on the gRPC event loop."""
        address = f"{_bracket(self.host)}:{self.port}"

        async def start() -> tuple[grpc.aio.Server, int]:
            # Concurrent calls are bounded: each neighbour's Exchange call stays open all run.
            server = grpc.aio.server(
                options=[*self._options(), ("grpc.so_reuseport", 0)], maximum_concurrent_rpcs=self._max_calls
            )
            self._servicer = PeerServicer(deliver, self.max_message_bytes, self.identity.run_id if self.identity else None)
            pb_grpc.add_PeerServicer_to_server(self._servicer, server)
            try:
                if self.identity is None:
                    bound = server.add_insecure_port(address)
                else:
                    bound = server.add_secure_port(address, server_credentials(self.identity))
            except RuntimeError:
                bound = 0
            if bound:
                await server.start()
            return server, bound

        self._server, bound = on_loop(start())
        if bound == 0:
            self._server = None
            raise OSError(f"could not listen on {self.host}:{self.port} (port in use?)")
        self.port = bound
        return f"{_bracket(self.advertise or self.host)}:{bound}"

    def _channel(self, peer: int, address: str) -> grpc.aio.Channel:
        if self.identity is None:
            return grpc.aio.insecure_channel(address, options=self._channel_options())
        options = [*self._channel_options(), *identity_options(self.identity, peer)]
        return grpc.aio.secure_channel(address, channel_credentials(self.identity), options=options)

    def connect(self, addresses: Mapping[int, str], on_reachability: Reachability) -> None:
        self._on_reachability = on_reachability
        self._addresses = dict(addresses)

        async def connect() -> None:
            for peer, address in addresses.items():
                channel = self._channel(peer, address)
                self._channels[peer] = channel
                self._senders[peer] = _Sender(peer, channel, self)

        on_loop(connect())

    def reconnect(self, peer: int) -> None:
        """A neighbour that was down is back (it sent us a message): when our channel to it is
        still failing (gRPC waits out its reconnection backoff first), open a new one now, so
        that our next messages reach it. Callable from any thread; the queued messages move
        over to the new channel."""

        async def swap() -> None:
            channel, sender = self._channels.get(peer), self._senders.get(peer)
            if channel is None or sender is None or peer not in self._addresses:
                return
            if channel.get_state() not in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.IDLE):
                return
            with sender.lock:
                queued = list(sender.queue)
            new = self._channel(peer, self._addresses[peer])
            self._channels[peer] = new
            self._senders[peer] = _Sender(peer, new, self)
            for chunks in queued:
                self._senders[peer].put(chunks)
            self._closed_stale += sender.skipped_stale
            sender.stop()
            await asyncio.gather(sender.task, return_exceptions=True)
            await channel.close()

        loop = io_loop()
        loop.call_soon_threadsafe(lambda: loop.create_task(swap()))

    def wait_ready(self, timeout: float) -> list[int]:
        async def ready(channel: grpc.aio.Channel) -> bool:
            try:
                await asyncio.wait_for(channel.channel_ready(), timeout)
                return True
            except TimeoutError:
                return False

        async def every() -> list[bool]:
            return await asyncio.gather(*(ready(ch) for ch in self._channels.values()))

        return [peer for peer, ok in zip(self._channels, on_loop(every())) if not ok]

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

        async def idle() -> None:
            try:
                await asyncio.wait_for(asyncio.gather(*(s.wait_idle() for s in self._senders.values())), timeout)
            except TimeoutError:
                pass

        on_loop(idle())

    def close(self) -> None:
        # Taken out of self here and released on the event loop: gRPC's asyncio layer shuts
        # itself down in whichever thread drops its last object, and doing that outside the
        # loop's thread races the loop still polling its socket.
        senders, channels = list(self._senders.values()), list(self._channels.values())
        server, servicer = self._server, self._servicer
        self._closed_stale += sum(s.skipped_stale for s in senders)
        self._senders, self._channels, self._server, self._servicer = {}, {}, None, None
        self._sized = (None, 0)

        async def close(senders, channels, server, servicer) -> None:
            for sender in senders:
                sender.stop()
            await asyncio.gather(*(s.task for s in senders), return_exceptions=True)
            for channel in channels:
                await channel.close()
            if server is not None:
                servicer.end_calls()
                await asyncio.sleep(0)  # let the cancelled calls finish before the server stops
                await server.stop(grace=0.5)

        closing = close(senders, channels, server, servicer)
        del senders, channels, server, servicer
        try:
            on_loop(closing, timeout=10.0)
        except TimeoutError:  # the process is on its way out: do not hang it
            log.warning("gRPC transport did not close within 10 s")


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
