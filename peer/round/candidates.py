"""What a client aggregates in a round, assembled once for every engine: its own model first,
then each neighbour's model it holds (in the order the caller gives, senders ascending), each
with the training-set size and loss its sender declared and, under asynchronous gossip, how
many steps old it is; and the neighbours whose model it expected and does not hold.

The engines differ only in what a candidate *is*: a client process holds the vector itself
(:meth:`ClientCandidates.inputs` stacks them into :class:`RoundInputs`), the batched engine a row
of the round's pool (its ``Candidates`` pools every client's rows into one :class:`RoundBatch`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from dfedrw.peer.aggregation.inputs import RoundInputs


class Offer(NamedTuple):
    """One candidate a client holds: who sent it, what the engine stacks (``model``: a vector, or
    the row of a pool), the training-set size and loss its sender declared (as the receiver takes
    them), how many of the receiver's steps ago it came (0 under the round protocol), and the
    scores its sender reported with it (``network.share_scores``: id -> score; None: none). A
    named tuple: the batched engine makes one per client and neighbour every round, and a frozen
    dataclass's construction cost 5 % of a run of 3,000 small rounds."""

    sender: int
    model: Any
    size: int
    loss: float
    staleness: int = 0
    reports: Mapping[int, float] | None = None


@dataclass(slots=True)
class ClientCandidates:
    """A client's candidates in a round, its own first (``ids[0]`` is the client); made by
    :func:`assemble` and not changed after."""

    ids: tuple[int, ...]
    models: tuple[Any, ...]
    sizes: tuple[int, ...]
    losses: tuple[float, ...]
    staleness: tuple[int, ...]
    reports: tuple[Mapping[int, float] | None, ...]
    missing: list[int]
    # What the client's rule kept of its last aggregation (RoundInputs.memory).
    memory: Mapping[int, float] | None = None

    @property
    def senders(self) -> tuple[int, ...]:
        """The neighbours whose models it holds."""
        return self.ids[1:]

    def inputs(
        self, r: int, vectors: torch.Tensor, *, evaluate: Any, total_rounds: int, reference: torch.Tensor | None,
        finite: Sequence[bool] | None, gossip: bool = False,
    ) -> RoundInputs:
        """The rule's inputs, ``vectors`` being the candidates stacked in order (a client process:
        :meth:`stack`, or the round's matrix the models were read into); ``gossip``: the
        candidates' staleness goes with them (asynchronous gossip)."""
        return RoundInputs(
            own_id=self.ids[0], round=r, ids=self.ids, vectors=vectors, num_samples=self.sizes, evaluate=evaluate,
            total_rounds=total_rounds, declared_losses=self.losses, reference=reference,
            finite=None if finite is None else tuple(finite), staleness=self.staleness if gossip else None, reports=self.reports,
            memory=self.memory,
        )

    def stack(self) -> torch.Tensor:
        """The candidates' vectors as one ``[C, D]`` tensor (where each ``model`` is a vector)."""
        return torch.stack(self.models)


def assemble(
    own: Offer, held: Iterable[Offer], expected: Iterable[int], missing: list[int] | None = None, *, memory: Mapping[int, float] | None = None,
) -> ClientCandidates:
    """Client ``own.sender``'s candidates: ``own``, then ``held`` in the order given. ``missing``:
    the neighbours in ``expected`` whose model it does not hold (ascending), unless the caller
    knows them otherwise (a simulated link that lost the model in time). ``memory``: what its
    rule kept of its last aggregation (``Aggregate.memory``)."""
    ids, models, sizes, losses, staleness, reports = zip(own, *held)  # one pass: the fields as columns
    if missing is None:
        missing = sorted(set(expected).difference(ids))
    return ClientCandidates(ids, models, sizes, losses, staleness, reports, missing, memory)
