"""gRPC transport: one server per client and a channel to each neighbour, on gRPC's asyncio API.

Models go to a neighbour on one long-lived ``Exchange`` call, one message at a time: the next
goes out once the receiver's reply to the previous one came back. The servicer is thin: it cuts
the call into messages at their header chunks, hands each to the client's ``deliver`` callback
and turns the verdict into a reply. ``Push``/``PushOne`` take one message per call, for tools
and tests. Message-size limits are explicit on both ends (a model larger than one chunk streams
in several), and ``grpc.so_reuseport`` is off so two clients can never share a port silently.
Each sender has its own call slots and message rate bound at the receiver, and idle calls are
ended (:class:`CallLimits`): no sender can take another's place or flood the receiver.

Every server, channel and call of a process runs on one event loop in one thread (``grpc-io``),
started on first use. The round loop hands a message over with one thread-safe call; gRPC's
threaded API would have passed each message and each reply between several threads per call
(request iterator, channel poller, sender, server poller, handler pool). ``deliver`` runs on
the event loop and must return promptly: the client's own validates, decodes and buffers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from dfedrw.peer.identity import ClientIdentity, client_of_uri, server_name
from dfedrw.peer.transport.base import Deliver, Reachability
from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.pb import peer_pb2_grpc as pb_grpc

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
    skipped; a message cut short by the next header or the end of the call, or one that
    reaches ``max_chunks`` chunks before its data is complete, comes out as it is (rejected:
    size mismatch), and in the last case its remaining chunks are skipped. So a message never
    holds more than ``max_bytes`` of data plus one chunk, in at most ``max_chunks`` chunks
    (a parsed chunk costs about half a kilobyte of memory even when it carries nothing). One
    message out, one reply back: the sender counts on it."""

    def __init__(self, max_bytes: int, max_chunks: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_chunks = max_chunks if max_chunks is not None else 16 + max_bytes // 4096
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
        elif len(self.current) >= self.max_chunks:
            out.append(self.current)  # too many chunks for its size: the rest is skipped
            self.current = []
            self.skipping = True
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


@dataclass(frozen=True)
class CallLimits:
    """What one sender may ask of a receiver's server.

    Calls: one open ``Exchange`` call (a newer one replaces it) and ``calls_per_sender`` open
    ``Push``/``PushOne`` calls; a call beyond is refused at once with RESOURCE_EXHAUSTED. A
    call that carries no chunk for ``idle_call_timeout`` seconds is ended.

    Messages: a token bucket per sender, ``burst`` deep, refilled by ``per_round`` tokens each
    round the receiver advances and by ``per_second`` tokens a second (so a receiver whose round
    is stuck still hears from everyone). An honest neighbour sends one message a round (a
    neighbour that fell behind catches up a few rounds at once, within the burst). A message
    without a token is answered ``rate_limited`` unread; a sender that keeps sending without
    tokens (``2 * burst`` past empty) has its calls ended and every new one refused for
    ``block_seconds``. A refused call costs a token too.

    ``shared_host``: without TLS a caller is known only by its IP address, which every client on
    one host shares: such a caller gets this many times every bound."""

    calls_per_sender: int = 2
    idle_call_timeout: float = 60.0
    burst: int = 16
    per_round: float = 4.0
    per_second: float = 0.4
    block_seconds: float = 50.0
    shared_host: int = 1


class _Caller:
    """A sender's open calls and message bucket, on the receiver's side."""

    __slots__ = ("key", "scale", "tokens", "round", "stamp", "blocked_until", "exchanges", "pushes", "tasks", "held")

    def __init__(self, key: Any, scale: int, tokens: float, round_: int) -> None:
        self.key = key  # the client id, or ("ip", address) without TLS
        self.scale = scale
        self.tokens = tokens
        self.round = round_
        self.stamp = time.monotonic()
        self.blocked_until = 0.0
        self.exchanges: set[asyncio.Task] = set()
        self.pushes = 0
        self.tasks: set[asyncio.Task] = set()
        self.held = False  # a call of this (shut out) sender is being held before its refusal

    def idle(self) -> bool:
        return not self.tasks and self.pushes == 0 and not self.held and self.blocked_until <= time.monotonic()


class _Refused(Exception):
    """A call is refused or ended (the reason is counted)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


# Verdicts after which the receiver ends the call: nothing else on it can be accepted.
_END_CALL = frozenset({"not_neighbour", "unknown_sender", "impersonation"})
# Callers remembered without TLS (one per IP address) before idle ones are forgotten.
_MAX_CALLERS = 4096


def _peer_host(context) -> str:
    """The caller's IP address (``context.peer()`` is ``ipv4:IP:PORT``, one port a connection)."""
    try:
        peer = context.peer() if context is not None else None
    except Exception:  # noqa: BLE001 - an address is only a key here
        peer = None
    if not peer:
        return "?"
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


class PeerServicer(pb_grpc.PeerServicer):
    """Thin: who is calling (from the TLS handshake), then each message to ``deliver``.

    Every sender has its own call slots and message bucket (:class:`CallLimits`), so no sender
    can take another's: with TLS a sender is the client its certificate names, and a stranger is
    turned away before it sends a byte of model; without TLS it is an IP address. What is refused
    is counted in :attr:`refused` by reason."""

    def __init__(
        self,
        deliver: Deliver,
        max_bytes: int,
        run_id: str | None = None,
        limits: CallLimits | None = None,
        max_chunks: int | None = None,
        on_shut_out: Callable[[int], None] | None = None,
    ) -> None:
        self._deliver = deliver
        # Told the id of an authenticated sender when it is shut out (its messages cannot
        # arrive until the time is up, so the client need not wait for them).
        self._on_shut_out = on_shut_out or (lambda sender: None)
        self._max_bytes = max_bytes
        self._max_chunks = max_chunks
        self._run_id = run_id
        self.limits = limits or CallLimits()
        self._open_calls: set[asyncio.Task] = set()  # the tasks serving open calls
        self._callers: dict[Any, _Caller] = {}
        self._round = 0  # the receiver's round, as its latest verdict said
        # Calls this servicer is ending from outside (their task cancelled): why. A handler task
        # cancelled without ending its call leaves the call open at the caller, and holding its
        # place in the server's bound, until the caller gives up: the handler ends it instead.
        self._ending: dict[asyncio.Task, str] = {}
        # no_identity: a certificate naming no client of this run; too_many_calls: past a
        # sender's call slots; blocked: a call from a sender shut out for flooding;
        # disconnected: senders shut out; rate_limited: messages answered unread; idle: calls
        # ended for carrying nothing; replaced: Exchange calls ended by a newer one.
        self.refused: Counter[str] = Counter()

    @property
    def refused_calls(self) -> int:
        """Calls ended at once: no client identity of this run."""
        return self.refused["no_identity"]

    def end_calls(self) -> None:
        """Cancel every open call (on closing: neighbours that are still running keep theirs
        open). Stopping the server under them would abort each with a warning."""
        for task in self._open_calls:
            task.cancel()

    async def _sender(self, context) -> int | None:
        try:
            return authenticated_sender(context, self._run_id)
        except PermissionError:
            self.refused["no_identity"] += 1
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no client identity of this run")

    def _caller(self, sender: int | None, context) -> _Caller:
        if sender is not None:
            key: Any = sender
            scale = 1
        else:
            key, scale = ("ip", _peer_host(context)), self.limits.shared_host
        caller = self._callers.get(key)
        if caller is None:
            if len(self._callers) >= _MAX_CALLERS:
                for k in [k for k, c in self._callers.items() if c.idle()]:
                    del self._callers[k]
            caller = self._callers[key] = _Caller(key, scale, float(self.limits.burst * scale), self._round)
        return caller

    # -- the message bucket ------------------------------------------------------------------
    def _spend(self, caller: _Caller) -> bool:
        """Take a token from the caller's bucket; False when it had none (it may be blocked now)."""
        lim, now = self.limits, time.monotonic()
        depth = lim.burst * caller.scale
        if now > caller.stamp:  # after a block, refilling starts when it ends
            rounds = max(0, self._round - caller.round)
            gain = (rounds * lim.per_round + (now - caller.stamp) * lim.per_second) * caller.scale
            caller.tokens = min(depth, caller.tokens + gain)
            caller.stamp, caller.round = now, self._round
        caller.tokens -= 1
        if caller.tokens >= 0:
            return True
        if caller.tokens < -2 * depth:
            self._block(caller, now)
        return False

    def _block(self, caller: _Caller, now: float) -> None:
        self.refused["disconnected"] += 1
        caller.blocked_until = caller.stamp = now + self.limits.block_seconds
        caller.tokens, caller.round = 0.0, self._round
        current = asyncio.current_task()
        for task in caller.tasks:
            if task is not current:
                self._end(task, "blocked")
        who = f"client {caller.key}" if isinstance(caller.key, int) else f"host {caller.key[1]}"
        log.warning("%s kept sending past its rate bound: its calls are ended and it is refused for %.0f s", who, self.limits.block_seconds)
        if isinstance(caller.key, int):
            self._on_shut_out(caller.key)

    def _end(self, task: asyncio.Task, reason: str) -> None:
        """End another open call: its handler answers with ``reason``'s status."""
        if task not in self._ending:
            self._ending[task] = reason
            task.cancel()

    async def _ended(self, context) -> None:
        """In a handler that was cancelled: end its call if this servicer cancelled it (with the
        reason's status), else (gRPC cancelled it: the caller went away) let the cancel go on."""
        task = asyncio.current_task()
        reason = self._ending.pop(task, None)
        if reason is None or context is None:
            raise asyncio.CancelledError
        task.uncancel()
        await self._refuse(context, reason)

    def _blocked(self, caller: _Caller) -> bool:
        return caller.blocked_until > time.monotonic()

    # -- call slots ----------------------------------------------------------------------
    def _open(self, caller: _Caller, kind: str, authenticated: bool) -> asyncio.Task:
        """Take a call slot for the current task, or raise :class:`_Refused`."""
        if self._blocked(caller):
            raise _Refused("blocked")
        task = asyncio.current_task()
        if kind == "exchange":
            if authenticated and caller.exchanges:
                # A newer call from the same client replaces its older one (a client that
                # restarted, or gave up on a late reply, opens a new call): it costs a token.
                if not self._spend(caller):
                    raise _Refused("blocked" if self._blocked(caller) else "too_many_calls")
                for older in caller.exchanges:
                    self._end(older, "replaced")
                caller.exchanges.clear()
            elif len(caller.exchanges) >= caller.scale:
                self._spend(caller)
                raise _Refused("blocked" if self._blocked(caller) else "too_many_calls")
            caller.exchanges.add(task)
        else:
            if caller.pushes >= self.limits.calls_per_sender * caller.scale:
                self._spend(caller)
                raise _Refused("blocked" if self._blocked(caller) else "too_many_calls")
            caller.pushes += 1
        caller.tasks.add(task)
        self._open_calls.add(task)
        return task

    def _close(self, caller: _Caller, kind: str, task: asyncio.Task) -> None:
        self._open_calls.discard(task)
        self._ending.pop(task, None)
        caller.tasks.discard(task)
        if kind == "exchange":
            caller.exchanges.discard(task)
        else:
            caller.pushes -= 1

    async def _turn_away(self, caller: _Caller, context, reason: str) -> None:
        """Refuse a call at its start. A shut-out sender's first such call is held until its
        block ends (at most ``idle_call_timeout``) before it is refused, so a sender that opens
        one call after another waits instead of costing a refusal each time; its calls beside
        that one are refused at once. It holds no other call then: its slots bound it still."""
        if reason == "blocked" and context is not None and not caller.held:
            task = asyncio.current_task()
            caller.held = True
            self._open_calls.add(task)
            try:
                await asyncio.sleep(max(0.0, min(caller.blocked_until - time.monotonic(), self.limits.idle_call_timeout)))
            finally:
                caller.held = False
                self._open_calls.discard(task)
        await self._refuse(context, reason)

    async def _refuse(self, context, reason: str) -> None:
        self.refused[reason] += 1
        if context is None:  # called directly (tests): no call to end
            raise _Refused(reason)
        await context.abort(_STATUS.get(reason, grpc.StatusCode.RESOURCE_EXHAUSTED), _REFUSALS[reason])

    # -- reading -------------------------------------------------------------------------
    async def _chunks(self, request_iterator, context) -> AsyncIterator[pb.ModelChunk]:
        """The call's chunks; a call that carries none for ``idle_call_timeout`` s is ended."""
        chunks = request_iterator.__aiter__()
        while True:
            try:
                async with asyncio.timeout(self.limits.idle_call_timeout):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except TimeoutError:
                await self._refuse(context, "idle")
                return
            yield chunk

    def _handle(self, caller: _Caller, message: list[pb.ModelChunk], sender: int | None) -> pb.PushReply | None:
        """The reply to one message; None when its sender is blocked now (end the call)."""
        if self._blocked(caller):
            return None
        if not self._spend(caller):
            if self._blocked(caller):
                return None
            self.refused["rate_limited"] += 1
            return pb.PushReply(accepted=False, reason="rate_limited", round=self._round)
        reply = handle_push(message, self._deliver, sender)
        if reply.round > self._round:
            self._round = reply.round
        return reply

    # -- the calls -----------------------------------------------------------------------
    async def _one(self, caller: _Caller, messages: AsyncIterator[list[pb.ModelChunk]], sender: int | None, context) -> pb.PushReply:
        message: list[pb.ModelChunk] = []
        async for message in messages:
            break  # one message a call: what follows it is not read
        reply = self._handle(caller, message, sender)
        if reply is None:
            await self._refuse(context, "blocked")
        return reply

    async def Push(self, request_iterator, context):  # noqa: N802 - gRPC method name
        sender = await self._sender(context)
        caller = self._caller(sender, context)
        try:
            task = self._open(caller, "push", sender is not None)
        except _Refused as refused:
            return await self._turn_away(caller, context, refused.reason)
        try:
            splitter = MessageSplitter(self._max_bytes, self._max_chunks)
            return await self._one(caller, _messages(self._chunks(request_iterator, context), splitter), sender, context)
        except asyncio.CancelledError:
            await self._ended(context)
        finally:
            self._close(caller, "push", task)

    async def PushOne(self, request, context):  # noqa: N802 - gRPC method name
        sender = await self._sender(context)
        caller = self._caller(sender, context)
        try:
            task = self._open(caller, "push", sender is not None)
        except _Refused as refused:
            return await self._turn_away(caller, context, refused.reason)
        try:
            reply = self._handle(caller, [request], sender)
            if reply is None:
                await self._refuse(context, "blocked")
            return reply
        except asyncio.CancelledError:
            await self._ended(context)
        finally:
            self._close(caller, "push", task)

    async def Exchange(self, request_iterator, context):  # noqa: N802 - gRPC method name
        sender = await self._sender(context)
        caller = self._caller(sender, context)
        try:
            task = self._open(caller, "exchange", sender is not None)
        except _Refused as refused:
            await self._turn_away(caller, context, refused.reason)
            return
        try:
            splitter = MessageSplitter(self._max_bytes, self._max_chunks)
            async for message in _messages(self._chunks(request_iterator, context), splitter):
                reply = self._handle(caller, message, sender)
                if reply is None:
                    await self._refuse(context, "blocked")
                    return
                # Written here, not yielded: every wait of the call is then in this handler,
                # where it can be timed (a caller that reads no replies holds the call as one
                # that sends nothing does) and ended with a status.
                try:
                    async with asyncio.timeout(self.limits.idle_call_timeout):
                        await context.write(reply)
                except TimeoutError:
                    await self._refuse(context, "idle")
                if reply.reason in _END_CALL:
                    return  # a stranger or an impostor does not get to keep a call open here
        except asyncio.CancelledError:
            await self._ended(context)
        finally:
            self._close(caller, "exchange", task)


_REFUSALS = {
    "too_many_calls": "too many open calls from this sender",
    "blocked": "this sender sent past its rate bound; refused for a while",
    "idle": "the call carried nothing for too long",
    "replaced": "a newer call from the same sender replaced this one",
}
_STATUS = {"idle": grpc.StatusCode.DEADLINE_EXCEEDED, "replaced": grpc.StatusCode.ABORTED}


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
        """One ``Exchange`` call: ``first`` and whatever is queued after it, until the call ends.

        A call the receiver ended while nothing was in flight (it ends calls idle for
        ``idle_call_timeout``), or one idle here for half that, is let go between messages:
        the next message opens a new call and is not lost."""
        call = self.stub.Exchange()
        ended = self.loop.create_task(call.code())
        chunks: list[pb.ModelChunk] | None = first
        try:
            while chunks is not None:
                reply = await asyncio.wait_for(self._send(call, chunks), self.transport.send_timeout)
                if reply is grpc.aio.EOF:  # the receiver ended the call
                    return
                self._on_reply(reply)
                chunks = await self._next_on(ended)
        except TimeoutError:
            log.debug("no reply from %d in %.0f s; cancelling the call", self.peer, self.transport.send_timeout)
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

    async def _next_on(self, ended: asyncio.Future) -> list[pb.ModelChunk] | None:
        """The oldest queued message, to go on the open call; None (nothing taken from the
        queue) once the call ended or was idle for half the receiver's idle timeout."""
        deadline = self.loop.time() + self.transport.idle_call_timeout / 2
        while True:
            with self.lock:
                if ended.done():
                    return None
                if self.queue:
                    self.in_flight = True
                    return self.queue.popleft()
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
        self.transport._on_reachability(self.peer, "reachable")
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
        max_calls: int = 32,
        advertise: str | None = None,
        identity: ClientIdentity | None = None,
        limits: CallLimits | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.advertise = advertise
        self.send_timeout = send_timeout
        self.max_message_bytes = max_message_bytes
        self._limit = chunk_bytes + _FRAMING
        # An honest message is ceil(size / chunk_bytes) chunks, its header on the first.
        self._max_chunks = 16 + math.ceil(max_message_bytes / chunk_bytes)
        self._max_calls = max_calls
        # Without TLS a caller is an IP address, which clients on one host share.
        self.limits = limits or CallLimits(shared_host=1 if identity is not None else 64)
        self.idle_call_timeout = self.limits.idle_call_timeout
        self._refused_before: Counter[str] = Counter()  # refused by servers already closed
        self.identity = identity  # None: no TLS, and no sender is authenticated
        self._server: grpc.aio.Server | None = None
        self._servicer: PeerServicer | None = None
        self._channels: dict[int, grpc.aio.Channel] = {}
        self._senders: dict[int, _Sender] = {}
        self._sized: tuple[list[pb.ModelChunk] | None, int] = (None, 0)
        self._on_reachability: Reachability = lambda peer, state: None
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

    @property
    def refused(self) -> dict[str, int]:
        """What this client's server refused, by reason: calls (``no_identity``,
        ``too_many_calls``, ``blocked``, ``idle``), messages answered ``rate_limited``, and
        senders ``disconnected`` for flooding (see :class:`CallLimits`)."""
        total = Counter(self._refused_before)
        if self._servicer is not None:
            total.update(self._servicer.refused)
        return {k: v for k, v in sorted(total.items()) if v}

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
            # Concurrent calls are bounded twice: per sender (the servicer's call slots) and in
            # all, with room for every sender's slots (each neighbour's Exchange call stays open
            # all run), so no sender can fill the server.
            server = grpc.aio.server(
                options=[*self._options(), ("grpc.so_reuseport", 0)], maximum_concurrent_rpcs=self._max_calls
            )
            self._servicer = PeerServicer(
                deliver, self.max_message_bytes, self.identity.run_id if self.identity else None,
                limits=self.limits, max_chunks=self._max_chunks,
                on_shut_out=lambda sender: self._on_reachability(sender, "shut_out"),
            )
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
        if servicer is not None:
            self._refused_before.update(servicer.refused)
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
