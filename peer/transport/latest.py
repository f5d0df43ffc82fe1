"""The receive side of asynchronous gossip (``network.protocol = "async"``): the newest model of
each neighbour, kept until a newer one replaces it.

No rounds to wait for: a message is labelled with its sender's local step, and the receiver
keeps, per neighbour, the one with the highest label so far. One below it is stale (overtaken on
the way), one equal to it a ``duplicate``, one past the run's last step refused as
``future_round``; otherwise the checks, reasons and counters are the round inbox's
(:class:`~dfedrw.peer.transport.inbox.Inbox`) and the intake's. A held model remembers the
receiver's local step it arrived in: the receiver measures each candidate's staleness itself
(:meth:`LatestInbox.held_models`), the label being the sender's word.

A message whose header was taken is received into a buffer of its own (not a row of a round's
matrix: a step's candidates are the newest held models, whenever they came), so the inbox holds
at most two models per neighbour (the one held, the one arriving) and a large message is always
read at once."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from dfedrw.peer.transport.inbox import Inbox, Slot
from dfedrw.peer.transport.serde import ModelMessage


@dataclass(frozen=True)
class Held:
    """A neighbour's newest model and the receiver's local step it arrived in."""

    message: ModelMessage
    arrived_step: int


def fresh_enough(staleness: int, max_staleness: int) -> bool:
    """Whether a model ``staleness`` of its receiver's steps old is still a candidate under
    ``network.max_staleness`` (0: any is), in a client process and in the batched engine."""
    return not max_staleness or staleness <= max_staleness


class LatestInbox(Inbox):
    """The newest model of each of ``neighbours`` (see the module); ``last_step``: the highest
    label a message may carry (the run's last step); ``model_size``: a model's float32 values."""

    def __init__(self, own_id: int, neighbours: Iterable[int], num_clients: int, *, last_step: int, model_size: int = 0, log_interval: float = 10.0) -> None:
        neighbours = frozenset(neighbours)
        super().__init__(own_id, neighbours, num_clients, 0, log_interval=log_interval, model_size=model_size, capacity=2 * len(neighbours))
        self.last_step = last_step
        self._step = 0  # the receiver's own local step
        self._latest: dict[int, Held] = {}
        self._versions = 0  # messages kept so far: a waiter's mark of what it has seen

    @property
    def round(self) -> int:
        """No round of this client's moves on (0); a reply names the label held of its sender
        instead (:meth:`told`)."""
        return 0

    def told(self, sender: int | None) -> int:
        """The label of ``sender``'s model held here (0: none): a reply names it, so that the
        sender drops what it has queued of older steps, and a sender that restarted from an
        older step sends nothing until its steps pass it (nothing older is news here)."""
        with self._cond:
            held = self._latest.get(sender) if sender is not None else None
        return held.message.round if held is not None else 0

    @property
    def step(self) -> int:
        return self._step

    def _outcome(self, sender: int, round_: int) -> str | None:
        if round_ > self.last_step or round_ < 0:
            return "future"
        held = self._latest.get(sender)
        taken = [s.round for s in self._pending.values() if s.sender == sender]  # arriving now
        newest = max([*taken, held.message.round if held is not None else -1])
        if round_ == newest:
            return "duplicate"
        if round_ < newest:
            return "stale"
        if self._held() >= self.capacity:
            return "inbox_full"
        return None

    def settle(self, outcome: str | None, sender: int, round_: int) -> tuple[bool, str]:
        if outcome == "future":
            return self.reject("future_round", f"step {round_} past the last step {self.last_step} from {sender}")
        return super().settle(outcome, sender, round_)

    def _held(self) -> int:
        return len(self._latest) + sum(1 for s in self._pending.values() if s.buffer is not None)

    def reserve(self, sender: int, round_: int) -> Slot | str:
        with self._cond:
            outcome = self._outcome(sender, round_)
            if outcome is not None:
                return outcome
            slot = Slot(sender, round_, torch.empty(self.model_size, dtype=torch.float32))
            self._pending[(round_, sender)] = slot
            return slot

    def fill(self, slot: Slot, msg: ModelMessage) -> tuple[bool, str]:
        with self._cond:
            self._pending.pop((slot.round, slot.sender), None)
            held = self._latest.get(msg.sender)
            outcome = "stale" if held is not None and held.message.round >= msg.round else None
            if outcome is None:
                self._keep(msg)
        return self.settle(outcome, msg.sender, msg.round)

    def _keep(self, msg: ModelMessage) -> None:
        self._latest[msg.sender] = Held(msg, self._step)
        self.bytes_received += msg.nbytes
        self.accepted += 1
        self._versions += 1
        self._gone.discard(msg.sender)
        self._cond.notify_all()

    def room_for(self, round_: int) -> bool:
        return True

    def advance(self, step: int) -> None:
        """The receiver is at its local step ``step`` now (what :meth:`held_models` measures
        staleness from); nothing held is let go."""
        with self._cond:
            self._step = step

    def close(self, round_: int) -> None:
        """Nothing to let go: a held model stays until a newer one replaces it."""

    def held_models(self, max_staleness: int = 0) -> dict[int, tuple[ModelMessage, int]]:
        """Sender -> (its newest model, how many of the receiver's local steps ago it arrived),
        those older than ``max_staleness`` steps left out (0: none left out)."""
        with self._cond:
            out = {k: (h.message, self._step - h.arrived_step) for k, h in self._latest.items()}
        return {k: v for k, v in out.items() if fresh_enough(v[1], max_staleness)}

    def forget_unfinished(self, sender: int) -> None:
        """``sender`` cannot be reached: let go of its held model unless of the run's last step
        (one that died mid-run would otherwise be aggregated, unchanged, every step until back)."""
        with self._cond:
            held = self._latest.get(sender)
            if held is not None and held.message.round < self.last_step:
                del self._latest[sender]

    def labels(self) -> dict[int, int]:
        """Sender -> the label (step) of its model held here."""
        with self._cond:
            return {k: h.message.round for k, h in self._latest.items()}

    def wait_for_step(self, senders, step: int, timeout: float) -> bool:
        """Block until a model labelled ``step`` or later is held of each of ``senders``, or
        ``timeout`` seconds; whether they all came."""
        return not self.wait_for_labels(dict.fromkeys(senders, step), timeout)

    def wait_for_labels(self, labels: dict[int, int], timeout: float) -> set[int]:
        """Block until a model labelled ``labels[k]`` or later is held of each sender ``k``, or
        ``timeout`` seconds; the senders whose model did not come."""
        deadline = time.monotonic() + timeout

        def missing() -> set[int]:
            return {k for k, label in labels.items() if k not in self._latest or self._latest[k].message.round < label}

        with self._cond:
            while (left := missing()) and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(remaining)
            return left

    def versions(self) -> int:
        """How many messages were kept so far (a mark for :meth:`wait_news`)."""
        with self._cond:
            return self._versions

    def wait_news(self, seen: int, timeout: float) -> int:
        """Block until a message beyond the first ``seen`` was kept, or ``timeout`` seconds;
        returns the count kept by then."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._versions <= seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._versions

    def stacked(self, round_: int, vectors, own: torch.Tensor | None = None) -> torch.Tensor:
        return torch.stack([own, *vectors] if own is not None else list(vectors))


