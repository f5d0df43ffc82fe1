"""Unit tests for norm bounding (peer.aggregation.norm_bound): hand-computed clipping, DFedAvg
when nothing is clipped, the seeded noise, non-finite rows, settings, and ``batched`` giving
each client what its own call gives, bit for bit. Expected values are worked out in the
comments beside them."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfedrw.peer.aggregation import RULE_REGISTRY, ClippedGossip, DFedAvg, NormBound, RoundBatch
from tests.support.rules import NAN, assert_model, assert_weights, inputs_for

# Own (1, 1); neighbour 100 at (4, 5): difference (3, 4), norm 5; neighbour 101 at (1, 1.5):
# difference (0, 0.5), norm 0.5.
PLANE = [[1.0, 1.0], [4.0, 5.0], [1.0, 1.5]]


def same_bits(left: torch.Tensor, right: torch.Tensor) -> bool:
    return left.dtype == right.dtype and torch.equal(left.view(torch.int32), right.view(torch.int32))


# ---------------------------------------------------------------- hand-computed


def test_a_difference_of_norm_five_is_clipped_to_the_bound():
    # Prepare: uniform weights 1/3; bound 1 clips (3, 4) to (0.6, 0.8), leaves (0, 0.5) whole
    inputs = inputs_for(PLANE)

    # Execute
    result = NormBound(bound=1.0, weighting="uniform")(inputs)

    # Assert: (1, 1) + ((0.6, 0.8) + (0, 0.5)) / 3 = (1.2, 1 + 1.3/3); coefficients
    # 100: (1/5) / 3 = 1/15, 101: 1/3, own 1 - 1/15 - 1/3 = 3/5
    assert_model(result, [1.2, 1.0 + 1.3 / 3])
    assert_weights(result, {7: 0.6, 100: 1 / 15, 101: 1 / 3})
    assert result.scores is None


def test_the_clipped_differences_are_weighted_by_declared_data_size():
    # Prepare: sizes own 2, 100: 1, 101: 1 -> v = (1/2, 1/4, 1/4)
    inputs = inputs_for(PLANE, num_samples=[2, 1, 1])

    # Execute
    result = NormBound(bound=1.0)(inputs)

    # Assert: (1, 1) + ((0.6, 0.8) + (0, 0.5)) / 4 = (1.15, 1.325); coefficients
    # 100: (1/5) / 4 = 0.05, 101: 1/4, own 1 - 0.3 = 0.7
    assert_model(result, [1.15, 1.325])
    assert_weights(result, {7: 0.7, 100: 0.05, 101: 0.25})


def test_a_bound_at_the_distance_leaves_the_neighbour_whole():
    # Prepare: bound 5 = ||(3, 4)||: nothing clipped, the plain mean of the three
    result = NormBound(bound=5.0, weighting="uniform")(inputs_for(PLANE))

    # Assert: ((1, 1) + (4, 5) + (1, 1.5)) / 3 = (2, 2.5)
    assert_model(result, [2.0, 2.5])
    assert_weights(result, {7: 1 / 3, 100: 1 / 3, 101: 1 / 3})


def test_with_uniform_weights_it_is_clipped_gossip_with_that_radius_bit_for_bit():
    # Prepare
    inputs = inputs_for([[0, 0], [3, 4], [0, 1], [6, 8], [1, 0]])

    # Execute
    bounded = NormBound(bound=1.0, weighting="uniform")(inputs)
    gossip = ClippedGossip(0, radius="fixed", tau=1.0)(inputs)

    # Assert
    assert same_bits(bounded.model, gossip.model)
    assert bounded.weights == gossip.weights


# ---------------------------------------------------------------- a bound nothing reaches is DFedAvg


@pytest.mark.parametrize("weighting", ["data_size", "uniform"])
@pytest.mark.parametrize("sizes", [[5, 1, 3, 0, 7], [0, 0, 0, 0, 0]], ids=["sized", "no-sizes"])
@pytest.mark.parametrize("broken", [None, 2], ids=["finite", "nan-row"])
def test_a_huge_bound_gives_dfedavg(weighting, sizes, broken):
    # Prepare: the own row and four neighbours, in an id order that is not the row order
    vectors = torch.randn(5, 6, generator=torch.Generator().manual_seed(1)) * 10
    if broken is not None:
        vectors[broken, 3] = NAN
    inputs = inputs_for(vectors.tolist(), ids=[7, 104, 100, 103, 101], num_samples=sizes)

    # Execute
    bounded = NormBound(bound=1e12, weighting=weighting)(inputs)
    average = DFedAvg(weighting)(inputs)

    # Assert: the same model up to float rounding, the same weight per sender
    torch.testing.assert_close(bounded.model, average.model, rtol=0, atol=1e-5)
    assert list(bounded.weights) == list(average.weights)
    for sender, weight in average.weights.items():
        assert bounded.weights[sender] == pytest.approx(weight, abs=1e-12), sender


# ---------------------------------------------------------------- noise


def big_inputs(**kwargs):
    vectors = torch.randn(4, 4000, generator=torch.Generator().manual_seed(2))
    return inputs_for(vectors.tolist(), num_samples=[1, 2, 3, 4], **kwargs)


def test_no_noise_is_deterministic():
    # Execute
    first, second = NormBound(bound=10.0)(big_inputs()), NormBound(bound=10.0, seed=9)(big_inputs())

    # Assert: the seed draws nothing without noise
    assert same_bits(first.model, second.model)
    assert first.weights == second.weights


def test_noise_replays_with_its_seed_and_differs_with_another():
    # Prepare
    plain = NormBound(bound=10.0)(big_inputs())

    # Execute
    noisy = NormBound(bound=10.0, noise=0.01, seed=3)(big_inputs())
    again = NormBound(bound=10.0, noise=0.01, seed=3)(big_inputs())
    other_seed = NormBound(bound=10.0, noise=0.01, seed=4)(big_inputs())
    other_round = NormBound(bound=10.0, noise=0.01, seed=3)(big_inputs(round_=1))
    other_client = NormBound(bound=10.0, noise=0.01, seed=3)(big_inputs(own_id=8))

    # Assert: the same draw again; another for another seed, round or client
    assert same_bits(noisy.model, again.model)
    for different in (other_seed, other_round, other_client):
        assert not torch.equal(noisy.model, different.model)
    # N(0, 0.01^2) per coordinate on top of the noiseless model (4000 draws: std within 5 %),
    # the reported weights those of the noiseless combination
    drawn = (noisy.model.double() - plain.model.double())
    assert abs(float(drawn.std()) - 0.01) < 0.0005 and abs(float(drawn.mean())) < 0.001
    assert noisy.weights == plain.weights


# ---------------------------------------------------------------- non-finite rows


def test_a_non_finite_candidate_gets_weight_zero():
    # Prepare: neighbours 100 (NaN) and 102 (Inf) beside the plane's two
    inputs = inputs_for([[1.0, 1.0], [NAN, 0.0], [4.0, 5.0], [1.0, math.inf], [1.0, 1.5]])

    # Execute
    result = NormBound(bound=1.0, weighting="uniform", noise=0.1)(inputs)

    # Assert: the finite ones as in the plane (C = 3), plus noise: finite, near (1.2, 1.433)
    assert result.weights[100] == 0.0 and result.weights[102] == 0.0
    assert result.weights[101] == pytest.approx(1 / 15) and result.weights[103] == pytest.approx(1 / 3)
    assert bool(torch.isfinite(result.model).all())


def test_a_non_finite_own_model_is_kept_without_noise():
    # Execute
    result = NormBound(noise=0.1)(inputs_for([[NAN, 1.0], [2.0, 2.0], [3.0, 3.0]]))

    # Assert
    assert_weights(result, {7: 1.0, 100: 0.0, 101: 0.0})
    assert math.isnan(float(result.model[0])) and float(result.model[1]) == 1.0


def test_one_candidate_is_kept():
    result = NormBound()(inputs_for([[1.5, 0.25]]))

    assert result.weights == {7: 1.0}
    assert_model(result, [1.5, 0.25])


# ---------------------------------------------------------------- settings and registry


def test_registered_with_the_seed_the_run_supplies():
    # Execute
    rule = RULE_REGISTRY.build("norm_bound", {"bound": 2, "noise": 0.001}, {"seed": 11, "num_byzantine": 1})

    # Assert
    assert rule == NormBound(bound=2.0, noise=0.001, seed=11) and isinstance(rule.bound, float)
    assert [s.name for s in RULE_REGISTRY.settings("norm_bound")] == ["bound", "noise", "weighting"]
    assert RULE_REGISTRY.supplied("norm_bound") == ["seed"]
    with pytest.raises(ValueError, match="set by the running system"):
        RULE_REGISTRY.build("norm_bound", {"seed": 1}, {"seed": 11})


@pytest.mark.parametrize(
    ("settings_", "message"),
    [
        ({"bound": 0.0}, r"NormBound: bound must be > 0, got 0.0"),
        ({"bound": -1}, r"NormBound: bound must be > 0, got -1"),
        ({"bound": math.inf}, r"NormBound: bound must be finite, got inf"),
        ({"bound": "1"}, r"NormBound: bound must be a real number, got '1'"),
        ({"noise": -0.1}, r"NormBound: noise must be >= 0, got -0.1"),
        ({"noise": NAN}, r"NormBound: noise must be finite, got nan"),
        ({"weighting": "median"}, r"NormBound: weighting must be one of \['data_size', 'uniform'\], got 'median'"),
        ({"seed": 1.5}, r"NormBound: seed must be an integer, got 1.5"),
    ],
)
def test_bad_settings_are_refused(settings_, message):
    with pytest.raises(ValueError, match=message):
        NormBound(**settings_)


# ---------------------------------------------------------------- batched


def random_batch(data) -> RoundBatch:
    """A pool of models (own models first, a NaN row and exact copies possible), each client
    with its own row and a random set of others, ids that are not the pool order, sizes drawn."""
    clients = data.draw(st.integers(1, 5), label="clients")
    pool = clients + data.draw(st.integers(0, 6), label="extra rows")
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    vectors = torch.randn(pool, 5, generator=generator) * data.draw(st.sampled_from([0.1, 1.0, 10.0]), label="scale")
    if data.draw(st.booleans(), label="nan row"):
        vectors[data.draw(st.integers(0, pool - 1), label="which nan")] = NAN
    if pool > 1 and data.draw(st.booleans(), label="a copy"):
        vectors[pool - 1] = vectors[0]
    id_of = data.draw(st.permutations(range(200, 200 + pool)), label="ids")
    rows, ids, sizes = [], [], []
    for c in range(clients):
        others = data.draw(st.lists(st.sampled_from([r for r in range(pool) if r != c]), unique=True, max_size=pool - 1)
                           if pool > 1 else st.just([]), label=f"rows of {c}")
        rows.append((c, *others))
        ids.append(tuple(id_of[r] for r in rows[-1]))
        sizes.append(tuple(data.draw(st.lists(st.integers(0, 9), min_size=len(rows[-1]), max_size=len(rows[-1])), label=f"sizes of {c}")))
    return RoundBatch(round=data.draw(st.integers(0, 9), label="round"), vectors=vectors, rows=tuple(rows), ids=tuple(ids), num_samples=tuple(sizes))


@settings(max_examples=80, deadline=None)
@given(data=st.data(), bound=st.sampled_from([0.3, 1.0, 1e12]), noise=st.sampled_from([0.0, 0.01]),
       weighting=st.sampled_from(["data_size", "uniform"]))
def test_batched_gives_each_client_exactly_what_its_own_call_gives(data, bound, noise, weighting):
    # Prepare: one rule per client, differing only in the seed (one batch group)
    batch = random_batch(data)
    rules = tuple(NormBound(bound, noise, weighting, seed=data.draw(st.integers(0, 3), label=f"seed of {c}")) for c in range(len(batch)))
    assert len({rule.batch_group() for rule in rules}) == 1

    # Execute
    shared = rules[0].batched(batch)
    own_rules = rules[0].batched(dataclasses.replace(batch, rules=rules))

    # Assert: the model's bits and the weights, in order
    for c in range(len(batch)):
        for together, rule in ((shared[c], rules[0]), (own_rules[c], rules[c])):
            alone = rule(batch.one(c))
            assert torch.equal(together.model.view(torch.int32), alone.model.view(torch.int32)), c
            assert list(together.weights.items()) == list(alone.weights.items()), c
