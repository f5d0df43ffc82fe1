"""Which of a running client's neighbours it waits for, and what it sends them.

A neighbour that misses its deadlines, or that the transport finds unreachable, is presumed
gone (:class:`peer.transport.inbox.Inbox` keeps that set): it is not waited for, and is sent
a model only every :data:`PROBE_EVERY` rounds, as a probe. One that sends a model again is
back, and waited for from the round of that model on. One that the client's own server shut
out for sending past its rate bound is alive: not waited for until it is heard from again, but
still sent every model, or it would wait out its deadlines for ours and hold up its own
neighbours in turn. The model sent last is kept until its round has passed, so that a
neighbour that comes back in that round can be sent it again.

:class:`Presence` holds that state for one client; the client gives it the callbacks of its
intake (:meth:`Presence.after_offer`) and transport (:meth:`Presence.on_reachability`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("dfedrw.peer.client.client")

# A neighbour presumed gone is still sent a model every this many rounds.
PROBE_EVERY = 5


class Presence:
    """The neighbours client ``own_id`` waits for and sends to. ``inbox``: its inbox (the set
    presumed gone, the round it is in); ``transport``: what it sends with; ``graphs``: the
    round graphs; ``round_timeout`` and ``round_window``: the network's settings;
    ``collusion``: a colluder's exchange with the other colluders (told of their reachability
    too), or None."""

    def __init__(
        self, own_id: int, neighbours: Iterable[int], *, inbox, transport, graphs, round_timeout: float, round_window: int, collusion=None,
    ) -> None:
        self.id = own_id
        self.neighbours = tuple(neighbours)
        self.inbox, self.transport, self.graphs, self.collusion = inbox, transport, graphs, collusion
        self.round_timeout, self.round_window = round_timeout, round_window
        # Neighbours that came back after being presumed gone -> the first round they sent:
        # they are not waited for before it.
        self.back_at: dict[int, int] = {}
        self._back_since: dict[int, float] = {}  # when each came back (monotonic seconds)
        self._rearmed: set[int] = set()  # taken back on a late message since last heard in step
        # Neighbours our server shut out for sending past their rate bound, not heard from
        # since: alive, so still sent every model (see send_all), but not waited for.
        self.shut_out: set[int] = set()
        self.last_sent: tuple[int, Any] | None = None  # (round, chunks) this client sent last

    # -- what it hears -------------------------------------------------------------------
    def after_offer(self, sender: int, round_: int, accepted: bool, reason: str, was_gone: bool) -> None:
        """A model message reached the inbox: a neighbour presumed gone that sent one is back."""
        if accepted and was_gone:
            self._rearmed.discard(sender)
            self.on_back(sender, round_)
        elif was_gone and reason == "stale_round" and sender not in self._rearmed and round_ >= self.inbox.round - self.round_window:
            # A neighbour presumed gone that is only a few rounds behind (e.g. it restarted and
            # is catching up, and this client passed the round it came back at just before
            # its message arrived): waited for again from the next round, which it reaches
            # quickly. Once per absence, so a client that is merely slow costs at most
            # max_missed_rounds deadlines more.
            self._rearmed.add(sender)
            self.inbox.set_gone(sender, False)
            self.on_back(sender, self.inbox.round + 1)

    def on_reachability(self, peer: int, state: str) -> None:
        """The transport's word on ``peer``: ``"shut_out"`` (our server refuses its calls for a
        while), ``"unreachable"`` (a send to it failed), or another state (ignored)."""
        if self.collusion is not None:
            self.collusion.on_reachability(peer, state)
            if peer not in self.neighbours:
                return
        if state == "shut_out":
            # Nothing it sends can arrive until then. Its next accepted message brings it back.
            self.shut_out.add(peer)
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
        self.shut_out.discard(peer)  # only probed from now on
        if peer not in self.inbox.gone():
            log.warning("client %d: neighbour %d unreachable, no longer waiting for it", self.id, peer)
            self.inbox.set_gone(peer)

    def on_back(self, peer: int, round_: int) -> None:
        """A neighbour presumed gone sent a model it can be waited for with (e.g. it restarted
        and caught up): wait for it again from that round on, not before (it skipped the
        rounds in between), and if this client already sent that round's model (while the
        neighbour was presumed gone, so to it only as an occasional probe), send it again."""
        self.back_at[peer] = round_
        self._back_since[peer] = time.monotonic()
        self.shut_out.discard(peer)
        log.warning("client %d: neighbour %d is back (round %d); waiting for it again", self.id, peer, round_)
        reconnect = getattr(self.transport, "reconnect", None)
        if reconnect is not None:
            reconnect(peer)  # our channel to it may still be waiting out its reconnection backoff
        last = self.last_sent
        if last is not None and last[0] == round_ and peer in self.graphs.receivers_of(self.id, round_):
            self.transport.send(peer, last[1].again(peer))

    # -- whom it waits for and sends to -----------------------------------------------------
    def expected(self, r: int, among: frozenset[int]) -> frozenset[int]:
        """Who is waited for in round ``r``: not the neighbours presumed gone, nor those that
        came back at a later round."""
        for k in [k for k, b in list(self.back_at.items()) if b <= r]:
            self.back_at.pop(k, None)
        later = {k for k, b in list(self.back_at.items()) if b > r}
        return among - self.inbox.gone() - later

    def begin_round(self, r: int) -> None:
        """Round ``r`` begins: nobody waits for a model of a round past, so it is let go."""
        if self.last_sent is not None and self.last_sent[0] < r:
            self.last_sent = None

    def send_all(self, round_: int, outgoing, to: Iterable[int]) -> None:
        """Send the round's model (``outgoing``: a
        :class:`~dfedrw.peer.transport.compression.Outgoing`, the message each neighbour gets)
        to ``to``, and keep it as the one sent last."""
        self.last_sent = (round_, outgoing)
        gone = self.inbox.gone()
        # A receiver whose last reply said it holds another model of this client than the one
        # a difference is from, or that refused the last as too far ahead (which does not
        # change what it holds), gets a whole model next (transports whose replies reach here).
        replies = getattr(self.transport, "peer_replies", None) or {}
        # Emulated links under asynchronous gossip: a link still busy with the last model takes
        # none now (asked before the model is encoded for it: a difference not sent is no base).
        offer = getattr(self.transport, "offer", None)
        for k in to:
            # A neighbour presumed gone only gets a probe now and then: a send to a silently
            # dead host hangs until its timeout, but two clients that lost each other must keep
            # probing or neither would ever hear from the other again.
            if k in gone and k not in self.shut_out and round_ % PROBE_EVERY:
                continue
            if offer is not None and not offer(k):
                continue
            reply = replies.get(k)
            if reply is not None and reply[2] in ("base_mismatch", "future_round"):
                outgoing.encoder.mismatch(k)
            self.transport.send(k, outgoing.to(k))
