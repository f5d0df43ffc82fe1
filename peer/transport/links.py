"""Emulated network links, applied on the sending side in user space, under any transport.

:class:`EmulatedLinks` wraps a transport (gRPC, in-process, torch.distributed) and holds each
message back until its link says it arrives, then hands it to the wrapped transport, which sends it
at once. Emulated per directed link (:class:`LinkProfile`, timed by a seeded :class:`LinkSchedule`):

- latency, plus jitter (a normal draw, the total clamped at >= 0);
- bandwidth, one message at a time: a message starts when the one before it on the same link
  has been transmitted, so messages queue behind each other;
- loss, per message (a lost message still occupies the link for its transfer time).

Not emulated: the sender's own TCP stack (or NCCL, or the in-process hand-over) runs at full
speed once a message is released; no duplication, no reordering on a link (arrivals stay in send
order, as on one TCP connection), no loss of single packets or chunks (a message is lost or
arrives whole), no congestion between links (each has its own bandwidth; links sharing a sender
or a receiver do not slow each other down), and nothing on the receiving side.

Every link has its own random stream, seeded from a digest of the run's seed and the link's
ends, so a run is reproducible on any platform and no link's draws depend on another's."""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dfedrw.peer.transport.base import Deliver, Reachability, Transport
from dfedrw.peer.transport.chunks import WireMessage, wire_size
from dfedrw.peer.transport.pb import peer_pb2 as pb

__all__ = ["EmulatedLinks", "LinkProfile", "LinkSchedule", "distance_profiles", "links_for"]

log = logging.getLogger(__name__)


def _stream(label: str) -> np.random.Generator:
    # A digest rather than ``hash()``: the same draws on every platform and Python version.
    digest = hashlib.blake2b(label.encode(), digest_size=8).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest, "big")))


@dataclass(frozen=True)
class LinkProfile:
    """One directed link: ``latency`` and ``jitter`` (its standard deviation) in seconds,
    ``bandwidth`` in bits per second (0: unlimited), ``loss`` the probability that a message is
    lost, in [0, 1): the values of a checked scenario's ``[links]`` (checked there, not again)."""

    latency: float = 0.0
    jitter: float = 0.0
    bandwidth: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        for name in ("latency", "jitter", "bandwidth", "loss"):
            object.__setattr__(self, name, float(getattr(self, name)))  # a plain float (not a numpy scalar or an int)

    @property
    def perfect(self) -> bool:
        """Whether the link changes nothing: no latency, no jitter, unlimited, lossless."""
        return self.latency == 0 and self.jitter == 0 and self.bandwidth == 0 and self.loss == 0

    def transfer_seconds(self, size_bytes: int) -> float:
        """Seconds to transmit ``size_bytes`` at the link's bandwidth (0 when unlimited)."""
        if size_bytes < 0:
            raise ValueError(f"size_bytes={size_bytes}: expected >= 0")
        return 0.0 if self.bandwidth == 0 else size_bytes * 8 / self.bandwidth


class LinkSchedule:
    """The timing of one directed link ``src -> dst``: when each message sent on it arrives.

    Two draws per message, always, in this order: a uniform (lost when below ``loss``), then a
    standard normal (the jitter), so the stream's position never depends on an outcome. Not
    thread-safe: :class:`EmulatedLinks` plans under its lock. Counters: ``sent`` (messages
    planned, lost ones included), ``lost``, ``bytes`` (of every message planned: a lost one was
    transmitted too)."""

    def __init__(self, profile: LinkProfile, seed: int, src: int, dst: int) -> None:
        self.profile = profile
        self.src = src
        self.dst = dst
        self._rng = _stream(f"links/{seed}/{src}/{dst}")
        self.busy_until = -math.inf  # when the link finishes transmitting what it was given
        self.last_arrival = -math.inf  # when the latest message not lost arrives
        self.sent = 0
        self.lost = 0
        self.bytes = 0

    def busy(self, now: float) -> bool:
        """Whether the link is still transmitting what it was given at ``now``."""
        return now < self.busy_until

    def plan(self, now: float, size_bytes: int) -> float | None:
        """The arrival time of a message of ``size_bytes`` sent at ``now``, or None when it is
        lost. The link is taken for the message's transfer time either way."""
        transfer = self.profile.transfer_seconds(size_bytes)
        lost = float(self._rng.random()) < self.profile.loss
        normal = float(self._rng.standard_normal())
        start = max(now, self.busy_until)
        self.busy_until = start + transfer
        self.sent += 1
        self.bytes += size_bytes
        if lost:
            self.lost += 1
            return None
        delay = max(0.0, self.profile.latency + self.profile.jitter * normal)
        arrival = max(self.busy_until + delay, self.last_arrival)
        self.last_arrival = arrival
        return arrival


