"""Helpers for the rule tests: candidates whose scores read straight off their rows, inputs
with sensible defaults, and assertions on an aggregate."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfedrw.peer.aggregation import Aggregate, RoundInputs
from dfedrw.peer.aggregation.candidates import by_id, finite_by_id, keep_own, package_aggregate

NAN = float("nan")

# What neighbours report, for the tests of the neighbourhood rule and its probe.
# Client 0's neighbours 1-5, each one's own relative loss 1.0. Reporter 1 holds the classes that
# candidate 5 fails on and reports 3.0 for it; 2-4 report 1.0 for everyone.
OWN = {j: 1.0 for j in range(1, 6)}
HONEST = {
    1: {2: 1.0, 3: 1.0, 4: 1.0, 5: 3.0},
    2: {1: 1.0, 3: 1.0, 4: 1.0, 5: 1.0},
    3: {1: 1.0, 2: 1.0, 4: 1.0, 5: 1.0},
    4: {1: 1.0, 2: 1.0, 3: 1.0, 5: 1.0},
}
FRAMING = {5: {j: 100.0 for j in range(1, 5)}}  # candidate 5 frames every honest neighbour


def column_evaluate(candidates: torch.Tensor) -> dict[str, torch.Tensor]:
    """accuracy = second coordinate, loss = first: scores readable straight off the rows."""
    return {"accuracy": candidates[:, 1].clone(), "loss": candidates[:, 0].clone()}


def inputs_for(rows, *, own_id=7, ids=None, round_=0, total_rounds=0, losses=None,
               reference=None, evaluate=column_evaluate, num_samples=None) -> RoundInputs:
    ids = ids or (own_id, *range(100, 100 + len(rows) - 1))
    return RoundInputs(
        own_id=own_id,
        round=round_,
        ids=tuple(ids),
        vectors=torch.tensor(rows, dtype=torch.float32),
        num_samples=tuple(num_samples or (0,) * len(rows)),
        evaluate=evaluate,
        total_rounds=total_rounds,
        declared_losses=None if losses is None else tuple(losses),
        reference=None if reference is None else torch.tensor(reference, dtype=torch.float32),
    )


def assert_weights(aggregate: Aggregate, expected: dict[int, float]) -> None:
    assert list(aggregate.weights) == list(expected)
    for sender, weight in expected.items():
        assert aggregate.weights[sender] == pytest.approx(weight, abs=1e-12), sender


def assert_model(aggregate: Aggregate, expected: list[float], atol: float = 1e-6) -> None:
    assert aggregate.model.dtype == torch.float32
    torch.testing.assert_close(aggregate.model, torch.tensor(expected, dtype=torch.float32),
                               atol=atol, rtol=0)


# ---------------------------------------------------------------- coordinate-wise oracles
# The median and the trimmed mean of one client, written plainly in torch (sort each coordinate,
# rank entries stably by id): what the rules' batched path (sorting networks over many clients'
# columns in numpy) must give every client, bit for bit.


def _finite_sorted(inputs: RoundInputs):
    finite = finite_by_id(inputs)
    ordered = torch.from_numpy(np.sort(finite.rows.cpu().numpy(), axis=0)) if finite.ids else finite.rows
    return finite, ordered


def _kept_by_rank(rows: torch.Tensor, ordered: torch.Tensor, low: int, high: int) -> torch.Tensor:
    """Which entries of ``rows`` a stable sort along dim 0 ranks in ``[low, high)``."""
    rank = torch.empty_like(rows, dtype=torch.long)
    for d in range(rows.shape[1]):
        rank[:, d] = torch.from_numpy(np.argsort(np.argsort(rows[:, d].numpy(), kind="stable"), kind="stable"))
    return (rank >= low) & (rank < high)


def median_of(inputs: RoundInputs) -> Aggregate:
    finite, ordered = _finite_sorted(inputs)
    count = len(finite.ids)
    if count == 0:
        return keep_own(inputs)
    low, high = ordered[(count - 1) // 2], ordered[count // 2]
    hits = ((finite.rows == low) | (finite.rows == high)).sum(dim=1).to(torch.float64)
    return package_aggregate(inputs, (low + high) / 2, by_id(finite, hits))


def trimmed_mean_of(inputs: RoundInputs, num_byzantine: int) -> Aggregate:
    finite, ordered = _finite_sorted(inputs)
    count = len(finite.ids)
    if count == 0:
        return keep_own(inputs)
    trim = num_byzantine if 2 * num_byzantine < count else (count - 1) // 2
    kept = ordered[trim : count - trim]
    shares = _kept_by_rank(finite.rows, ordered, trim, count - trim).sum(dim=1)
    return package_aggregate(inputs, kept.sum(dim=0) / kept.shape[0], by_id(finite, shares.to(torch.float64)))
