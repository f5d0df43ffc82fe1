"""gRPC transport: one server per client and a channel to each neighbour, on gRPC's asyncio API.

Models go to a neighbour on one long-lived ``Exchange`` call, one message at a time: the next
goes out once the receiver replied to the previous one (:mod:`.sender`). The thin servicer cuts
the call into messages at their header chunks (``peer.transport.framing``), hands each to the
client's ``deliver`` chunk by chunk as it arrives, and turns the verdict into a reply; each sender
has its own call slots and message rate bound at the receiver, and idle calls are ended
(:mod:`.admission`): no sender can take another's place or flood the receiver. ``Push`` and
``PushOne`` take one message per call, for tools and tests. Message-size limits are explicit on
both ends (a larger model streams in several chunks); ``grpc.so_reuseport`` is off, so two
clients never share a port silently. Credentials: the client's identity (:mod:`.tls`).

Channels are opened to every neighbour at :meth:`~GrpcTransport.connect` (a fixed graph) or,
``on_demand`` (a graph that changes each round), when a peer is first sent to or opened
(:meth:`~GrpcTransport.open`); then one that carried nothing for ``idle_channel_timeout`` seconds
is closed, the next message to its peer opening a new one. Either way every channel is mutual TLS.

Every server, channel and call of a process runs on one event loop in one thread (``grpc-io``,
:mod:`.loop`): the round loop hands a message over with one thread-safe call, where gRPC's
threaded API passes each message and reply between several threads per call (request iterator,
channel poller, sender, server poller, handler pool). ``deliver`` runs on the event loop and must
return promptly: the client's own validates, decodes and buffers."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping

import grpc

from dfedrw.peer.transport.identity import ClientIdentity
from dfedrw.peer.transport.base import Deliver, Reachability
from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.framing import FRAMING
from dfedrw.peer.transport.grpc.admission import PeerServicer, add_peer_servicer
from dfedrw.peer.transport.grpc.limits import CallLimits
from dfedrw.peer.transport.grpc.loop import io_loop, on_loop
from dfedrw.peer.transport.grpc.sender import Sender
from dfedrw.peer.transport.grpc.tls import channel_credentials, identity_options, server_credentials
from dfedrw.peer.transport.chunks import wire_size

log = logging.getLogger(__name__)


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
        on_demand: bool = False,
        idle_channel_timeout: float = 120.0,
        newest_only: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        self.advertise = advertise
        self.send_timeout = send_timeout
        self.max_message_bytes = max_message_bytes
        self._limit = chunk_bytes + FRAMING
        self._chunk_bytes = chunk_bytes
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
        self._senders: dict[int, Sender] = {}
        self._on_reachability: Reachability = lambda peer, state: None
        self.bytes_sent = 0
        self.dropped = 0  # queued messages pushed out by newer ones
        self.skipped_busy = 0  # models not made for a neighbour whose queue was full (offer)
        self._room = threading.Condition()  # notified when a neighbour's queue has room again
        self._reply_seconds: float | None = None  # see message_seconds
        self._closed_stale = 0  # skipped_stale of the senders already closed
        # Each neighbour's latest reply: (its round, accepted, reason). A client that resumed
        # from a checkpoint learns from it which round its neighbours are in.
        self.peer_replies: dict[int, tuple[int, bool, str]] = {}
        self._addresses: dict[int, str] = {}
        self.on_demand = on_demand
        self.idle_channel_timeout = idle_channel_timeout
        # Asynchronous gossip: a neighbour's queue keeps only the newest model (see Sender).
        self.newest_only = newest_only
        self._last_used: dict[int, float] = {}  # peer -> when a message was last queued for it
        self._next_sweep = 0.0
        self.channels_opened = 0
        self.channels_closed = 0  # closed for being idle

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
            # Each call's flow-control window fixed at two chunks (gRPC would grow it to several
            # MB a call on loopback): what gRPC's core buffers of a neighbour's model before the
            # client has read it. On a client receiving 44 MB models from ten neighbours, the
            # larger windows left some 150 MB more in its heap (measured, bench/memory_at_size.py).
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", 2 * self._chunk_bytes + (64 << 10)),
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
            add_peer_servicer(self._servicer, server)
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
        """Learn the peers' addresses; open a channel to each now (on demand: none yet)."""
        self._on_reachability = on_reachability
        self._addresses = dict(addresses)
        if not self.on_demand:
            self.open(addresses)

    def open(self, peers: Iterable[int]) -> None:
        """Open a channel to each of ``peers`` (whose address :meth:`connect` gave) that has none."""
        wanted = [p for p in peers if p in self._addresses and p not in self._senders]
        if not wanted:
            return

        async def open_() -> None:
            now = time.monotonic()
            for peer in wanted:
                if peer in self._senders:
                    continue
                channel = self._channel(peer, self._addresses[peer])
                self._channels[peer] = channel
                self._senders[peer] = Sender(peer, channel, self)
                self._last_used[peer] = now
                self.channels_opened += 1

        on_loop(open_())

    def close_idle(self, now: float | None = None) -> list[int]:
        """On demand: close the channels to which nothing was sent for ``idle_channel_timeout``
        seconds and nothing is queued or in flight; returns those peers."""
        now = time.monotonic() if now is None else now
        idle = [p for p, t in list(self._last_used.items()) if now - t >= self.idle_channel_timeout and p in self._senders]
        if not idle:
            return []

        async def close() -> list[int]:
            closed = []
            for peer in idle:
                sender = self._senders.get(peer)
                if sender is None or sender._busy():
                    continue
                channel = self._channels.pop(peer)
                del self._senders[peer]
                self._closed_stale += sender.skipped_stale
                sender.stop()
                await asyncio.gather(sender.task, return_exceptions=True)
                await channel.close()
                closed.append(peer)
            self.channels_closed += len(closed)
            return closed

        return on_loop(close())

    def reconnect(self, peer: int) -> None:
        """A neighbour that was down is back (it sent us a message): if our channel to it is still
        failing (gRPC waits out its reconnection backoff first), open a new one now and move the
        queued messages over to it. Callable from any thread."""

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
            self._senders[peer] = Sender(peer, new, self)
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

    def offer(self, to: int) -> bool:
        """Whether a model for ``to`` is to be made and sent now (asked before it is encoded for
        the link). Under asynchronous gossip (``newest_only``) not while one waits behind the
        message in flight: it would be dropped for the newer one, and a dropped difference leaves
        the receiver's copy behind the sender's (counted in ``skipped_busy``)."""
        sender = self._senders.get(to)
        if not self.newest_only or sender is None:
            return True
        with sender.lock:
            if sender.queue:
                self.skipped_busy += 1
                return False
        return True

    def replied_in(self, seconds: float) -> None:
        # A mean over the last messages to every neighbour (only read as a scale, so unlocked).
        self._reply_seconds = seconds if self._reply_seconds is None else 0.9 * self._reply_seconds + 0.1 * seconds

    def message_seconds(self) -> float | None:
        """How long a message to a neighbour takes until it is answered, lately (a running mean;
        None before the first reply): the time a message of this size takes on these links and
        at these receivers, whatever their steps cost."""
        return self._reply_seconds

    def room_made(self) -> None:
        with self._room:
            self._room.notify_all()

    def wait_room(self, peers: Iterable[int], timeout: float) -> list[int]:
        """Wait, at most ``timeout`` seconds, until no message waits in the queue of any of
        ``peers`` (one may be in flight); returns those whose queue still holds one. How
        asynchronous gossip paces a client (:meth:`~dfedrw.peer.client.presence.Presence.pace`)."""
        deadline = time.monotonic() + timeout
        with self._room:
            while True:
                # A queue's length is read without its lock: a stale read only costs a recheck.
                busy = [p for p in peers if (s := self._senders.get(p)) is not None and s.queue]
                left = deadline - time.monotonic()
                if not busy or left <= 0:
                    return busy
                self._room.wait(min(left, 0.5))

    def send(self, to: int, chunks: list[pb.ModelChunk]) -> None:
        if self.on_demand:
            now = time.monotonic()
            self._last_used[to] = now
            if now >= self._next_sweep:
                # Checked as the client sends (every round), so no timer of its own is needed.
                self._next_sweep = now + self.idle_channel_timeout / 4
                self.close_idle(now)
            if to not in self._senders:
                self.open([to])
        sender = self._senders.get(to)
        if sender is None:  # never connected (no address): nothing to send to
            return
        # A WireMessage knows its size (the round loop sends one to every neighbour).
        self.dropped += sender.put(chunks)
        self.bytes_sent += wire_size(chunks)

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
