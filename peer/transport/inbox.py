"""The receive side of the round protocol, independent of any transport.

Messages are keyed by round: one for the current round or up to ``window`` rounds ahead is
buffered, an older one is stale and dropped, anything else (unknown sender, not a neighbour,
far-future round, second copy) is rejected and counted by reason, logged at most once per reason
per ``log_interval`` seconds (anyone can make a client reject messages as fast as it sends them).

Under a schedule (a graph per round, :mod:`peer.graph.schedule`) a sender must also be one of the
receiver's in-neighbours in the round the message is for, else it is rejected as
``not_neighbour``: however many clients a Byzantine one sends to, a receiver takes its message
only in the rounds the schedule gives it the edge, and at most one per round.

Only an accepted message (for the current round or the window ahead) marks a neighbour
presumed gone as alive again. A stale one does not: anyone who can send in a dead client's
name could otherwise keep its neighbours waiting for it every round.

Held models. A message that arrives in chunks gets a :class:`Slot` when its header arrives
(:meth:`Inbox.reserve`), with the buffer its payload is decoded into. A round's buffers are rows
of one matrix (row 0 the client's own model, then the round's senders in id order), so the
candidates go to the rule as that matrix, not a copy (:meth:`Inbox.stacked`). The inbox holds at
most ``capacity`` received models, kept or reserved (by default one per neighbour and round of the
window: what an honest network can fill); one beyond is rejected as ``inbox_full``. A round the
client is done with (:meth:`Inbox.close`) lets its models go at once: a message for it that comes
later is counted, not kept, and one still arriving for a passed round lets go of its buffer."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from dfedrw.peer.transport.ratelog import RateLimitedLog
from dfedrw.peer.transport.serde import ModelMessage

log = logging.getLogger(__name__)



def window_outcome(label: int, current: int, window: int) -> str | None:
    """What a receiver in round ``current`` does with a message labelled ``label`` by its round
    alone: ``"stale"`` (a round it passed: dropped), ``"future"`` (more than ``window`` rounds
    ahead: refused as ``future_round``), or None (kept, in the window). The one place that
    decides it: the inbox of a client, and the batched engine for an attack's labels."""
    if label < current:
        return "stale"
    if label > current + window:
        return "future"
    return None

class RoundWaiting:
    """Messages kept by round, that a round loop waits on until every expected sender's message of
    a round is in (or the sender is presumed gone), or a deadline. A subclass sets ``_cond`` (a
    ``threading.Condition``), ``_gone`` (a set), ``_waiting = None``, says what came for a round
    (:meth:`_arrived`, lock held) and calls :meth:`_wake_if_complete` on each arrival."""

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


class Slot:
    """A message whose header the inbox took, while its payload arrives: sender, round, and the
    buffer its payload goes into (None: not kept, or let go). Writers into the buffer hold
    ``lock``; ``on_release`` is called, with it held, when the inbox lets go of the buffer before
    the message is complete, so nothing writes there once :meth:`release` returns."""

    __slots__ = ("sender", "round", "buffer", "on_release", "lock")

    def __init__(self, sender: int, round_: int, buffer: torch.Tensor | None) -> None:
        self.sender, self.round, self.buffer = sender, round_, buffer
        self.on_release: Callable[[], None] | None = None
        self.lock = threading.Lock()

    def release(self) -> None:
        with self.lock:
            self.buffer = None
            if self.on_release is not None:
                self.on_release()


