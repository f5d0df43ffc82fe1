"""The receive side of the round protocol, independent of any transport.

Messages are keyed by round. A message for the current round or up to ``window`` rounds ahead
is buffered; an older one is stale and dropped; anything else (unknown sender, not a neighbour,
far-future round, second copy) is rejected. Every rejection is counted by reason; the log gets
at most one line per reason per ``log_interval`` seconds (anyone can make a client reject
messages as fast as it can send them), and the client carries on.

Under a schedule (a graph per round, :mod:`peer.schedule`) a sender must also be one of the
receiver's in-neighbours in the round the message is for, else it is rejected as
``not_neighbour``: however many clients a Byzantine one sends to, a receiver takes its message
only in the rounds the schedule gives it the edge, and at most one per round.

Only an accepted message (for the current round or the window ahead) marks a neighbour
presumed gone as alive again. A stale one does not: anyone who can send in a dead client's
name could otherwise keep its neighbours waiting for it every round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from dfedrw.peer.transport.ratelog import RateLimitedLog
from dfedrw.peer.transport.serde import ModelMessage

log = logging.getLogger(__name__)


class RoundWaiting:
    """Messages kept by round, that a round loop waits on until every expected sender's message
    of a round is in (or the sender is presumed gone), or a deadline. A subclass sets
    ``_cond`` (a ``threading.Condition``), ``_gone`` (a set), ``_waiting = None``, says what
    arrived for a round (:meth:`_arrived`, called with the lock held) and calls
    :meth:`_wake_if_complete` whenever something arrives."""

    _cond: threading.Condition
    _gone: set[int]
    _waiting: tuple[int, frozenset[int]] | None

    def _arrived(self, round_: int) -> dict[int, Any]:
        raise NotImplementedError

    def set_gone(self, peer: int, gone: bool = True) -> None:
        with self._cond:
            if gone:
                self._gone.add(peer)
            else:
                self._gone.discard(peer)
            self._wake_if_complete()

    def gone(self) -> frozenset[int]:
        with self._cond:
            return frozenset(self._gone)

    def wait(self, round_: int, expect: Iterable[int], timeout: float) -> dict[int, Any]:
        """Block until every expected sender (minus those marked gone) delivered ``round_``, or
        ``timeout`` seconds; returns what arrived for that round, from any sender."""
        expect = frozenset(expect)
        deadline = time.monotonic() + timeout
        with self._cond:
            self._waiting = (round_, expect)
            try:
                while True:
                    left = deadline - time.monotonic()
                    if self._complete(round_, expect) or left <= 0:
                        return dict(self._arrived(round_))
                    self._cond.wait(left)
            finally:
                self._waiting = None

    def _complete(self, round_: int, expect: frozenset[int]) -> bool:
        return not (expect - self._arrived(round_).keys() - self._gone)

    def _wake_if_complete(self) -> None:
        # Called with the lock held: the waiter is woken once, when its round is complete.
        if self._waiting is not None and self._complete(*self._waiting):
            self._cond.notify_all()


class Inbox(RoundWaiting):
    """``neighbours``: every client that may send to this one; ``senders_at`` (a schedule's):
    round -> those that send to it in that round (None: all of ``neighbours``, every round)."""

    def __init__(
        self, own_id: int, neighbours: Iterable[int], num_clients: int, window: int, *, log_interval: float = 10.0,
        senders_at: Callable[[int], Iterable[int]] | None = None,
    ) -> None:
        self.own_id = own_id
        self.neighbours = frozenset(neighbours)
        self.senders_at = senders_at
        self.num_clients = num_clients
        self.window = window
        self._round = 0
        self._buffer: dict[int, dict[int, ModelMessage]] = {}
        # Neighbours not waited for: unreachable, or silent for too many deadlines in a row.
        self._gone: set[int] = set()
        self._cond = threading.Condition()
        # What the round loop is blocked on in wait(): (round, expected senders), else None.
        # Messages and gone-marks wake it only once that is complete, not on every arrival:
        # each needless wake-up costs a thread switch and a turn at the interpreter lock.
        self._waiting: tuple[int, frozenset[int]] | None = None
        self.rejected: Counter[str] = Counter()
        self.stale = 0
        self.bytes_received = 0
        self.accepted = 0
        self.quiet_log = RateLimitedLog(log, log_interval)

    @property
    def round(self) -> int:
        return self._round

    def reject(self, reason: str, detail: str = "") -> tuple[bool, str]:
        """Count a rejected message. ``reason`` is a fixed tag; ``detail`` must hold no text
        from the message that is not escaped (:func:`peer.transport.ratelog.quote`)."""
        with self._cond:
            self.rejected[reason] += 1
        self.quiet_log.log(logging.WARNING, reason, "client %d rejected a message: %s %s", self.own_id, reason, detail)
        return False, reason

    def screen(self, sender: int, round_: int | None = None) -> tuple[bool, str] | None:
        """Reject a sender that is unknown or not a neighbour (None when it may send to us);
        under a schedule, given the message's round, also one that does not send to this
        client in that round, when the round is one a message would be buffered for now
        (:meth:`offer` checks every message it buffers).

        Cheap, so a transport can call it before decoding any tensor bytes.
        """
        if not 0 <= sender < self.num_clients:
            return self.reject("unknown_sender", f"sender {sender}")
        if sender not in self.neighbours:
            return self.reject("not_neighbour", f"sender {sender}")
        if round_ is not None and self.senders_at is not None and self._round <= round_ <= self._round + self.window:
            if sender not in self.senders_at(round_):
                return self.reject("not_neighbour", f"sender {sender} in round {round_}")
        return None

    def offer(self, msg: ModelMessage) -> tuple[bool, str]:
        """Buffer ``msg`` if it is acceptable; returns (accepted, reason)."""
        refused = self.screen(msg.sender)
        if refused is not None:
            return refused
        with self._cond:
            current = self._round
            if msg.round < current:
                # Not a sign of life by itself: only a message it can be waited for again (in
                # the window) is; the client re-arms a neighbour for a late one at most once per
                # absence (see the client's _accept).
                outcome = "stale"
            elif msg.round > current + self.window:
                outcome = "future"
            elif self.senders_at is not None and msg.sender not in self.senders_at(msg.round):
                # Checked here, under the lock, for every message buffered: the round may
                # have moved on since the sender was screened.
                outcome = "not_neighbour"
            else:
                slot = self._buffer.setdefault(msg.round, {})
                outcome = "duplicate" if msg.sender in slot else "buffered"
                if outcome == "buffered":
                    slot[msg.sender] = msg
                    self.bytes_received += msg.nbytes
                    self.accepted += 1
                    self._gone.discard(msg.sender)
                    self._wake_if_complete()
        if outcome == "stale":
            return self.drop_stale(msg.sender, msg.round)
        if outcome == "future":
            return self.reject(
                "future_round", f"round {msg.round} > {current}+{self.window} from {msg.sender}"
            )
        if outcome == "not_neighbour":
            return self.reject("not_neighbour", f"sender {msg.sender} in round {msg.round}")
        if outcome == "duplicate":
            return self.reject("duplicate", f"second round-{msg.round} message from {msg.sender}")
        return True, ""

    def drop_stale(self, sender: int, round_: int) -> tuple[bool, str]:
        """Count a message for a round already passed: late, not malicious (the deadline for
        that round passed), so dropped and counted apart from the rejections. Also for the
        messages buffered beside the inbox (a colluders' pool store), so that every message a
        client receives ends in one of its counters."""
        with self._cond:
            self.stale += 1
        self.quiet_log.log(logging.INFO, "stale_round", "client %d dropped a stale round-%d message from %d", self.own_id, round_, sender)
        return False, "stale_round"

    def count_received(self, nbytes: int) -> None:
        """Count the bytes of a message accepted beside the inbox (a colluders' pool)."""
        with self._cond:
            self.bytes_received += nbytes
            self.accepted += 1

    def _arrived(self, round_: int) -> dict[int, ModelMessage]:
        return self._buffer.get(round_, {})

    def advance(self, round_: int) -> None:
        """Move to ``round_``: older buffered rounds are dropped (they are stale now)."""
        with self._cond:
            self._round = round_
            for r in [r for r in self._buffer if r < round_]:
                del self._buffer[r]

    def total_rejected(self) -> int:
        with self._cond:
            return sum(self.rejected.values())
