"""Unit tests for the other baseline rules (peer.aggregation.flame, .robust, .qfdfl): Flame, BALANCE, q-FDFL,
accuracy above the mean, centered clipping.

Every expected value is worked out by hand in the comments next to it.
"""

from __future__ import annotations

import math

import pytest
import torch

from dfedrw.peer.aggregation import QFDFL, AccuracyAboveMean, Balance, Flame, RoundInputs, build_rule
from tests.support.rules import NAN, assert_model, assert_weights, inputs_for

# ---------------------------------------------------------------- Flame

FLAME_REFERENCE = [1.0, -1.0, 0.0, 2.0]
FLAME_DIRECTION = torch.tensor([0.5, 0.5, 0.5, 0.5])  # unit vector


def flame_inputs(scales, round_=0, reference=FLAME_REFERENCE):
    rows = [(torch.tensor(FLAME_REFERENCE) + s * FLAME_DIRECTION).tolist() for s in scales]
    ids = (50, *range(1, len(scales)))
    return inputs_for(rows, own_id=50, ids=ids, round_=round_, reference=reference)


def test_flame_rejects_opposite_updates_and_clips_to_median_norm():
    # Prepare: six updates along +d with norms 1..6, two along -d with norms 10 and 12.
    # Cosine distances: 0 within each group, 2 across; min_cluster_size = 8 // 2 + 1 = 5, so
    # only the six form a cluster. Norms sorted 1 2 3 4 5 6 10 12 -> S_t = (4 + 5)/2 = 4.5;
    # accepted norms clipped 1 2 3 4 4.5 4.5 -> mean update = 19/6 along d = 19/12 per coord.
    inputs = flame_inputs([1, 2, 3, 4, 5, 6, -10, -12])

    # Execute
    result = Flame(noise=0.0)(inputs)

    # Assert
    assert_model(result, [1 + 19 / 12, -1 + 19 / 12, 19 / 12, 2 + 19 / 12], atol=1e-5)
    expected = {sender: 1 / 6 for sender in (50, 1, 2, 3, 4, 5)} | {6: 0.0, 7: 0.0}
    assert_weights(result, expected)


def test_flame_clusters_models_or_updates():
    # Prepare: own start-of-round model (10, 0); two neighbours at (10, 1) and (10, -1), two
    # at (-10, 1) and (-10, 2) (sign-flipped). Updates from the own model: (0, 1), (0, -1),
    # (-20, 1), (-20, 2). The own row (10, 0) is also a candidate, its update 0.
    rows = [[10, 0], [10, 1], [10, -1], [-10, 1], [-10, 2]]
    inputs = inputs_for(rows, own_id=0, ids=(0, 1, 2, 3, 4), reference=[10, 0])

    # Execute
    by_model = Flame(noise=0.0, cluster_on="models", min_cluster_size=3)(inputs)
    by_update = Flame(noise=0.0, cluster_on="updates", min_cluster_size=3)(inputs)

    # Assert: by model, the three near (10, 0) are one cluster (cosine distance < 0.01) and the
    # two near (-10, .) another, farther than 1.9 from them. By update, (0, 1) and (0, -1)
    # are opposite and the zero update is orthogonal to all, while the two sign-flipped
    # updates point alike: they are the one cluster left.
    assert_weights(by_model, {0: 1 / 3, 1: 1 / 3, 2: 1 / 3, 3: 0.0, 4: 0.0})
    assert by_update.weights[3] > 0 and by_update.weights[4] > 0


def test_flame_noise_is_seeded_by_client_and_round():
    # Prepare: 4 000 coordinates so the noise's spread can be measured
    dim = 4000
    generator = torch.Generator().manual_seed(0)
    reference = torch.zeros(dim)
    updates = torch.ones(3, dim) + 0.01 * torch.randn(3, dim, generator=generator)
    inputs = RoundInputs(0, 4, (0, 1, 2), updates, (0, 0, 0), reference=reference)
    later = RoundInputs(0, 5, (0, 1, 2), updates, (0, 0, 0), reference=reference)
    rule, silent = Flame(noise=0.1, seed=3), Flame(noise=0.0)

    # Execute
    first, again, other = rule(inputs), rule(inputs), rule(later)
    noiseless = silent(inputs)

    # Assert: same stream for the same (seed, client, round), a new one next round, and a
    # spread of noise * S_t with S_t = median norm ~ sqrt(dim)
    assert torch.equal(first.model, again.model)
    assert not torch.equal(first.model, other.model)
    spread = float((first.model - noiseless.model).std())
    median_norm = float(torch.linalg.vector_norm(updates, dim=1).median())
    assert spread == pytest.approx(0.1 * median_norm, rel=0.05)