def links_for(
    default: LinkProfile,
    overrides: Mapping[tuple[int, int], LinkProfile],
    seed: int,
    src: int,
    receivers: Iterable[int],
) -> dict[int, LinkSchedule]:
    """The schedules of ``src``'s links to each of ``receivers``: the profile of ``overrides``
    for ``(src, dst)`` where it has one, else ``default``."""
    return {dst: LinkSchedule(overrides.get((src, dst), default), seed, src, dst) for dst in receivers}


def distance_profiles(
    num_clients: int, seed: int, *, latency_per_unit: float, base: LinkProfile
) -> dict[tuple[int, int], LinkProfile]:
    """Profiles of every directed link ``(i, j)``, ``i != j``, between clients placed at seeded
    uniform random points of the unit square: ``base`` with ``latency_per_unit`` seconds more
    latency per unit of distance (a checked scenario's ``[links]``), the same both ways."""
    points = _stream(f"links/points/{seed}").random((num_clients, 2)).tolist()
    profiles: dict[tuple[int, int], LinkProfile] = {}
    for i in range(num_clients):
        for j in range(i + 1, num_clients):
            distance = math.hypot(points[i][0] - points[j][0], points[i][1] - points[j][1])
            profile = dataclasses.replace(base, latency=base.latency + latency_per_unit * distance)
            profiles[i, j] = profiles[j, i] = profile
    return profiles


