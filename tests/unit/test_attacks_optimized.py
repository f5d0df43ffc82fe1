"""Unit tests for the optimised attacks (peer.attacks.optimized): Min-Max, Min-Sum and Fang et
al.'s attacks on the trimmed mean and the median."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfedrw.peer.attacks import ATTACK_REGISTRY, AttackView, craft_round, make_attack
from dfedrw.peer.attacks.optimized import (
    FangMedian,
    FangTrimmedMean,
    MinMax,
    MinSum,
    colluder_generator,
    search_gamma,
)

TAU = 1e-5


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def view_of(models, *, receivers=(0, 1), reference=None, round=1, colluders=(), pool=None, attacker=9):
    received = torch.tensor(models, dtype=torch.float32).reshape(len(models), -1) if len(models) else torch.empty(0, 2)
    senders = tuple(range(len(models)))
    pool_senders = tuple(range(len(pool))) if pool is not None else ()
    return AttackView(
        round=round, attacker=attacker, receivers=receivers, senders=senders, received=received,
        colluders=colluders, pool_senders=pool_senders,
        pool=None if pool is None else torch.tensor(pool, dtype=torch.float32),
        reference=None if reference is None else torch.tensor(reference, dtype=torch.float64),
    )


# The triangle (0,0), (2,0), (0,2): mean (2/3, 2/3); sample std per coordinate
# sqrt(((2/3)^2 + (4/3)^2 + (2/3)^2) / 2) = sqrt(4/3) = 2/sqrt(3).
TRIANGLE = [[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]]
C = 2 / math.sqrt(3)


# ---------------------------------------------------------------- the search


def test_search_finds_the_largest_accepted_scale_within_tau():
    # Execute
    gamma = search_gamma(lambda g: g <= 1.0, 50.0, TAU)

    # Assert: an accepted value, within 2 tau below the boundary (the last step is tau or less)
    assert 1.0 - 2 * TAU <= gamma <= 1.0


def test_search_returns_zero_when_nothing_fits_and_stays_below_twice_gamma_init():
    assert search_gamma(lambda g: False, 50.0, TAU) == 0.0
    everything = search_gamma(lambda g: True, 50.0, TAU)
    assert 100.0 - 2 * TAU <= everything < 100.0


# ---------------------------------------------------------------- Min-Max / Min-Sum by hand


def test_min_max_std_hand_computed():
    # Prepare: p = -(C, C); message = (2/3 - t, 2/3 - t) with t = C gamma. The farthest benign
    # model is (2,0) (or (0,2)): (4/3 + t)^2 + (2/3 - t)^2 = 20/9 + 4t/3 + 2t^2 <= (2 sqrt 2)^2 = 8
    # -> 9t^2 + 6t - 26 = 0 -> t = (-6 + sqrt(972)) / 18.
    t = (-6 + math.sqrt(972)) / 18
    expected_gamma = t / C  # ~= 1.21132

    # Execute
    crafted = craft_round(MinMax(), view_of(TRIANGLE), seeded())

    # Assert
    gamma = crafted.note["gamma"]
    assert expected_gamma - 2 * TAU <= gamma <= expected_gamma
    assert crafted.note == {"gamma": gamma, "perturbation": "std", "relative_to": "zero"}
    expected = torch.tensor([2 / 3 - C * gamma] * 2, dtype=torch.float32)
    assert torch.allclose(crafted.messages[0], expected, atol=1e-6)
    assert torch.equal(crafted.messages[0], crafted.messages[1])


def test_min_sum_std_hand_computed():
    # Prepare: sum_i ||m - b_i||^2 = 3 ||m - mean||^2 + sum_i ||b_i - mean||^2 = 3 (2 t^2) + 16/3;
    # bound: max_i sum_j ||b_i - b_j||^2 = max(4 + 4, 4 + 8, 4 + 8) = 12
    # -> 6 t^2 = 20/3 -> t = sqrt(10) / 3.
    expected_gamma = (math.sqrt(10) / 3) / C  # ~= 0.91287

    # Execute
    crafted = craft_round(MinSum(), view_of(TRIANGLE), seeded())

    # Assert
    gamma = crafted.note["gamma"]
    assert expected_gamma - 2 * TAU <= gamma <= expected_gamma
    assert torch.allclose(crafted.messages[1], torch.tensor([2 / 3 - C * gamma] * 2), atol=1e-6)


def test_min_sum_min_bound_hand_computed():
    # Prepare: as above with the released code's bound, min_i sum_j ||b_i - b_j||^2 = 8 (at the
    # origin): 6 t^2 + 16/3 <= 8 -> t = 2/3.
    expected_gamma = (2 / 3) / C  # ~= 0.57735

    # Execute
    crafted = craft_round(MinSum(bound="min"), view_of(TRIANGLE), seeded())

    # Assert: a smaller step than the paper's bound gives (0.91287)
    gamma = crafted.note["gamma"]
    assert expected_gamma - 2 * TAU <= gamma <= expected_gamma
    assert torch.allclose(crafted.messages[0], torch.tensor([2 / 3 - C * gamma] * 2), atol=1e-6)


def test_min_sum_bound_is_a_setting_of_the_scenario():
    from dfedrw.peer.config.scenario import load_scenario

    scenario = load_scenario(None, ["attack.name=min_sum", "attack.min_sum.bound=min"])

    assert scenario.attack.params() == {"bound": "min"}
    with pytest.raises(ValueError, match=r"attack.min_sum.bound='mean': MinSum: bound must be one of \['max', 'min'\]"):
        load_scenario(None, ["attack.name=min_sum", "attack.min_sum.bound=mean"])


def test_min_max_unit_vector_reverses_the_update_from_the_reference():
    # Prepare: models (1,1), (3,1), last round's mean (0,1): update u = (2,1) - (0,1) = (2,0),
    # p = (-1, 0); message (2 - g, 1) is |1 - g| and 1 + g from the models; 1 + g <= 2 -> g = 1.
    view = view_of([[1.0, 1.0], [3.0, 1.0]], reference=[0.0, 1.0])

    # Execute
    crafted = craft_round(MinMax(perturbation="unit_vector"), view, seeded())

    # Assert
    assert 1.0 - 2 * TAU <= crafted.note["gamma"] <= 1.0
    assert crafted.note["relative_to"] == "reference"
    assert torch.allclose(crafted.messages[0], torch.tensor([1.0, 1.0]), atol=1e-4)


def test_min_max_unit_vector_relative_to_zero_reverses_the_mean():
    # Prepare: same models, u = mean = (2,1), p = -(2,1)/sqrt(5). The far model is (3,1):
    # ||(-1,0) + g p||^2 = 1 + 4g/sqrt(5) + g^2 <= 4 -> g = (-4/sqrt(5) + sqrt(16/5 + 12)) / 2.
    expected_gamma = (-4 / math.sqrt(5) + math.sqrt(16 / 5 + 12)) / 2  # ~= 1.05493
    view = view_of([[1.0, 1.0], [3.0, 1.0]], reference=[0.0, 1.0])

    # Execute
    crafted = craft_round(MinMax(perturbation="unit_vector", relative_to="zero"), view, seeded())

    # Assert
    assert expected_gamma - 2 * TAU <= crafted.note["gamma"] <= expected_gamma
    assert crafted.note["relative_to"] == "zero"


def test_first_round_without_reference_measures_the_update_from_zero():
    # Prepare: models (0,0), (2,0), no reference: u = (1,0), sign -> p = (-1, 0);
    # message (1 - g, 0): max(|1 - g|, 1 + g) <= 2 -> g = 1, message (0, 0).
    view = view_of([[0.0, 0.0], [2.0, 0.0]], round=0)

    # Execute
    crafted = craft_round(MinMax(perturbation="sign"), view, seeded())

    # Assert
    assert crafted.note["relative_to"] == "zero"
    assert 1.0 - 2 * TAU <= crafted.note["gamma"] <= 1.0
    assert torch.allclose(crafted.messages[0], torch.zeros(2), atol=1e-4)


@pytest.mark.parametrize("attack", [MinMax(), MinSum(), MinMax(perturbation="unit_vector"), MinSum(perturbation="sign")], ids=repr)
def test_one_known_model_is_sent_back(attack):
    # Prepare: one model has no spread: std gives p = 0, the others a bound of 0.
    view = view_of([[1.5, -2.0]], reference=[0.0, 0.0])

    # Execute
    crafted = craft_round(attack, view, seeded())

    # Assert
    assert crafted.note["gamma"] <= TAU
    assert torch.allclose(crafted.messages[0], torch.tensor([1.5, -2.0]), atol=1e-4)


@pytest.mark.parametrize("attack", [MinMax(), MinSum(), FangTrimmedMean(), FangMedian()], ids=repr)
def test_silent_when_nothing_is_known(attack):
    # Execute
    crafted = craft_round(attack, view_of([]), seeded())

    # Assert
    assert crafted.messages == {0: None, 1: None}
    json.dumps(crafted.note)


def test_colluding_attack_works_on_the_pool():
    # Prepare: it received only (0,0) and (2,0); the pool adds (0,2): the triangle.
    view = view_of([[0.0, 0.0], [2.0, 0.0]], colluders=(8, 9), pool=TRIANGLE)

    # Execute
    pooled = craft_round(MinSum(), view, seeded())
    alone = craft_round(MinSum(), view_of(TRIANGLE), seeded())

    # Assert
    assert torch.equal(pooled.messages[0], alone.messages[0])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6), st.integers(1, 12),
       st.sampled_from(["unit_vector", "std", "sign"]), st.booleans())
def test_found_gamma_meets_the_condition_and_a_slightly_larger_one_fails(seed, count, dim, perturbation, with_reference):
    # Prepare
    g = seeded(seed)
    models = torch.randn(count, dim, generator=g, dtype=torch.float64)
    reference = torch.randn(dim, generator=g, dtype=torch.float64) if with_reference else None
    view = AttackView(round=1, attacker=9, receivers=(0,), senders=tuple(range(count)), received=models.float(), reference=reference)
    benign = models.float().double()
    pairwise = torch.cdist(benign, benign)

    for attack in (MinMax(perturbation=perturbation), MinSum(perturbation=perturbation), MinSum(perturbation=perturbation, bound="min")):
        # Execute
        crafted = attack.plan(view, seeded())
        gamma = crafted.note["gamma"]
        message = crafted.messages[0].double()
        direction = (message - benign.mean(dim=0)) / gamma if gamma > 0 else None

        # Assert: the message (float32) meets the condition up to its rounding ...
        distances = torch.linalg.vector_norm(message - benign, dim=1)
        sums = pairwise.pow(2).sum(dim=1)
        bound = float(sums.min() if getattr(attack, "bound", "max") == "min" else sums.max())
        if isinstance(attack, MinSum):
            assert float(distances.pow(2).sum()) <= bound * (1 + 1e-5) + 1e-6
        else:
            assert float(distances.max()) <= float(pairwise.max()) * (1 + 1e-5) + 1e-6
        # ... and the search stopped within tau of the boundary (a search that never left
        # gamma = 0 has no direction to test).
        if direction is not None and gamma < 2 * attack.gamma_init - 1e-3:
            beyond = benign.mean(dim=0) + (gamma + 4 * TAU) * direction
            far = torch.linalg.vector_norm(beyond - benign, dim=1)
            if isinstance(attack, MinSum):
                assert float(far.pow(2).sum()) > bound * (1 - 1e-6)
            else:
                assert float(far.max()) > float(pairwise.max()) * (1 - 1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"perturbation": "gradient"}, "perturbation must be one of"),
        ({"relative_to": "origin"}, "relative_to must be one of"),
        ({"gamma_init": 0.0}, "gamma_init must be > 0"),
        ({"gamma_init": True}, "gamma_init must be a real number"),
        ({"tau": -1e-5}, "tau must be > 0"),
        ({"tau": float("nan")}, "tau must be finite"),
    ],
)
@pytest.mark.parametrize("cls", [MinMax, MinSum])
def test_min_max_min_sum_refuse_bad_settings(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


def test_min_sum_refuses_a_bound_it_does_not_know_and_min_max_has_none():
    with pytest.raises(ValueError, match=r"MinSum: bound must be one of \['max', 'min'\], got 'mean'"):
        MinSum(bound="mean")
    with pytest.raises(TypeError):
        MinMax(bound="min")


# ---------------------------------------------------------------- Fang et al.


def test_fang_hand_computed_intervals_and_draw():
    # Prepare: models (1,-2), (3,-4), reference (0,0): mean (2,-3), s = (+1, -1).
    # Coordinate 0 moves up: beyond the minimum, w_min = 1 > 0 -> [1/2, 1].
    # Coordinate 1 moves down: beyond the maximum, w_max = -2 <= 0 -> [-2, -2/2] = [-2, -1].
    view = view_of([[1.0, -2.0], [3.0, -4.0]], receivers=(0,), reference=[0.0, 0.0])
    u = torch.rand(2, generator=seeded(5), dtype=torch.float64)
    expected = torch.stack([0.5 + u[0] * 0.5, -2.0 + u[1] * 1.0]).float()

    # Execute
    crafted = craft_round(FangTrimmedMean(), view, seeded(5))

    # Assert
    assert torch.equal(crafted.messages[0], expected)
    assert crafted.note == {"b": 2.0, "relative_to": "reference", "moving_up": 1, "moving_down": 1}


def test_fang_other_two_cases_of_the_interval():
    # Prepare: one coordinate moving down with a positive maximum: models 2, 4, reference 5
    # -> s = -1, w_max = 4 -> [4, 8]. Another moving up with a non-positive minimum: models
    # -1, -3, reference -5 -> s = +1, w_min = -3 -> [b w_min, w_min] = [-6, -3].
    view = view_of([[2.0, -1.0], [4.0, -3.0]], receivers=(0,), reference=[5.0, -5.0])
    u = torch.rand(2, generator=seeded(6), dtype=torch.float64)
    expected = torch.stack([4.0 + u[0] * 4.0, -6.0 + u[1] * 3.0]).float()

    # Execute
    crafted = craft_round(FangMedian(), view, seeded(6))

    # Assert
    assert torch.equal(crafted.messages[0], expected)


def test_fang_coordinate_that_did_not_move_gets_the_mean_and_first_round_uses_the_sign_of_the_mean():
    # Prepare: coordinate 0 equals the reference (s = 0); without a reference s = sign(mean).
    still = view_of([[1.0, 1.0], [3.0, 1.0]], receivers=(0,), reference=[2.0, 0.0])
    first = view_of([[1.0, -1.0], [3.0, -3.0]], receivers=(0,), round=0)

    # Execute
    a = craft_round(FangTrimmedMean(), still, seeded()).messages[0]
    b = craft_round(FangTrimmedMean(), first, seeded()).messages[0]

    # Assert: a[0] is the mean 2; coordinate 1 moved up (1 > 0): within [1/2, 1].
    assert a[0] == 2.0 and 0.5 <= a[1] <= 1.0
    # mean (2, -2): s = (+1, -1): b[0] in [1/2, 1]; b[1]: w_max = -1 -> [-1, -1/2].
    assert 0.5 <= b[0] <= 1.0 and -1.0 <= b[1] <= -0.5


def test_fang_draws_afresh_for_each_receiver_and_replays_from_the_seed():
    # Prepare
    view = view_of(TRIANGLE, receivers=(0, 1, 2), reference=[1.0, 1.0])

    # Execute
    first = craft_round(FangTrimmedMean(), view, seeded(3))
    again = craft_round(FangTrimmedMean(), view, seeded(3))

    # Assert
    assert not torch.equal(first.messages[0], first.messages[1])
    assert all(torch.equal(first.messages[k], again.messages[k]) for k in (0, 1, 2))


def test_fang_median_is_the_trimmed_mean_construction():
    view = view_of(TRIANGLE, receivers=(0, 1), reference=[1.0, 0.0])
    a = craft_round(FangTrimmedMean(b=3.0), view, seeded(4))
    b = craft_round(FangMedian(b=3.0), view, seeded(4))
    assert all(torch.equal(a.messages[k], b.messages[k]) for k in (0, 1))


def test_fang_colluders_draw_independently_from_the_shared_round_generator():
    # Prepare: two colluders, the same pool, the same round generator seed, a shared receiver.
    pool = TRIANGLE
    eight = view_of(TRIANGLE, receivers=(0,), colluders=(8, 9), pool=pool, attacker=8, reference=[1.0, 1.0])
    nine = view_of(TRIANGLE, receivers=(0,), colluders=(8, 9), pool=pool, attacker=9, reference=[1.0, 1.0])

    # Execute
    from_eight = craft_round(FangTrimmedMean(), eight, seeded(7)).messages[0]
    from_nine = craft_round(FangTrimmedMean(), nine, seeded(7)).messages[0]
    nine_again = craft_round(FangTrimmedMean(), nine, seeded(7)).messages[0]

    # Assert
    assert not torch.equal(from_eight, from_nine)
    assert torch.equal(from_nine, nine_again)


def test_colluder_generator_is_the_given_one_when_alone():
    generator = seeded(1)
    assert colluder_generator(view_of(TRIANGLE), generator) is generator


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(1, 20), st.floats(1.1, 5.0))
def test_fang_values_lie_beyond_the_benign_extreme_opposite_the_move(seed, count, dim, b):
    # Prepare
    g = seeded(seed)
    models = torch.randn(count, dim, generator=g)
    reference = torch.randn(dim, generator=g, dtype=torch.float64)
    view = AttackView(round=1, attacker=9, receivers=(0, 1), senders=tuple(range(count)), received=models, reference=reference)
    benign = models.double()
    s = torch.sign(benign.mean(dim=0) - reference)
    high, low = benign.max(dim=0).values, benign.min(dim=0).values

    # Execute
    crafted = craft_round(FangTrimmedMean(b=b), view, seeded(seed + 1))

    # Assert: at or beyond the maximum where the models move down, at or below the minimum
    # where they move up, and never farther than b times (or 1/b of) that extreme.
    for message in crafted.messages.values():
        m = message.double()
        slack = 1e-6 * (1 + high.abs().max())
        down, up = s < 0, s > 0
        assert bool((m[down] >= high[down] - slack).all())
        assert bool((m[up] <= low[up] + slack).all())
        far_high = torch.maximum(b * high, high / b)
        far_low = torch.minimum(low / b, b * low)
        assert bool((m[down] <= far_high[down] + slack).all())
        assert bool((m[up] >= far_low[up] - slack).all())


@pytest.mark.parametrize("b, message", [(1.0, "b must be > 1"), (0.5, "b must be > 1"), (-2.0, "b must be > 0"), (float("inf"), "b must be finite")])
@pytest.mark.parametrize("cls", [FangTrimmedMean, FangMedian])
def test_fang_refuses_bad_b(cls, b, message):
    with pytest.raises(ValueError, match=message):
        cls(b=b)


# ---------------------------------------------------------------- registry


def test_registered_names_build_the_classes_and_declare_their_threat_models():
    assert isinstance(make_attack("min_max", perturbation="sign"), MinMax)
    assert isinstance(make_attack("min_sum"), MinSum)
    assert make_attack("fang_trimmed_mean", b=2.5) == FangTrimmedMean(b=2.5)
    assert isinstance(make_attack("fang_median"), FangMedian)
    for name in ("min_max", "min_sum"):
        assert not ATTACK_REGISTRY[name].threat_model.tailored
    for name in ("fang_trimmed_mean", "fang_median"):
        assert ATTACK_REGISTRY[name].threat_model.tailored


def test_the_next_reference_is_the_known_mean_for_a_per_round_attack_and_none_for_a_per_receiver_one():
    # Prepare: two known models, their float64 mean (1, 2)
    from dfedrw.peer.round.byzantine import next_reference
    from dfedrw.peer.attacks import make_attack

    view = view_of([[0.0, 1.0], [2.0, 3.0]])
    per_round, per_receiver = make_attack("min_max"), make_attack("sign_flip")

    # Execute
    planned, called = next_reference(per_round, view), next_reference(per_receiver, view)

    # Assert: only the attack whose plan reads the view gets the mean; the other is never shown it
    assert hasattr(per_round, "plan") and not hasattr(per_receiver, "plan")
    assert planned.dtype == torch.float64 and planned.tolist() == [1.0, 2.0]
    assert called is None