def test_flame_without_reference_measures_from_own_model_and_skips_small_sets():
    # Prepare: two candidates only (no clustering); the own row is the reference, so its
    # update is 0 and the neighbour's is (4, 0). Norms 0 and 4 -> S_t = 2: clipped to (2, 0).
    inputs = inputs_for([[1, 1], [5, 1]])

    # Execute
    result = Flame(noise=0.0)(inputs)

    # Assert: (1, 1) + mean((0, 0), (2, 0)) = (2, 1)
    assert_model(result, [2, 1])
    assert_weights(result, {7: 0.5, 100: 0.5})


# ---------------------------------------------------------------- Balance

# own (3, 4): ||own|| = 5. Distances: (3, 0) -> 4, (0, 0) -> 5, (10, 4) -> 7.
BALANCE_ROWS = [[3, 4], [3, 0], [0, 0], [10, 4]]


@pytest.mark.parametrize(("round_", "total_rounds"), [(0, 10), (5, 0)])
def test_balance_accepts_within_radius(round_, total_rounds):
    # Prepare: gamma = 1 -> radius 5 * exp(-t/T) = 5 at t = 0, and also when T = 0 (unknown)
    inputs = inputs_for(BALANCE_ROWS, round_=round_, total_rounds=total_rounds)

    # Execute
    result = Balance(gamma=1.0, kappa=1.0, alpha=0.1)(inputs)

    # Assert: (3, 0) and (0, 0) accepted (5 <= 5 included) ->
    # 0.1 * (3, 4) + 0.9 * (1.5, 0) = (1.65, 0.4)
    assert_model(result, [1.65, 0.4])
    assert_weights(result, {7: 0.1, 100: 0.45, 101: 0.45, 102: 0.0})


def test_balance_radius_shrinks_with_rounds():
    # Prepare: t/T = 0.5 -> radius 5 * exp(-0.5) = 3.03 < 4: nobody accepted
    inputs = inputs_for(BALANCE_ROWS, round_=5, total_rounds=10)

    # Execute
    result = Balance(gamma=1.0)(inputs)

    # Assert
    assert_model(result, [3, 4])
    assert_weights(result, {7: 1.0, 100: 0.0, 101: 0.0, 102: 0.0})


# ---------------------------------------------------------------- q-FDFL


def test_qfdfl_with_q_zero_is_the_mean_of_candidates_with_a_declared_loss():
    # Prepare: q = 0 -> h_j = L, c_j = L / (n L) = 1/n whatever the losses and lr;
    # the third candidate declared no loss and is dropped
    inputs = inputs_for([[1, 0], [3, 0], [100, 100]], losses=[2.0, 5.0, NAN],
                        reference=[0, 0])

    # Execute
    result = QFDFL(q=0.0, lr=0.3)(inputs)

    # Assert
    assert_model(result, [2, 0])
    assert_weights(result, {7: 0.5, 100: 0.5, 101: 0.0})


def test_qfdfl_hand_computed_q_one():
    # Prepare: q = 1, lr = 1 (L = 1), reference (0, 0).
    # own (1, 0), F = 1: dw = (-1, 0), h = 1 * 1 + 1 = 2;  Delta = (-1, 0)
    # nbr (0, 2), F = 4: dw = (0, -2), h = 1 * 4 + 4 = 8;  Delta = (0, -8)
    # new = 0 - (-1, -8) / 10 = (0.1, 0.8); c = (1/10, 4/10), remainder 0.5 -> own
    inputs = inputs_for([[1, 0], [0, 2]], losses=[1.0, 4.0], reference=[0, 0])

    # Execute
    result = QFDFL(q=1.0, lr=1.0)(inputs)

    # Assert
    assert_model(result, [0.1, 0.8])
    assert_weights(result, {7: 0.6, 100: 0.4})


@pytest.mark.parametrize("claimed, q", [(1e300, 2.0), (1e-300, 1000.0)], ids=["power-overflows", "power-vanishes"])
def test_qfdfl_keeps_its_own_model_when_a_claimed_loss_breaks_the_step(claimed, q):
    # Prepare: a neighbour claims a loss whose q-th power overflows (1e600) or whose power
    # and curvature vanish (1e-12 ** 1000 = 0, the only candidate): sum h is not a positive
    # finite number, so no step is defined
    inputs = inputs_for([[1, 0], [3, 0]], losses=[NAN, claimed], reference=[0, 0])

    # Execute
    result = QFDFL(q=q, lr=0.5)(inputs)

    # Assert: the own model, finite, all the weight on it
    assert_model(result, [1, 0])
    assert_weights(result, {7: 1.0, 100: 0.0})


