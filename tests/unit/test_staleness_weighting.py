"""The staleness weighting rules offer under asynchronous gossip: each weight times
(1 + s)^-a, normalised again (hand computed), the same in a rule's batched path, and nothing
changed without staleness or with a = 0."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dfedrw.peer.aggregation import DFedAvg, DFedReweighting, Loss, LossClippedAtMean, RoundBatch, build_rule
from dfedrw.peer.aggregation.inputs import staleness_factors
from tests.support.rules import column_evaluate, inputs_for


def weights(agg):
    return list(agg.weights.values())


def test_factors_are_polynomial_in_the_staleness():
    assert staleness_factors((0, 1, 3), 1.0) == [1.0, 0.5, 0.25]
    assert staleness_factors((0, 3), 0.5) == pytest.approx([1.0, 0.5])
    assert staleness_factors((0, 3), 0.0) is None and staleness_factors(None, 1.0) is None


def test_dfedavg_weighs_stale_candidates_down_hand_computed():
    # Uniform (1, 1, 1) times (1, 1/2, 1/4): (4, 2, 1) / 7.
    rows = [[0.0, 7.0], [7.0, 0.0], [14.0, 7.0]]
    stale = dataclasses.replace(inputs_for(rows), staleness=(0, 1, 3))
    agg = DFedAvg(weighting="uniform", staleness_exponent=1.0)(stale)
    assert weights(agg) == pytest.approx([4 / 7, 2 / 7, 1 / 7])
    assert agg.model.tolist() == pytest.approx([(0 + 14 + 14) / 7, (28 + 0 + 7) / 7])
    # a = 0, or no staleness known: the weights of the round protocol, to the bit.
    plain = DFedAvg(weighting="uniform")(inputs_for(rows))
    assert torch.equal(DFedAvg(weighting="uniform")(stale).model, plain.model)
    assert torch.equal(DFedAvg(weighting="uniform", staleness_exponent=1.0)(inputs_for(rows)).model, plain.model)


def test_dfedreweighting_weighs_the_crs_weights_by_staleness_hand_computed():
    # Losses (1, 2, 3, 10), mean 4: the CRS gives (1, 2, 3, 0) / 6; staleness (0, 0, 1, 0) at
    # a = 1 halves the third: (1, 2, 1.5, 0) / 4.5.
    rule = DFedReweighting(Loss(), LossClippedAtMean(), staleness_exponent=1.0)
    inputs = dataclasses.replace(inputs_for([[1, 5], [2, 6], [3, 7], [10, 8]]), staleness=(0, 0, 1, 0))
    agg = rule(inputs)
    assert weights(agg) == pytest.approx([1 / 4.5, 2 / 4.5, 1.5 / 4.5, 0.0])
    assert agg.model.tolist() == pytest.approx([(1 + 4 + 4.5) / 4.5, (5 + 12 + 10.5) / 4.5])
    assert agg.scores == {7: 1.0, 100: 2.0, 101: 3.0, 102: 10.0}  # scores are the TPM's, unweighted


@pytest.mark.parametrize("name, settings", [("dfedavg", {"staleness_exponent": 0.5}), ("dfedreweighting", {"staleness_exponent": 2.0})])
def test_the_batched_path_weighs_as_one_client_does(name, settings):
    rule = build_rule(name, "loss", "loss_clip_mean", rule_params=settings) if name == "dfedreweighting" else build_rule(name, rule_params=settings)
    pool = torch.tensor([[1.0, 5.0], [2.0, 6.0], [3.0, 7.0], [4.0, 1.0]])
    batch = RoundBatch(
        round=3, vectors=pool, rows=((0, 1, 2), (1, 3, 0)), ids=((7, 8, 9), (8, 10, 7)), num_samples=((5, 6, 7), (6, 2, 5)),
        evaluate=(column_evaluate, column_evaluate), staleness=((0, 2, 5), (0, 1, 4)),
    )
    together = rule.batched(batch)
    for c in range(len(batch)):
        alone = rule(batch.one(c))
        assert alone.weights == pytest.approx(together[c].weights) and torch.allclose(alone.model, together[c].model)
    assert batch.select([1]).one(0).staleness == (0, 1, 4)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), True])
def test_a_staleness_exponent_that_is_not_a_finite_number_at_least_0_is_refused(bad):
    with pytest.raises(ValueError, match="staleness_exponent"):
        DFedAvg(staleness_exponent=bad)


def test_staleness_must_match_the_candidates():
    with pytest.raises(ValueError, match="staleness has 2 entries"):
        dataclasses.replace(inputs_for([[1, 2], [3, 4], [5, 6]]), staleness=(0, 1))
    with pytest.raises(ValueError, match="staleness"):
        dataclasses.replace(inputs_for([[1, 2], [3, 4]]), staleness=(0, -1))
