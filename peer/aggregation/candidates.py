"""What the baseline rules share (see :mod:`peer.aggregation.baselines` for the conventions): a
client's finite candidates in increasing id order as float64 rows, and an aggregate packaged
with every id's weight."""

from __future__ import annotations
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
import torch
from dfedrw.peer.aggregation.rules import Aggregate, RoundBatch, RoundInputs


@dataclass(frozen=True)
class FiniteCandidates:
    """The finite candidates in increasing id order, as rows on the input device (float64 unless
    :func:`finite_by_id` was asked for another dtype)."""

    ids: tuple[int, ...]
    rows: torch.Tensor
    # Index of the client's own model in ``rows``; None when the own row is non-finite.
    own: int | None
    # Index of each finite candidate in ``inputs`` (to line up per-row side data).
    positions: tuple[int, ...]


def finite_by_id(inputs: RoundInputs, dtype: torch.dtype = torch.float64) -> FiniteCandidates:
    """``inputs``' finite candidates in increasing id order, their rows as ``dtype``."""
    finite = inputs.finite_list()
    positions = tuple(
        sorted((i for i, ok in enumerate(finite) if ok), key=lambda i: inputs.ids[i])
    )
    index = torch.tensor(positions, dtype=torch.long, device=inputs.vectors.device)
    rows = inputs.vectors.index_select(0, index).to(dtype)
    ids = tuple(inputs.ids[i] for i in positions)
    own = ids.index(inputs.own_id) if inputs.own_id in ids else None
    return FiniteCandidates(ids=ids, rows=rows, own=own, positions=positions)


@dataclass(frozen=True)
class PooledOrder:
    """Client ``c``'s finite candidates of a :class:`RoundBatch` in increasing id order, as
    :func:`finite_by_id` orders them for ``batch.one(c)``, without their rows: ``ids``,
    ``positions`` and ``own`` as in :class:`FiniteCandidates`, ``pooled`` the pooled row of each."""

    ids: tuple[int, ...]
    positions: tuple[int, ...]
    pooled: tuple[int, ...]
    own: int | None


def pooled_order(batch: RoundBatch, c: int, finite: Sequence[bool]) -> PooledOrder:
    """Client ``c``'s :class:`PooledOrder`; ``finite``: per pooled row."""
    rows, ids = batch.rows[c], batch.ids[c]
    positions = tuple(sorted((i for i, row in enumerate(rows) if finite[row]), key=lambda i: ids[i]))
    chosen = tuple(ids[i] for i in positions)
    own = chosen.index(ids[0]) if ids[0] in chosen else None
    return PooledOrder(ids=chosen, positions=positions, pooled=tuple(rows[i] for i in positions), own=own)


def pooled_finite(batch: RoundBatch, c: int, finite: Sequence[bool], order: PooledOrder | None = None) -> FiniteCandidates:
    """Client ``c``'s finite candidates in id order, as :func:`finite_by_id` gives them for
    ``batch.one(c)`` (the same values in the same [F, D] shape); ``finite``: per pooled row;
    ``order``: client ``c``'s :class:`PooledOrder` when the caller has it."""
    order = pooled_order(batch, c, finite) if order is None else order
    index = torch.tensor(order.pooled, dtype=torch.long, device=batch.vectors.device)
    rows = batch.vectors.index_select(0, index).to(torch.float64)
    return FiniteCandidates(ids=order.ids, rows=rows, own=order.own, positions=order.positions)


def package_aggregate(
    inputs: RoundInputs,
    model: torch.Tensor,
    weights: Mapping[int, float],
    scores: Mapping[int, float] | None = None,
) -> Aggregate:
    """Package a float64 model and per-id weights (normalised, every id listed)."""
    return package_for(inputs.ids, model, weights, scores)


def package_for(
    ids: Sequence[int],
    model: torch.Tensor,
    weights: Mapping[int, float],
    scores: Mapping[int, float] | None = None,
) -> Aggregate:
    """:func:`package_aggregate` for the client whose candidates are sent by ``ids`` (its own
    id first), as a batched path has them."""
    total = math.fsum(weights.values())
    if not total > 0:
        # Only reachable with zero-length models (no coordinate to count): nothing was chosen.
        weights, total = {ids[0]: 1.0}, 1.0
    return Aggregate(
        model=model.to(torch.float32),
        weights={sender: weights.get(sender, 0.0) / total for sender in ids},
        scores=None
        if scores is None
        else {sender: scores.get(sender, math.nan) for sender in ids},
    )


def keep_own_pooled(batch: RoundBatch, c: int) -> Aggregate:
    """:func:`keep_own` for client ``c`` of ``batch``."""
    return package_for(batch.ids[c], batch.vectors[batch.rows[c][0]].to(torch.float64), {batch.ids[c][0]: 1.0})


def keep_own(inputs: RoundInputs, scores: Mapping[int, float] | None = None) -> Aggregate:
    return package_aggregate(inputs, inputs.vectors[0].to(torch.float64), {inputs.own_id: 1.0}, scores)


def combine_rows(finite: FiniteCandidates, coefficients: torch.Tensor) -> torch.Tensor:
    """``sum_i c_i w_i`` over the finite rows (float64 [D]); ``coefficients`` is CPU [F]."""
    return coefficients.to(device=finite.rows.device, dtype=torch.float64) @ finite.rows


def by_id(finite: FiniteCandidates, values: torch.Tensor) -> dict[int, float]:
    return dict(zip(finite.ids, values.tolist()))