def test_qfdfl_needs_reference_and_declared_losses():
    with pytest.raises(ValueError, match="reference is None"):
        QFDFL()(inputs_for([[1.0]], losses=[1.0]))
    with pytest.raises(ValueError, match="declared_losses is None"):
        QFDFL()(inputs_for([[1.0]], reference=[0.0]))


# ---------------------------------------------------------------- AccuracyAboveMean


def test_accuracy_above_mean_hand_computed():
    # Prepare: accuracies 0.25 (own), 0.875, 0.5, 0.625 -> mean 0.5625:
    # keep own (always), 0.875 and 0.625
    inputs = inputs_for([[0, 0.25], [1, 0.875], [2, 0.5], [3, 0.625]])

    # Execute
    result = AccuracyAboveMean()(inputs)

    # Assert: mean of rows 0, 1, 3
    assert_model(result, [4 / 3, 1.75 / 3])
    assert_weights(result, {7: 1 / 3, 100: 1 / 3, 101: 0.0, 102: 1 / 3})
    assert result.scores == {7: 0.25, 100: 0.875, 101: 0.5, 102: 0.625}


def test_accuracy_above_mean_keeps_ties_and_skips_non_finite_rows():
    # Prepare: accuracies 0.5, 0.25, 0.75, 0.5 and a NaN row that is never evaluated;
    # mean 0.5 -> the neighbour at exactly 0.5 is kept
    inputs = inputs_for([[0, 0.5], [0, 0.25], [0, 0.75], [0, 0.5], [NAN, 1.0]])

    # Execute
    result = AccuracyAboveMean()(inputs)

    # Assert
    assert_weights(result, {7: 1 / 3, 100: 0.0, 101: 1 / 3, 102: 1 / 3, 103: 0.0})
    assert math.isnan(result.scores[103])


def test_accuracy_above_mean_needs_evaluate():
    with pytest.raises(ValueError, match="evaluate is None"):
        AccuracyAboveMean()(inputs_for([[1.0]], evaluate=None))


# ---------------------------------------------------------------- centered clipping


def test_centered_clipping_hand_computed():
    from dfedrw.peer.aggregation.baselines import CenteredClipping

    # Prepare: own (0, 0), neighbours (3, 4) at distance 5 and (0, 1) at distance 1; tau = 2,
    # one iteration from v = own: shares s = (1, 2/5, 1), C = 3,
    # v = (1/3) * (0 + 0.4 * (3, 4) + (0, 1)) = (0.4, 2.6/3);
    # coefficients: own 1 - 2.4/3 + 1/3 = 8/15, (3, 4): 0.4/3 = 2/15, (0, 1): 1/3.
    inputs = inputs_for([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]])

    # Execute
    result = CenteredClipping(tau=2.0, iterations=1)(inputs)

    # Assert
    assert result.model.tolist() == pytest.approx([0.4, 2.6 / 3], abs=1e-6)
    assert result.weights == pytest.approx({7: 8 / 15, 100: 2 / 15, 101: 1 / 3}, abs=1e-12)
    # A tau beyond every distance is the plain mean after one step.
    mean = CenteredClipping(tau=100.0, iterations=1)(inputs)
    assert mean.weights == pytest.approx({7: 1 / 3, 100: 1 / 3, 101: 1 / 3}, abs=1e-12)
    # A far Byzantine model moves the centre by at most tau / C per iteration.
    far = CenteredClipping(tau=1.0, iterations=2)(inputs_for([[0.0, 0.0], [1e6, 0.0], [0.0, 0.0]]))
    assert float(torch.linalg.vector_norm(far.model)) <= 2 * 1.0 / 3 + 1e-6
    # A NaN row gets no weight; a non-finite own model is kept.
    nan = CenteredClipping()(inputs_for([[0.0, 0.0], [NAN, 1.0], [0.0, 3.0]]))
    assert nan.weights[100] == 0.0 and sum(nan.weights.values()) == pytest.approx(1.0)
    assert CenteredClipping()(inputs_for([[NAN, 0.0], [1.0, 1.0]])).weights == {7: 1.0, 100: 0.0}
    assert build_rule("centered_clipping", rule_params={"tau": 2, "iterations": 1}) == CenteredClipping(2.0, 1)


@pytest.mark.parametrize("params, message", [({"tau": 0}, "tau must be > 0"), ({"tau": NAN}, "tau must be finite"),
                                              ({"iterations": 0}, "iterations must be >= 1"),
                                              ({"iterations": 1.5}, "iterations must be an integer")])
def test_centered_clipping_refuses_bad_settings(params, message):
    from dfedrw.peer.aggregation.baselines import CenteredClipping

    with pytest.raises(ValueError, match=f"CenteredClipping: {message}"):
        CenteredClipping(**params)
