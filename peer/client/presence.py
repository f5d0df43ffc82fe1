"""Which of a running client's neighbours it waits for, what it sends them, and how far ahead
of them it may run.

A neighbour that misses ``max_missed_rounds`` deadlines in a row is not waited for at the round
barrier (:class:`peer.transport.inbox.Inbox` keeps that set) but is slow, not gone: it is still
sent every model, and a model of any round from it (accepted, late or early) has it waited for
again from the next round on. One this client's server shut out for sending past its rate bound
is alive too: not waited for until heard from, but sent every model. Only one the transport finds
unreachable (its process is gone) gets just a probe every :data:`PROBE_EVERY` rounds until heard
from. The model sent last is kept until its round has passed, for a neighbour back in it.

The lead bound (synchronous rounds on a fixed graph): a client does not begin round ``r`` while
more than ``tolerate`` neighbours it stopped waiting for, and can reach, are known to be in a
round before ``r - round_window`` (``tolerate``: how many Byzantine neighbours it is told of, so
that one lying about its round, or creeping on, cannot set its pace). Its model of ``r`` would reach
them too far ahead to be kept, and a client that stopped waiting for everyone would race through
its rounds alone; one it still waits for holds it back at the barrier. A neighbour's known round
is the highest label of any model from it and the round named in its replies; one whose known
round has not moved for ``stall_timeout`` seconds (stopped, or hung) holds nobody back until it
moves, so a silent neighbour cannot stall the network, while a slow one holds its neighbours
within ``round_window`` rounds of it. Counted: :attr:`Presence.held_rounds`, ``held_seconds``.

:class:`Presence` holds that state for one client; the client gives it the callbacks of its
intake (:meth:`Presence.after_offer`) and transport (:meth:`Presence.on_reachability`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("dfedrw.peer.client.client")

# A neighbour presumed gone is still sent a model every this many rounds.
PROBE_EVERY = 5


class Presence:
    """The neighbours client ``own_id`` waits for and sends to (settings: see the module).
    ``inbox`` keeps the set not waited for and the round it is in; ``collusion``: a colluder's
    exchange with the other colluders (told of their reachability too), or None; ``newest_only``
    (asynchronous gossip): no older model goes to a neighbour whose reply names a newer one."""

    def __init__(
        self, own_id: int, neighbours: Iterable[int], *, inbox, transport, graphs, round_timeout: float, round_window: int, collusion=None,
        stall_timeout: float = 60.0, newest_only: bool = False, tolerate: int = 0,
    ) -> None:
        self.id = own_id
        self.neighbours = tuple(neighbours)
        self.inbox, self.transport, self.graphs, self.collusion = inbox, transport, graphs, collusion
        self.round_timeout, self.round_window = round_timeout, round_window
        self.newest_only = newest_only
        # Neighbours back after not being waited for -> the first round they are waited for again.
        self.back_at: dict[int, int] = {}
        self._back_since: dict[int, float] = {}  # when each came back (monotonic seconds)
        # Neighbours our server shut out (rate bound), unheard since: still sent to, not waited for.
        self.shut_out: set[int] = set()
        self.shut_out_count: dict[int, int] = {}  # times our server shut each one out
        # Neighbours the transport could not reach, not heard from since: only probed.
        self.unreachable: set[int] = set()
        self.last_sent: tuple[int, Any] | None = None  # (round, chunks) this client sent last
        # The lead bound: each neighbour's highest known round and when it last moved on.
        self.stall_seconds = stall_timeout
        self.tolerate = tolerate
        self.known: dict[int, int] = {}
        self._moved_at: dict[int, float] = {}
        self._news = threading.Condition()
        self.held_rounds = 0  # rounds it began late because a neighbour was too far behind
        self.held_seconds = 0.0
        # Asynchronous gossip (see pace): neighbours not paced for, and the seconds spent pacing.
        self.lagging: set[int] = set()
        self.paced_seconds = 0.0

    # -- what it hears -------------------------------------------------------------------
    def heard(self, peer: int, round_: int) -> None:
        """``peer`` is in round ``round_`` or later (a model of it came, or its reply named it)."""
        if peer not in self.neighbours:
            return
        with self._news:
            if round_ > self.known.get(peer, -1):
                self.known[peer] = round_
                self._moved_at[peer] = time.monotonic()
                self._news.notify_all()

    def after_offer(self, sender: int, round_: int, accepted: bool, reason: str, was_gone: bool) -> None:
        """A model message of ``sender``'s reached the inbox (whatever its verdict): a sign of
        life. One not waited for is waited for again: from the model's round when the inbox
        kept it, else from the next round."""
        self.heard(sender, round_)
        if not was_gone:
            return
        if accepted:
            self.on_back(sender, round_)
        elif sender in self.neighbours:
            self.inbox.set_gone(sender, False)
            self.on_back(sender, self.inbox.round + 1)

    def on_reachability(self, peer: int, state: str) -> None:
        """The transport's word on ``peer``: ``"reachable"`` (a reply came: the round it names is
        the peer's), ``"shut_out"`` (our server refuses its calls for a while), ``"unreachable"``
        (a send to it failed)."""
        if self.collusion is not None:
            self.collusion.on_reachability(peer, state)
            if peer not in self.neighbours:
                return
        if state == "reachable":
            self.lagging.discard(peer)
            reply = (getattr(self.transport, "peer_replies", None) or {}).get(peer)
            if reply is not None and not self.newest_only:
                self.heard(peer, int(reply[0]))
            if peer in self.unreachable:
                self.unreachable.discard(peer)
                with self._news:
                    self._news.notify_all()
            return
        if state == "shut_out":
            # Nothing it sends can arrive until then. Its next accepted message brings it back.
            self.shut_out.add(peer)
            self.shut_out_count[peer] = self.shut_out_count.get(peer, 0) + 1
            if peer not in self.inbox.gone():
                log.warning("client %d: neighbour %d is shut out for sending past its rate bound, no longer waiting for it", self.id, peer)
                self.inbox.set_gone(peer)
            return
        if state != "unreachable":
            return
        if time.monotonic() - self._back_since.get(peer, -1e9) < self.round_timeout:
            # It just sent us a model: alive. What failed is a send on our channel to its
            # earlier process; missed deadlines will tell if it is gone again.
            return
        self.shut_out.discard(peer)
        if self.newest_only:
            self.inbox.forget_unfinished(peer)
        if peer not in self.unreachable:
            self.unreachable.add(peer)  # only probed from now on, and no lead bound
            with self._news:
                self._news.notify_all()
        if peer not in self.inbox.gone():
            log.warning("client %d: neighbour %d unreachable, no longer waiting for it", self.id, peer)
            self.inbox.set_gone(peer)

    def on_back(self, peer: int, round_: int) -> None:
        """A neighbour not waited for sent a model (it caught up, restarted, or is merely slow):
        wait for it again from ``round_`` on, not before, and send it that round's model again if
        it went out already (to one it could not reach, only as an occasional probe)."""
        self.back_at[peer] = round_
        self._back_since[peer] = time.monotonic()
        self.shut_out.discard(peer)
        self.unreachable.discard(peer)
        log.warning("client %d: neighbour %d is back (round %d); waiting for it again", self.id, peer, round_)
        reconnect = getattr(self.transport, "reconnect", None)
        if reconnect is not None:
            reconnect(peer)  # our channel to it may still be waiting out its reconnection backoff
        last = self.last_sent
        if last is not None and last[0] == round_ and peer in self.graphs.receivers_of(self.id, round_):
            self.transport.send(peer, last[1].again(peer))

    # -- whom it waits for and sends to -----------------------------------------------------
    def expected(self, r: int, among: frozenset[int]) -> frozenset[int]:
        """Waited for in round ``r``: not those given up on, nor those back from a later round."""
        for k in [k for k, b in list(self.back_at.items()) if b <= r]:
            self.back_at.pop(k, None)
        later = {k for k, b in list(self.back_at.items()) if b > r}
        return among - self.inbox.gone() - later

    def begin_round(self, r: int) -> None:
        """Round ``r`` begins: nobody waits for a model of a round past, so it is let go."""
        if self.last_sent is not None and self.last_sent[0] < r:
            self.last_sent = None

    def behind(self, r: int) -> list[int]:
        """The neighbours that hold round ``r`` back (see the module): not waited for but
        reachable, known to be in a round before ``r - round_window``, and moving on (their
        known round moved within ``stall_seconds``)."""
        now, floor = time.monotonic(), r - self.round_window
        given_up = self.inbox.gone()
        with self._news:
            return [
                k for k in self.neighbours
                if k in given_up and k not in self.unreachable and self.known.get(k, -1) < floor
                and now - self._moved_at.setdefault(k, now) < self.stall_seconds
            ]

    def hold_back(self, r: int, check_stop: Callable[[], None]) -> None:
        """Before round ``r`` (a fixed graph, synchronous rounds): wait until no more than
        ``tolerate`` neighbours hold it back (:meth:`behind`); ``check_stop`` is called now and
        then (it raises to stop)."""
        if self.graphs.dynamic or len(self.behind(r)) <= self.tolerate:
            return
        start = time.monotonic()
        waited = self.behind(r)
        log.info("client %d: round %d waits for neighbours %s to catch up (more than %d rounds behind)", self.id, r, waited, self.round_window)
        while True:
            check_stop()
            late = self.behind(r)
            if len(late) <= self.tolerate:
                break
            with self._news:
                left = min(self.stall_seconds - (time.monotonic() - self._moved_at[k]) for k in late)
                self._news.wait(min(0.5, max(left, 0.01)))
        self.held_rounds += 1
        self.held_seconds += time.monotonic() - start

    def pace(self, to: Iterable[int]) -> None:
        """Asynchronous gossip: wait, at most ``round_timeout`` seconds, until the model sent last
        to each of ``to`` went out (transports that queue per neighbour): a client makes models no
        faster than its neighbours take them, and a slow receiver slows its senders down rather
        than be sent models that go stale in a queue. A neighbour whose queue did not empty in
        that time (stopped, hung, or far slower) is not waited for again until it answers."""
        wait = getattr(self.transport, "wait_room", None)
        if not self.newest_only or wait is None:
            return
        peers = [k for k in to if k not in self.unreachable and k not in self.lagging]
        if not peers:
            return
        start = time.monotonic()
        for k in wait(peers, self.round_timeout):
            log.warning("client %d: neighbour %d took no model for %.0f s; not waiting for it until it answers", self.id, k, self.round_timeout)
            self.lagging.add(k)
        self.paced_seconds += time.monotonic() - start

    def send_all(self, round_: int, outgoing, to: Iterable[int]) -> None:
        """Send the round's model (an :class:`~dfedrw.peer.transport.compression.Outgoing`) to
        ``to``, and keep it as the one sent last."""
        self.last_sent = (round_, outgoing)
        # A receiver whose last reply said it holds another base than a difference is from, or
        # refused the last as too far ahead (which leaves what it holds), gets a whole model next.
        replies = getattr(self.transport, "peer_replies", None) or {}
        # Emulated links under asynchronous gossip: a link still busy with the last model takes
        # none now (asked before the model is encoded for it: a difference not sent is no base).
        offer = getattr(self.transport, "offer", None)
        for k in to:
            # A neighbour that could not be reached only gets a probe now and then: a send to a
            # silently dead host hangs until its timeout, but two clients that lost each other
            # must keep probing or neither would ever hear from the other again.
            if k in self.unreachable and round_ % PROBE_EVERY:
                continue
            reply = replies.get(k)
            if self.newest_only and reply is not None and not reply[1] and reply[2] in _HOLDS_NEWER and round_ <= reply[0]:
                continue  # it holds a newer model of ours (we restarted from an older step): not news there
            if offer is not None and not offer(k):
                continue
            if reply is not None and reply[2] in ("base_mismatch", "future_round"):
                outgoing.encoder.mismatch(k)
            self.transport.send(k, outgoing.to(k))


# Refusals whose reply names the label of a newer model the receiver holds of the sender.
_HOLDS_NEWER = frozenset({"stale_round", "duplicate"})
