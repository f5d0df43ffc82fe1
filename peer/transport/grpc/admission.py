"""The gRPC server's side: which calls it admits and how much each sender may send.

Each sender has its own call slots and message rate bound (:class:`~.limits.CallLimits`); idle
calls are ended, and at once the call of a sender that is unknown, not a neighbour, or claiming
another's id. The servicer cuts a call into messages, hands each to the client's ``deliver``
chunk by chunk as it arrives (:func:`~dfedrw.peer.transport.framing.message_begin`), and turns
the verdict into a reply. A data chunk's bytes are not copied before the receiver decodes them
into place (:func:`add_peer_servicer`)."""

from __future__ import annotations
import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any
import grpc
from dfedrw.peer.transport.base import Deliver
from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.pb import peer_pb2_grpc as pb_grpc
from dfedrw.peer.transport.framing import MessageSplitter, message_begin
from dfedrw.peer.transport.grpc.limits import CallLimits, Caller
from dfedrw.peer.transport.grpc.tls import authenticated_sender
from dfedrw.peer.transport.chunks import parse_chunk

log = logging.getLogger(__name__)


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
    """Thin: who is calling (from the TLS handshake), then each message to ``deliver``. No sender
    can take another's call slots or message bucket: with TLS a sender is the client its
    certificate names, and a stranger is turned away before it sends a byte of model; without TLS
    it is an IP address. What is refused is counted in :attr:`refused` by reason."""

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
        self._begin_message = message_begin(deliver)
        # Whether the client takes a message with this header now (else it is read later).
        self._has_room = getattr(deliver, "has_room", None)
        # The receiver's round, for the buckets' refill (its intake's, else its latest verdict's).
        self._progress = getattr(deliver, "progress", None)
        # Told the id of a shut-out authenticated sender: the client need not wait for it meanwhile.
        self._on_shut_out = on_shut_out or (lambda sender: None)
        self._max_bytes = max_bytes
        self._max_chunks = max_chunks
        self._run_id = run_id
        self.limits = limits or CallLimits()
        self._open_calls: set[asyncio.Task] = set()  # the tasks serving open calls
        self._callers: dict[Any, Caller] = {}
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

    def _caller(self, sender: int | None, context) -> Caller:
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
            caller = self._callers[key] = Caller(key, scale, float(self.limits.burst * scale), self._round)
        return caller

    # -- the message bucket ------------------------------------------------------------------
    def _spend(self, caller: Caller) -> bool:
        """Take a token from the caller's bucket; False when it had none (it may be blocked now)."""
        if caller.spend(self.limits, self._round):
            return True
        if caller.tokens < -2 * self.limits.burst * caller.scale:
            self._block(caller, time.monotonic())
        return False

    def _block(self, caller: Caller, now: float) -> None:
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

    def _blocked(self, caller: Caller) -> bool:
        return caller.blocked_until > time.monotonic()

    # -- call slots ----------------------------------------------------------------------
    def _open(self, caller: Caller, kind: str, authenticated: bool) -> asyncio.Task:
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

    def _close(self, caller: Caller, kind: str, task: asyncio.Task) -> None:
        self._open_calls.discard(task)
        self._ending.pop(task, None)
        caller.tasks.discard(task)
        if kind == "exchange":
            caller.exchanges.discard(task)
        else:
            caller.pushes -= 1

    async def _turn_away(self, caller: Caller, context, reason: str) -> None:
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

    def _admit(self, caller: Caller) -> tuple[bool, pb.PushReply | None]:
        """Whether a message of the caller's is read: (True, None); else (False, the reply it
        gets unread: ``rate_limited``, or None when its sender is blocked now: end the call)."""
        if self._blocked(caller):
            return False, None
        if not self._spend(caller):
            if self._blocked(caller):
                return False, None
            self.refused["rate_limited"] += 1
            return False, pb.PushReply(accepted=False, reason="rate_limited", round=self._round)
        return True, None

    def _reply(self, verdict: tuple[bool, str, int]) -> pb.PushReply:
        accepted, reason, round_ = verdict
        progress = round_ if self._progress is None else self._progress()
        if progress > self._round:
            self._round = progress
        return pb.PushReply(accepted=accepted, reason=reason, round=round_)

    def _handle(self, caller: Caller, message: list[pb.ModelChunk], sender: int | None) -> pb.PushReply | None:
        """The reply to one whole message; None when its sender is blocked now (end the call)."""
        admitted, unread = self._admit(caller)
        if not admitted:
            return unread
        verdict = self._deliver(message, sender)
        caller.settle(self.limits, _label(message[0]) if message else None, verdict)
        return self._reply(verdict)

    def _begin(self, caller: Caller, first: pb.ModelChunk, sender: int | None) -> "_Incoming | _Unread":
        """A message of the caller's that begins with ``first``: handed to the client chunk by
        chunk as it arrives, or (past its rate bound) skipped and answered unread."""
        admitted, unread = self._admit(caller)
        return _Incoming(self, caller, _label(first), self._begin_message(first, sender)) if admitted else _Unread(unread)

    def _splitter(self, caller: Caller, sender: int | None) -> MessageSplitter:
        return MessageSplitter(self._max_bytes, self._max_chunks, begin=lambda first: self._begin(caller, first, sender))

    # -- the calls -----------------------------------------------------------------------
    async def _one(self, caller: Caller, chunks: AsyncIterator[pb.ModelChunk], sender: int | None, context) -> pb.PushReply:
        """The reply to the call's first message: what follows it is not read."""
        splitter = self._splitter(caller, sender)
        replies: list[pb.PushReply | None] = []
        began = False
        async for chunk in chunks:
            began = True
            replies = splitter.feed(chunk)
            if replies:
                break
        else:
            replies = splitter.end() if began else [self._handle(caller, [], sender)]
        reply = replies[0]
        if reply is None:
            await self._refuse(context, "blocked")
        return reply

    async def _serve(self, context, kind: str, body: Callable[[Caller, int | None], Any]):
        """One call of ``kind`` ("push" or "exchange"): admitted (or turned away), ``body(caller,
        sender)`` run, ended with the reason's status if this servicer cancelled it, closed."""
        sender = await self._sender(context)
        caller = self._caller(sender, context)
        try:
            task = self._open(caller, kind, sender is not None)
        except _Refused as refused:
            return await self._turn_away(caller, context, refused.reason)
        try:
            return await body(caller, sender)
        except asyncio.CancelledError:
            await self._ended(context)
        finally:
            self._close(caller, kind, task)

    async def Push(self, request_iterator, context):  # noqa: N802 - gRPC method name
        return await self._serve(
            context, "push", lambda caller, sender: self._one(caller, self._chunks(request_iterator, context), sender, context)
        )

    async def PushOne(self, request, context):  # noqa: N802 - gRPC method name
        async def body(caller: Caller, sender: int | None) -> pb.PushReply:
            reply = self._handle(caller, [request], sender)
            if reply is None:
                await self._refuse(context, "blocked")
            return reply

        return await self._serve(context, "push", body)

    async def Exchange(self, request_iterator, context):  # noqa: N802 - gRPC method name
        async def body(caller: Caller, sender: int | None) -> None:
            splitter = self._splitter(caller, sender)
            async for chunk in self._chunks(request_iterator, context):
                if self._has_room is not None and chunk.HasField("header"):
                    await self._room_for(chunk.header)
                if not await self._answer(splitter.feed(chunk), context):
                    return
            await self._answer(splitter.end(), context)

        await self._serve(context, "exchange", body)

    async def _room_for(self, header) -> None:
        """Wait, before reading a message, until the client has room for it (see the client
        intake's ``has_room``): at most half ``idle_call_timeout``, then it is read anyway. The
        sender waits meanwhile (its one message in flight), held by gRPC's flow control."""
        deadline = time.monotonic() + self.limits.idle_call_timeout / 2
        while not self._has_room(header) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def _answer(self, replies: list[pb.PushReply | None], context) -> bool:
        """Write the replies of the messages a chunk completed; False once the call is to end."""
        for reply in replies:
            if reply is None:
                await self._refuse(context, "blocked")
                return False
            # Written here, not yielded: every wait of the call is then in this handler,
            # where it can be timed (a caller that reads no replies holds the call as one
            # that sends nothing does) and ended with a status.
            try:
                async with asyncio.timeout(self.limits.idle_call_timeout):
                    await context.write(reply)
            except TimeoutError:
                await self._refuse(context, "idle")
            if reply.reason in _END_CALL:
                return False  # a stranger or an impostor does not get to keep a call open here
        return True


