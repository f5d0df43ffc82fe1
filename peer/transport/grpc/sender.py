"""The sending side of the gRPC transport: one long-lived call per neighbour, one message at a time
(the next goes once the receiver's reply to the previous one came back), a bounded queue per
neighbour, and what is left unsent. Chunks go out as the bytes :class:`~dfedrw.peer.transport.chunks.WireMessage`
cuts from the sender's tensor (the call's serializer passes them through)."""

from __future__ import annotations
import asyncio
import logging
import threading
import weakref
from collections import deque
from typing import Protocol
import grpc
from dfedrw.peer.transport.base import Reachability
from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.chunks import serialized_chunks, wire_round, wire_size
from dfedrw.peer.transport.serde import LARGE_MESSAGE

log = logging.getLogger(__name__)


class SendingTransport(Protocol):
    """What a :class:`Sender` reads and tells of the transport it sends for (the gRPC transport)."""

    send_timeout: float
    idle_call_timeout: float
    newest_only: bool  # queue the newest message only (asynchronous gossip)

    def room_made(self) -> None:
        """A neighbour's queue has room again (a queued message went into flight, or was let go)."""

    def replied_in(self, seconds: float) -> None:
        """A message was answered ``seconds`` after it began to go out."""
    # Neighbour -> (round, accepted, reason) of its last reply.
    peer_replies: dict[int, tuple[int, bool, str]]
    # Told (peer, "reachable" | "unreachable") as replies come back or fail to.
    _on_reachability: Reachability


EXCHANGE = "/peer.transport.pb.Peer/Exchange"


class _GivenUp(Exception):
    """The message in flight was given up for a newer one (see :meth:`Sender.put`)."""