class Inbox(RoundWaiting):
    """``neighbours``: every client that may send to this one; ``senders_at`` (a schedule's):
    round -> those that send to it in that round (None: all of ``neighbours``, every round).
    ``model_size``: the float32 values of a model (the buffers :meth:`reserve` gives);
    ``rows_at``: round -> the senders whose models go into that round's matrix, in row order
    (None: every neighbour, in id order); ``capacity``: the most received models held (default
    ``(window + 1) * len(neighbours)``)."""

    def __init__(
        self, own_id: int, neighbours: Iterable[int], num_clients: int, window: int, *, log_interval: float = 10.0,
        senders_at: Callable[[int], Iterable[int]] | None = None, model_size: int = 0,
        rows_at: Callable[[int], Sequence[int]] | None = None, capacity: int | None = None,
    ) -> None:
        self.own_id = own_id
        self.neighbours = frozenset(neighbours)
        self.senders_at = senders_at
        self.num_clients = num_clients
        self.window = window
        self.model_size = model_size
        self.rows_at = rows_at if rows_at is not None else (lambda r, rows=tuple(sorted(self.neighbours)): rows)
        self.capacity = (window + 1) * len(self.neighbours) if capacity is None else capacity
        self._round = 0
        self._buffer: dict[int, dict[int, ModelMessage]] = {}
        self._pending: dict[tuple[int, int], Slot] = {}
        # Each round's matrix of candidates (row 0: the own model) and the row of each sender.
        self._matrices: dict[int, tuple[torch.Tensor, dict[int, int]]] = {}
        # Rounds the client is done with (close()): who sent for them, so a second copy is
        # still a duplicate; what comes for them is counted, not kept.
        self._closed: dict[int, set[int]] = {}
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

    def told(self, sender: int | None) -> int:
        """The round a reply to ``sender`` names: this client's (a message of an earlier round
        would reach it stale)."""
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
        under a schedule, given the message's round, also one that does not send to this client
        in that round, when a message for it would be buffered now (:meth:`offer` checks every
        message it buffers). Cheap: a transport calls it before decoding any tensor bytes."""
        refused = self.screened(sender, round_)
        return None if refused is None else self.reject(*refused)

    def screened(self, sender: int, round_: int | None = None) -> tuple[str, str] | None:
        """What :meth:`screen` would reject (reason, detail), without counting it."""
        if not 0 <= sender < self.num_clients:
            return "unknown_sender", f"sender {sender}"
        if sender not in self.neighbours:
            return "not_neighbour", f"sender {sender}"
        if round_ is not None and self.senders_at is not None and self._round <= round_ <= self._round + self.window:
            if sender not in self.senders_at(round_):
                return "not_neighbour", f"sender {sender} in round {round_}"
        return None

    # -- the verdict on a round and sender ---------------------------------------------------
    def _outcome(self, sender: int, round_: int) -> str | None:
        """Why a message of ``sender`` for ``round_`` cannot be kept now, or None (lock held)."""
        # Only a message in the window is a sign of life (module notes); the client re-arms a
        # neighbour for a late one at most once per absence (see the client's intake).
        outside = window_outcome(round_, self._round, self.window)
        if outside is not None:
            return outside
        if self.senders_at is not None and sender not in self.senders_at(round_):
            # Checked here, under the lock, for every message buffered: the round may
            # have moved on since the sender was screened.
            return "not_neighbour"
        if sender in self._buffer.get(round_, ()) or sender in self._closed.get(round_, ()) or (round_, sender) in self._pending:
            return "duplicate"
        if round_ not in self._closed and self._held() >= self.capacity:
            return "inbox_full"
        return None

    def _held(self) -> int:
        """Received models held now: kept, or being received into a buffer (lock held)."""
        return sum(len(m) for m in self._buffer.values()) + sum(1 for s in self._pending.values() if s.buffer is not None)

    def held(self) -> int:
        with self._cond:
            return self._held()

    def room_for(self, round_: int) -> bool:
        """Whether a large message for ``round_`` is to be read now (see
        :meth:`~dfedrw.peer.transport.intake.ModelIntake.has_room`): one for this round or
        an earlier one always, one for a later round while the inbox holds fewer models than
        this round has senders."""
        return round_ <= self._round or self.held() < len(self.rows_at(self._round))

    def settle(self, outcome: str | None, sender: int, round_: int) -> tuple[bool, str]:
        """Count a message that :meth:`reserve` (or :meth:`offer`) judged: None accepted, else
        what the outcome says (a stale one is dropped, the others rejected)."""
        if outcome is None:
            return True, ""
        if outcome == "stale":
            return self.drop_stale(sender, round_)
        if outcome == "future":
            return self.reject("future_round", f"round {round_} > {self._round}+{self.window} from {sender}")
        if outcome == "not_neighbour":
            return self.reject("not_neighbour", f"sender {sender} in round {round_}")
        if outcome == "duplicate":
            return self.reject("duplicate", f"second round-{round_} message from {sender}")
        return self.reject("inbox_full", f"round-{round_} message from {sender}: {self.capacity} models held already")

    def _keep(self, msg: ModelMessage) -> None:
        """Count ``msg`` in and keep it, unless its round is closed (lock held)."""
        closed = self._closed.get(msg.round)
        if closed is not None:
            closed.add(msg.sender)
        else:
            self._buffer.setdefault(msg.round, {})[msg.sender] = msg
        self.bytes_received += msg.nbytes
        self.accepted += 1
        self._gone.discard(msg.sender)
        self._wake_if_complete()

    # -- whole messages -----------------------------------------------------------------------
    def offer(self, msg: ModelMessage) -> tuple[bool, str]:
        """Buffer ``msg`` if it is acceptable; returns (accepted, reason)."""
        refused = self.screen(msg.sender)
        if refused is not None:
            return refused
        with self._cond:
            outcome = self._outcome(msg.sender, msg.round)
            if outcome is None:
                self._keep(msg)
        return self.settle(outcome, msg.sender, msg.round)

    def drop_stale(self, sender: int, round_: int) -> tuple[bool, str]:
        """Count a message for a round already passed: late, not malicious, so dropped and counted
        apart from the rejections. Also for messages buffered beside the inbox (a colluders' pool
        store), so that every message a client receives ends in one of its counters."""
        with self._cond:
            self.stale += 1
        self.quiet_log.log(logging.INFO, "stale_round", "client %d dropped a stale round-%d message from %d", self.own_id, round_, sender)
        return False, "stale_round"

    def count_received(self, nbytes: int) -> None:
        """Count the bytes of a message accepted beside the inbox (a colluders' pool)."""
        with self._cond:
            self.bytes_received += nbytes
            self.accepted += 1

    # -- messages in chunks ---------------------------------------------------------------------
    def reserve(self, sender: int, round_: int) -> Slot | str:
        """A place for the message of ``sender`` for ``round_`` whose header just arrived, with
        the buffer its payload goes into (a row of the round's matrix when the sender has one),
        or why it cannot be kept (an outcome for :meth:`settle`, not counted yet: the message
        may fail a check first). Give the slot back with :meth:`fill` or :meth:`release`."""
        with self._cond:
            outcome = self._outcome(sender, round_)
            if outcome is not None:
                return outcome
            slot = Slot(sender, round_, None if round_ in self._closed else self._buffer_for(sender, round_))
            self._pending[(round_, sender)] = slot
            return slot

    def _buffer_for(self, sender: int, round_: int) -> torch.Tensor:
        matrix = self._matrices.get(round_)
        if matrix is None:
            rows = self.rows_at(round_)
            # Pages of rows nobody writes are never touched: a missing sender costs nothing.
            matrix = (torch.empty(1 + len(rows), self.model_size, dtype=torch.float32), {k: 1 + i for i, k in enumerate(rows)})
            self._matrices[round_] = matrix
        row = matrix[1].get(sender)
        return matrix[0][row] if row is not None else torch.empty(self.model_size, dtype=torch.float32)

    def fill(self, slot: Slot, msg: ModelMessage) -> tuple[bool, str]:
        """The message of ``slot`` arrived whole and passed its checks: keep it (its round may
        have passed meanwhile: then it is stale)."""
        with self._cond:
            self._pending.pop((slot.round, slot.sender), None)
            outcome = "stale" if msg.round < self._round else None
            if outcome is None:
                self._keep(msg)
        return self.settle(outcome, msg.sender, msg.round)

    def release(self, slot: Slot) -> None:
        """The message of ``slot`` failed a check: its place and buffer are let go."""
        with self._cond:
            self._pending.pop((slot.round, slot.sender), None)
            slot.buffer = None

    def stacked(self, round_: int, vectors: Sequence[torch.Tensor], own: torch.Tensor | None = None) -> torch.Tensor:
        """``torch.stack([own, *vectors])`` (``vectors`` alone when ``own`` is None), made in place
        of the round's matrix when ``vectors`` are its rows in id order (else stacked anew). Moving
        rows up over a missing sender's closes the round (:meth:`close`: its messages' vectors are
        not to be read any more), and messages still arriving for it let go of their rows first."""
        with self._cond:
            matrix = self._matrices.get(round_)
            rows = matrix[0] if matrix is not None else None
            at = {rows[i].data_ptr(): i for i in range(1, len(rows))} if rows is not None and rows.shape[1] else {}
            positions = [at.get(v.data_ptr()) if tuple(v.shape) == (self.model_size,) else None for v in vectors]
            if not vectors or None in positions or positions != sorted(set(positions)):
                rows = None
            elif positions != list(range(1, 1 + len(vectors))):
                self._close(round_)
                for slot in [s for s in self._pending.values() if s.round == round_]:
                    slot.release()
                for i, p in enumerate(positions, start=1):
                    if p != i:  # rows move up only: a row is moved before another is moved onto it
                        rows[i].copy_(rows[p])
        if rows is None:
            return torch.stack([own, *vectors] if own is not None else list(vectors))
        if own is None:
            return rows[1 : 1 + len(vectors)]
        rows[0].copy_(own)
        return rows[: 1 + len(vectors)]

    def close(self, round_: int) -> None:
        """The client is done with ``round_``: its models are let go now (a message that comes
        for it later is counted as before, and not kept)."""
        with self._cond:
            self._close(round_)

    def _close(self, round_: int) -> None:
        self._closed.setdefault(round_, set()).update(self._buffer.pop(round_, {}))
        self._matrices.pop(round_, None)

    def _arrived(self, round_: int) -> dict[int, ModelMessage]:
        return self._buffer.get(round_, {})

    def advance(self, round_: int) -> None:
        """Move to ``round_``: older buffered rounds are dropped (they are stale now), and
        messages still arriving for them let go of their buffers."""
        with self._cond:
            self._round = round_
            for table in (self._buffer, self._matrices, self._closed):
                for r in [r for r in table if r < round_]:
                    del table[r]
            for slot in self._pending.values():
                if slot.round < round_ and slot.buffer is not None:
                    slot.release()