def _label(first) -> int | None:
    """The round (or step) a message's first chunk labels it with; None without a header."""
    return first.header.round if first.HasField("header") else None


class _Incoming:
    """A message being handed to the client as it arrives; its end is the reply."""

    __slots__ = ("servicer", "caller", "label", "assembly")

    def __init__(self, servicer: PeerServicer, caller: Caller, label: int | None, assembly) -> None:
        self.servicer, self.caller, self.label, self.assembly = servicer, caller, label, assembly

    def add(self, chunk) -> None:
        self.assembly.add(chunk)

    def end(self) -> pb.PushReply:
        verdict = self.assembly.end()
        self.caller.settle(self.servicer.limits, self.label, verdict)
        return self.servicer._reply(verdict)


class _Unread:
    """A message skipped unread: its end is the reply it was given at its start (None: its
    sender is blocked; the call ends)."""

    __slots__ = ("reply",)

    def __init__(self, reply: pb.PushReply | None) -> None:
        self.reply = reply

    def add(self, chunk) -> None:
        pass

    def end(self) -> pb.PushReply | None:
        return self.reply


def add_peer_servicer(servicer: PeerServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer`` on ``server`` for the ``Peer`` service, as the generated
    ``add_PeerServicer_to_server`` does, but with each request chunk read by
    :func:`~dfedrw.peer.transport.chunks.parse_chunk` (a data chunk a view of the received
    bytes, not a protobuf copy of them)."""
    reply = pb.PushReply.SerializeToString
    handlers = {
        "PushOne": grpc.unary_unary_rpc_method_handler(servicer.PushOne, request_deserializer=parse_chunk, response_serializer=reply),
        "Push": grpc.stream_unary_rpc_method_handler(servicer.Push, request_deserializer=parse_chunk, response_serializer=reply),
        "Exchange": grpc.stream_stream_rpc_method_handler(servicer.Exchange, request_deserializer=parse_chunk, response_serializer=reply),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


SERVICE = "peer.transport.pb.Peer"


_REFUSALS = {
    "too_many_calls": "too many open calls from this sender",
    "blocked": "this sender sent past its rate bound; refused for a while",
    "idle": "the call carried nothing for too long",
    "replaced": "a newer call from the same sender replaced this one",
}


_STATUS = {"idle": grpc.StatusCode.DEADLINE_EXCEEDED, "replaced": grpc.StatusCode.ABORTED}