def _settle_future(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class Waker:
    """Sets events of one event loop from other threads, with one hand-over to the loop for all
    those set before it runs: a round queues a message for every neighbour at once, and each
    ``call_soon_threadsafe`` writes to the loop's wake-up socket and wakes its thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.pending: list[asyncio.Event] = []

    def set(self, event: asyncio.Event) -> None:
        with self.lock:
            first = not self.pending
            self.pending.append(event)
        if first:
            self.loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
        for event in pending:
            event.set()


_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Waker] = weakref.WeakKeyDictionary()


def waker(loop: asyncio.AbstractEventLoop) -> Waker:
    """The loop's :class:`Waker` (made on the loop's thread, with its first sender)."""
    found = _wakers.get(loop)
    if found is None:
        found = _wakers[loop] = Waker(loop)
    return found


class Sender:
    """One neighbour's outgoing queue and the ``Exchange`` call that carries it: long-lived, as a
    unary call costs gRPC several hand-offs per message, a message and its reply on an open call
    much less.

    One message in flight at a time: gRPC counts a message as sent once it is in the connection's
    buffer, so without waiting for the reply every queued message would go there at once, and on a
    lossy link the fresh model would sit behind a backlog of ones that arrive stale. Here they wait
    in the queue, which keeps only the newest few (at most ``MAX_QUEUED`` messages and
    ``MAX_QUEUED_BYTES``; under asynchronous gossip, the transport's ``newest_only``, the newest
    alone: a receiver keeps one model per neighbour), as with a call per message. Each reply
    carries the receiver's round: queued messages for earlier rounds would arrive stale and are
    dropped unsent. A large message still in flight when one two rounds newer is queued is given up
    (:meth:`put`). A message is held here only while queued or in flight: so a client holds, per
    neighbour, at most one model in flight and one queued.

    :meth:`put` is called from the round loop's thread; everything else runs on the gRPC event
    loop, in one task per neighbour that opens a call when there is something to send. A call
    that fails, or whose reply is more than ``send_timeout`` late (the call is cancelled), loses
    the message in flight; the next message opens a new call."""

    MAX_QUEUED = 4
    # Bytes of model the queue holds (always at least the newest message): four messages of up to
    # 16 MiB (LARGE_MESSAGE), one of a 44 MB model; each is a model the client still holds.
    MAX_QUEUED_BYTES = 4 * LARGE_MESSAGE

    def __init__(self, peer: int, channel: grpc.aio.Channel, transport: SendingTransport) -> None:
        self.peer = peer
        # Exchange with chunks written as bytes (serialized_chunks) and replies parsed.
        self.exchange = channel.stream_stream(EXCHANGE, request_serializer=None, response_deserializer=pb.PushReply.FromString)
        self.transport = transport
        self.max_queued = 1 if transport.newest_only else self.MAX_QUEUED
        self.lock = threading.Lock()  # guards the queue, shared with the round loop's thread
        self.queue: deque[list[pb.ModelChunk]] = deque()  # each message starts with its header chunk
        self.queued_bytes = 0
        # The message in flight: the future that gives it up (None: none in flight), its round and size.
        self.flight_round = 0
        self.flight_bytes = 0
        self.give_up: asyncio.Future | None = None
        self.in_flight = False  # a message awaits its reply
        self.skipped_stale = 0  # queued messages for rounds the receiver had already passed
        self.closed = False
        self.loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()  # set when a message was queued or the sender closed
        self.waker = waker(self.loop)
        self.idle_waiters: list[asyncio.Future] = []
        self.task = self.loop.create_task(self._run(), name=f"send-{peer}")

    def put(self, chunks: list[pb.ModelChunk]) -> int:
        """Queue one message (from any thread); returns how many messages it pushed out: the oldest
        queued ones (past ``MAX_QUEUED`` messages or ``MAX_QUEUED_BYTES``), and a large one
        (``serde.LARGE_MESSAGE``) in flight when two rounds older or more: its reply is that late,
        it would arrive stale and holds a model here till then; its call is cancelled."""
        size = wire_size(chunks)
        round_ = wire_round(chunks)
        dropped = 0
        with self.lock:
            while self.queue and (len(self.queue) >= self.max_queued or self.queued_bytes + size > self.MAX_QUEUED_BYTES):
                self.queued_bytes -= wire_size(self.queue.popleft())
                dropped += 1
            self.queue.append(chunks)
            self.queued_bytes += size
            give_up = self.give_up
            if give_up is not None and self.flight_round < round_ - 1 and self.flight_bytes > LARGE_MESSAGE:
                self.give_up = None
                dropped += 1
            else:
                give_up = None
        if give_up is not None:
            self.loop.call_soon_threadsafe(_settle_future, give_up)
        self.waker.set(self.wake)
        return dropped

    def _take(self) -> list[pb.ModelChunk]:
        """The oldest queued message, now in flight (with the lock held)."""
        self.in_flight = True
        chunks = self.queue.popleft()
        self.queued_bytes -= wire_size(chunks)
        self.transport.room_made()
        return chunks

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
            self.queued_bytes = 0
        self.transport.room_made()
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
                    return self._take()
            self._settle()
            self.wake.clear()  # a put() after the check above sets it again: its wake-up comes later
            await self.wake.wait()

    async def _run(self) -> None:
        try:
            while not self.closed:
                try:
                    # Handed over in a list the call empties: no frame here keeps the message
                    # (a model) alive while the call carries the ones after it.
                    await self._call([await self._next()])
                except Exception:  # a bug here must not silence this neighbour for the rest of the run
                    log.exception("sending to %d failed", self.peer)
        finally:
            self._settle()  # _call cleared in_flight on its way out

    async def _call(self, first: list[list[pb.ModelChunk]]) -> None:
        """One ``Exchange`` call: the message in ``first`` (taken out of it) and whatever is
        queued after it until the call ends, each let go once its reply came. A call the receiver
        ended while nothing was in flight (it ends calls idle for ``idle_call_timeout``), or one
        idle here for half that, is let go between messages: the next, not lost, opens a new one."""
        call = self.exchange()
        ended = self.loop.create_task(call.code())
        chunks: list[pb.ModelChunk] | None = first.pop()
        try:
            while chunks is not None:
                reply = await self._in_flight(call, chunks)
                chunks = None
                if reply is grpc.aio.EOF:  # the receiver ended the call
                    return
                self._on_reply(reply)
                chunks = await self._next_on(ended)
        except TimeoutError:
            log.debug("no reply from %d in %.0f s; cancelling the call", self.peer, self.transport.send_timeout)
        except _GivenUp:
            log.debug("gave up a message to %d: a model two rounds newer is queued", self.peer)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            code = await call.code()
            if code == grpc.StatusCode.UNAVAILABLE:
                self.transport._on_reachability(self.peer, "unreachable")
            else:
                log.debug("call to %d ended: %s", self.peer, code)
        finally:
            ended.cancel()
            call.cancel()  # no-op once it ended
            self.in_flight = False

    async def _in_flight(self, call, chunks: list[pb.ModelChunk]):
        """Send one message and wait for its reply, at most ``send_timeout`` seconds
        (``TimeoutError``), or until :meth:`put` gives it up (``_GivenUp``)."""
        give_up = self.loop.create_future()
        with self.lock:
            self.give_up, self.flight_round, self.flight_bytes = give_up, wire_round(chunks), wire_size(chunks)
        sending = self.loop.create_task(self._send(call, chunks))
        started = self.loop.time()
        try:
            done, _ = await asyncio.wait((sending, give_up), timeout=self.transport.send_timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not sending.done():
                sending.cancel()
            with self.lock:
                if self.give_up is give_up:
                    self.give_up = None
        if sending in done:
            reply = sending.result()
            self.transport.replied_in(self.loop.time() - started)
            return reply
        if give_up in done:
            raise _GivenUp
        raise TimeoutError

    async def _next_on(self, ended: asyncio.Future) -> list[pb.ModelChunk] | None:
        """The oldest queued message, to go on the open call; None (nothing taken from the
        queue) once the call ended or was idle for half the receiver's idle timeout."""
        deadline = self.loop.time() + self.transport.idle_call_timeout / 2
        while True:
            with self.lock:
                if ended.done():
                    return None
                if self.queue:
                    return self._take()
            self._settle()
            self.wake.clear()  # a put() after the check above sets it again
            left = deadline - self.loop.time()
            if left <= 0:
                return None
            woken = self.loop.create_task(self.wake.wait())
            try:
                await asyncio.wait((woken, ended), timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()

    @staticmethod
    async def _send(call, chunks: list[pb.ModelChunk]):
        for data in serialized_chunks(chunks):
            await call.write(data)
        return await call.read()

    def _on_reply(self, reply: pb.PushReply) -> None:
        with self.lock:
            self.in_flight = False
            while self.queue and wire_round(self.queue[0]) < reply.round:
                self.queued_bytes -= wire_size(self.queue.popleft())  # queued in round order: the oldest go first
                self.skipped_stale += 1
                self.transport.room_made()
        self.transport.peer_replies[self.peer] = (reply.round, reply.accepted, reply.reason)
        self.transport._on_reachability(self.peer, "reachable")
        if not reply.accepted:
            log.debug("peer %d refused a message of ours: %s", self.peer, reply.reason)