class EmulatedLinks:
    """A transport that sends through ``inner`` as if over the links ``schedules`` time (one
    per receiver; a receiver without one is sent to at once).

    :meth:`send` never blocks: it plans the message on its link and queues it until its arrival
    time (a lost one is dropped here, counted in ``lost``); :meth:`pump` hands every message due
    by a given time to ``inner``, in arrival order. A daemon worker thread pumps as messages fall
    due by ``clock`` (which must then count seconds, as ``time.monotonic``); with
    ``start_worker=False`` there is none, and the caller pumps (tests, with a fake clock). With
    ``newest_only`` (asynchronous gossip) a link takes no message while it still transmits the
    one before: the sender's next model goes instead (:meth:`offer`).

    Counters: ``bytes_sent``, ``dropped``, ``skipped_stale`` are the inner transport's (counted
    when a message is handed over); ``lost``: messages the links lost; ``delayed``: handed over
    after waiting for their arrival time; ``skipped_busy``: turned away by a busy link."""

    def __init__(
        self,
        inner: Transport,
        schedules: Mapping[int, LinkSchedule],
        *,
        clock: Callable[[], float] = time.monotonic,
        start_worker: bool = True,
        newest_only: bool = False,
    ) -> None:
        self.inner = inner
        self.newest_only = newest_only
        self.skipped_busy = 0
        self.schedules = dict(schedules)
        self._clock = clock
        self._cond = threading.Condition()
        # Held around every inner.send: messages are handed over one at a time, in order, and the
        # inner transport's counters written by one thread at a time. Taken before _cond, never
        # while holding it; reentrant, for a close (or a send) made from within a hand-over.
        self._send_lock = threading.RLock()
        # (arrival time, sequence, to, chunks, time queued); the sequence breaks ties in order.
        self._heap: list[tuple[float, int, int, Sequence[pb.ModelChunk], float]] = []
        self._sequence = 0
        self._in_hand = 0  # taken off the heap, not yet handed to inner
        self._closed = False
        self.lost = 0
        self.delayed = 0
        self._worker: threading.Thread | None = None
        if start_worker:
            self._worker = threading.Thread(target=self._run, name="emulated-links", daemon=True)
            self._worker.start()

    # -- the inner transport's ---------------------------------------------------------

    def __getattr__(self, name: str) -> object:
        # What a transport offers beyond the protocol (gRPC's ``identity``, ``refused``,
        # ``open``, channel counters) is the inner one's.
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    @property
    def bytes_sent(self) -> int:
        return self.inner.bytes_sent

    @property
    def dropped(self) -> int:
        return self.inner.dropped

    @property
    def skipped_stale(self) -> int:
        return self.inner.skipped_stale

    def start(self, deliver: Deliver) -> str:
        return self.inner.start(deliver)

    def connect(self, addresses: Mapping[int, str], on_reachability: Reachability) -> None:
        self.inner.connect(addresses, on_reachability)

    def wait_ready(self, timeout: float) -> list[int]:
        return self.inner.wait_ready(timeout)

    # -- sending -----------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Messages waiting for their arrival time."""
        with self._cond:
            return len(self._heap)

    def message_seconds(self) -> float | None:
        """The inner transport's (see :meth:`GrpcTransport.message_seconds`), None when it has none;
        what the links add is their own profile's."""
        seconds = getattr(self.inner, "message_seconds", None)
        return seconds() if seconds is not None else None

    def wait_room(self, peers, timeout: float) -> list[int]:
        """The inner transport's (see :meth:`GrpcTransport.wait_room`); [] when it has none."""
        wait = getattr(self.inner, "wait_room", None)
        return wait(peers, timeout) if wait is not None else []

    def offer(self, to: int) -> bool:
        """Whether a message to ``to`` is to be made and sent now: not while its link still
        transmits the last one, with ``newest_only`` (counted in ``skipped_busy``)."""
        inner = getattr(self.inner, "offer", None)
        if inner is not None and not inner(to):
            return False
        schedule = self.schedules.get(to)
        if not self.newest_only or schedule is None:
            return True
        with self._cond:
            if schedule.busy(self._clock()):
                self.skipped_busy += 1
                return False
            return True

    def send(self, to: int, chunks: list[pb.ModelChunk] | WireMessage) -> None:
        """Queue one message for its arrival time on the link to ``to`` (never blocks)."""
        if not isinstance(chunks, Sequence):  # an iterator: read once, here
            chunks = list(chunks)
        schedule = self.schedules.get(to)
        if schedule is None:
            if not self._closed:
                with self._send_lock:
                    self.inner.send(to, chunks)
            return
        size = wire_size(chunks)  # a WireMessage knows its size without building its chunks
        with self._cond:
            if self._closed:
                return
            now = self._clock()
            if self.newest_only and schedule.busy(now):
                self.skipped_busy += 1
                return
            arrival = schedule.plan(now, size)
            if arrival is None:
                self.lost += 1
                return
            heapq.heappush(self._heap, (arrival, self._sequence, to, chunks, now))
            self._sequence += 1
            self._cond.notify_all()

    def pump(self, now: float) -> int:
        """Hand every message whose arrival time is at or before ``now`` to the inner transport,
        earliest first; returns how many. Nothing after :meth:`close`."""
        count = 0
        with self._send_lock:
            while True:
                with self._cond:
                    if self._closed or not self._heap or self._heap[0][0] > now:
                        return count
                    arrival, _, to, chunks, queued = heapq.heappop(self._heap)
                    self._in_hand += 1
                try:
                    self.inner.send(to, chunks)
                    count += 1
                finally:
                    with self._cond:
                        self._in_hand -= 1
                        if arrival > queued:
                            self.delayed += 1
                        self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    if not self._heap:
                        self._cond.wait()
                        continue
                    delay = self._heap[0][0] - self._clock()
                    if delay <= 0:
                        break
                    self._cond.wait(delay)
            try:
                self.pump(self._clock())
            except Exception:  # one failed hand-over must not stop the links
                log.exception("emulated links: handing a message to the transport failed")

    def flush(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds, real time) until no message waits for its arrival
        time, then for the inner transport's sends with what is left of it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._cond.wait_for(lambda: self._closed or (not self._heap and self._in_hand == 0), timeout)
        self.inner.flush(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Stop the worker (messages still waiting are never sent), then close the inner one."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify_all()
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join()
        with self._send_lock:  # a hand-over in progress finishes first
            pass
        self.inner.close()
