"""Unit tests for the customized reweighting strategies (peer.aggregation.crs).

Expected values are computed by hand in the comments; property tests check the invariants
every CRS shares (non-negative, sums to 1, NaN never weighted, permutation equivariant).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfedrw.peer.aggregation.crs import (
    CRS_REGISTRY,
    AccuracyClippedAtMean,
    Clip,
    LossClippedAtMean,
    LossClippedAtMedian,
    LossDropHighest,
    Proportional,
    Rank,
    Softmax,
    apply_crs_contract,
    make_crs,
)

NAN = float("nan")
INF = float("inf")

ALL_CRS = [
    Softmax(temperature=0.1, scale=1.0),
    Softmax(temperature=10.0, scale=100.0),
    Softmax(temperature=0.5, scale=-1.0),
    LossClippedAtMean(),
    LossClippedAtMean("inverse"),
    LossClippedAtMean("uniform"),
    LossClippedAtMedian(),
    LossClippedAtMedian("proportional", margin=0.2),
    LossClippedAtMedian("uniform"),
    LossDropHighest(),
    LossDropHighest(2),
    LossDropHighest(1, "inverse"),
    AccuracyClippedAtMean(),
    Proportional(),
    Clip(threshold=2.0),
    Rank(),
    Rank(prefer="high"),
]
CRS_IDS = [repr(c) for c in ALL_CRS]


def scores(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def assert_weights(actual: torch.Tensor, expected: list[float], tol: float = 1e-12) -> None:
    assert actual.dtype == torch.float64
    assert actual.shape == (len(expected),)
    wanted = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(actual, wanted, atol=tol, rtol=0)


# ---------------------------------------------------------------- hand-computed cases


def test_softmax_two_accuracies():
    # Prepare: exp(0.8/0.1) : exp(0.9/0.1) = 1 : e
    crs = Softmax(temperature=0.1, scale=1.0)
    e = math.e

    # Execute
    weights = crs(scores(0.8, 0.9))

    # Assert
    assert_weights(weights, [1 / (1 + e), e / (1 + e)])


def test_softmax_percent_scale_matches_fraction():
    # Prepare: 100 * 0.1 / 10 = 1, the same exponent gap as T = 0.1 on fractions
    crs = Softmax(temperature=10.0, scale=100.0)
    e = math.e

    # Execute
    weights = crs(scores(0.8, 0.9))

    # Assert
    assert_weights(weights, [1 / (1 + e), e / (1 + e)])


def test_softmax_is_stable_for_huge_scores():
    # Prepare: exp(1000) overflows, but the gap ln 3 gives weights 1/4 and 3/4
    crs = Softmax(temperature=1.0, scale=1.0)

    # Execute
    weights = crs(scores(1000.0, 1000.0 + math.log(3.0)))

    # Assert
    assert_weights(weights, [0.25, 0.75])


def test_softmax_negative_scale_prefers_low_scores():
    # Prepare: scale -1, T 1 on losses [0, ln 2]: exp(0) : exp(-ln 2) = 1 : 1/2 -> 2/3, 1/3
    crs = Softmax(temperature=1.0, scale=-1.0)

    # Execute
    weights = crs(scores(0.0, math.log(2.0)))

    # Assert
    assert_weights(weights, [2 / 3, 1 / 3])


def test_softmax_tiny_temperature_is_argmax():
    # Prepare: factor = 1 / 1e-310 = inf -> every score below the max gets exp(-inf) = 0
    crs = Softmax(temperature=1e-310, scale=1.0)

    # Execute
    weights = crs(scores(0.5, 0.9, 0.9))

    # Assert
    assert_weights(weights, [0.0, 0.5, 0.5])


@pytest.mark.parametrize(
    ("weighting", "expected"),
    [
        # mean(1, 2, 3, 10) = 4 -> 10 clipped; kept [1, 2, 3]
        ("proportional", [1 / 6, 2 / 6, 3 / 6, 0.0]),  # m_i / 6
        ("inverse", [6 / 11, 3 / 11, 2 / 11, 0.0]),  # (1, 1/2, 1/3) / (11/6)
        ("uniform", [1 / 3, 1 / 3, 1 / 3, 0.0]),
    ],
)
def test_loss_clipped_at_mean(weighting, expected):
    # Prepare
    crs = LossClippedAtMean(weighting)

    # Execute
    weights = crs(scores(1.0, 2.0, 3.0, 10.0))

    # Assert
    assert_weights(weights, expected)


def test_loss_clip_keeps_score_equal_to_mean():
    # Prepare: mean(1, 2, 3) = 2, and 2 <= mean is kept -> (1, 2) / 3
    crs = LossClippedAtMean()

    # Execute
    weights = crs(scores(1.0, 2.0, 3.0))

    # Assert
    assert_weights(weights, [1 / 3, 2 / 3, 0.0])


def test_loss_clip_inverse_zero_losses_share_the_weight():
    # Prepare: mean(0, 0, 2, 10) = 3 -> kept [0, 0, 2]; zero losses take everything
    crs = LossClippedAtMean("inverse")

    # Execute
    weights = crs(scores(0.0, 0.0, 2.0, 10.0))

    # Assert
    assert_weights(weights, [0.5, 0.5, 0.0, 0.0])


def test_loss_clip_proportional_zero_kept_losses_share_without_clipped():
    # Prepare: mean(0, 0, 6) = 2 -> kept [0, 0] sum to 0 -> uniform over kept, 6 stays 0
    crs = LossClippedAtMean("proportional")

    # Execute
    weights = crs(scores(0.0, 0.0, 6.0))

    # Assert
    assert_weights(weights, [0.5, 0.5, 0.0])


def test_accuracy_clipped_at_mean():
    # Prepare: mean(0.2, 0.6, 0.7) = 0.5 -> kept [0.6, 0.7] -> 6/13, 7/13
    crs = AccuracyClippedAtMean()

    # Execute
    weights = crs(scores(0.2, 0.6, 0.7))

    # Assert
    assert_weights(weights, [0.0, 6 / 13, 7 / 13])


def test_proportional_clamps_negative_scores():
    # Prepare: (1, 3, -2) -> clamp -> (1, 3, 0) / 4
    crs = Proportional()

    # Execute
    weights = crs(scores(1.0, 3.0, -2.0))

    # Assert
    assert_weights(weights, [0.25, 0.75, 0.0])


def test_clip_threshold():
    # Prepare: clip((1, 3, 0.5, -1), 0, 2) = (1, 2, 0.5, 0), sum 3.5
    crs = Clip(threshold=2.0)

    # Execute
    weights = crs(scores(1.0, 3.0, 0.5, -1.0))

    # Assert
    assert_weights(weights, [2 / 7, 4 / 7, 1 / 7, 0.0])


# ---------------------------------------------------------------- non-finite scores


def test_loss_clip_ignores_non_finite_in_mean():
    # Prepare: finite (1, 2, 3, 10): mean 4 as before; NaN/Inf must not move the threshold
    crs = LossClippedAtMean()

    # Execute
    weights = crs(scores(1.0, 2.0, NAN, INF, 3.0, 10.0, -INF))

    # Assert
    assert_weights(weights, [1 / 6, 2 / 6, 0.0, 0.0, 3 / 6, 0.0, 0.0])


def test_accuracy_clip_ignores_non_finite_in_mean():
    # Prepare: finite (0.2, 0.6, 0.7): mean 0.5 -> 6/13, 7/13
    crs = AccuracyClippedAtMean()

    # Execute
    weights = crs(scores(0.2, NAN, 0.6, INF, 0.7))

    # Assert
    assert_weights(weights, [0.0, 0.0, 6 / 13, 0.0, 7 / 13])


@pytest.mark.parametrize("crs", ALL_CRS, ids=CRS_IDS)
def test_nan_and_inf_get_exactly_zero(crs):
    # Prepare
    values = scores(0.3, NAN, 0.9, INF, -INF, 0.5)

    # Execute
    weights = crs(values)

    # Assert
    assert weights[1].item() == 0.0 and weights[3].item() == 0.0 and weights[4].item() == 0.0
    assert math.isclose(weights.sum().item(), 1.0, abs_tol=1e-12)


@pytest.mark.parametrize("crs", ALL_CRS, ids=CRS_IDS)
@pytest.mark.parametrize("values", [(NAN, NAN), (INF, -INF, NAN), ()])
def test_no_finite_score_gives_all_zeros(crs, values):
    # Prepare
    tensor = scores(*values)

    # Execute
    weights = crs(tensor)

    # Assert
    assert_weights(weights, [0.0] * len(values))


# ---------------------------------------------------------------- degenerate finite inputs


@pytest.mark.parametrize("crs", ALL_CRS, ids=CRS_IDS)
@pytest.mark.parametrize("value", [0.0, 0.1, 0.7, -3.0, 1e300])
def test_all_equal_scores_give_uniform(crs, value):
    # Prepare
    tensor = scores(value, value, value, NAN)

    # Execute
    weights = crs(tensor)

    # Assert
    assert_weights(weights, [1 / 3, 1 / 3, 1 / 3, 0.0])


@pytest.mark.parametrize("crs", ALL_CRS, ids=CRS_IDS)
@pytest.mark.parametrize("value", [0.0, 0.42, -1.0, 1e308])
def test_single_finite_candidate_gets_everything(crs, value):
    # Prepare
    one = scores(value)
    with_nan = scores(NAN, value, INF)

    # Execute
    alone = crs(one)
    among_nan = crs(with_nan)

    # Assert
    assert_weights(alone, [1.0])
    assert_weights(among_nan, [0.0, 1.0, 0.0])


@pytest.mark.parametrize(
    ("crs", "values", "expected"),
    [
        # all finite scores <= 0 -> nothing to be proportional to -> uniform over finite
        (Proportional(), (0.0, -1.0, NAN), [0.5, 0.5, 0.0]),
        (Clip(threshold=1.0), (-1.0, -2.0, NAN), [0.5, 0.5, 0.0]),
        # mean(-1, -3) = -2 -> kept [-1] -> clamped 0 -> uniform over kept
        (AccuracyClippedAtMean(), (-1.0, -3.0), [1.0, 0.0]),
    ],
)
def test_zero_total_weight_falls_back_to_uniform(crs, values, expected):
    # Prepare
    tensor = scores(*values)

    # Execute
    weights = crs(tensor)

    # Assert
    assert_weights(weights, expected)


def test_float32_input_gives_float64_weights():
    # Prepare
    values = torch.tensor([1.0, 3.0], dtype=torch.float32)

    # Execute
    weights = Proportional()(values)

    # Assert
    assert_weights(weights, [0.25, 0.75])


def test_huge_scores_do_not_overflow_normalisation():
    # Prepare: sum 1.5e308 + 1.5e308 overflows; weights are still 1/2 each
    values = scores(1.5e308, 1.5e308 * 0.5)

    # Execute
    weights = Proportional()(values)

    # Assert
    assert_weights(weights, [2 / 3, 1 / 3])


def test_scores_must_be_one_dimensional():
    # Prepare
    values = torch.ones(2, 2)

    # Execute / Assert
    with pytest.raises(ValueError, match=r"1-D.*\(2, 2\)"):
        Softmax(temperature=1.0, scale=1.0)(values)


def test_contract_helper_rejects_negative_raw_weights():
    # Prepare
    def bad(values: torch.Tensor) -> torch.Tensor:
        return -values

    # Execute / Assert
    with pytest.raises(ValueError, match="negative or non-finite"):
        apply_crs_contract(scores(1.0, 2.0), bad, owner="Bad")


# ---------------------------------------------------------------- validation and registry


@pytest.mark.parametrize("temperature", [0, -0.1, NAN, INF, True, "0.1"])
def test_softmax_rejects_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        Softmax(temperature=temperature)


def test_softmax_rejects_zero_scale():
    with pytest.raises(ValueError, match="scale"):
        Softmax(temperature=0.1, scale=0.0)


@pytest.mark.parametrize("threshold", [0.0, -1.0, NAN])
def test_clip_rejects_bad_threshold(threshold):
    with pytest.raises(ValueError, match="threshold"):
        Clip(threshold=threshold)


def test_loss_clip_rejects_unknown_weighting():
    with pytest.raises(ValueError, match=r"weighting.*proportional.*inverse.*uniform.*'median'"):
        LossClippedAtMean("median")


def test_make_crs_builds_each_registered_class():
    # Prepare
    params = {"softmax": {"temperature": 0.1}, "clip": {"threshold": 1.0}}

    # Execute
    built = {name: make_crs(name, **params.get(name, {})) for name in CRS_REGISTRY}

    # Assert
    for name, crs in built.items():
        assert type(crs) is CRS_REGISTRY[name]
    assert make_crs("loss_clip_mean", weighting="inverse") == LossClippedAtMean("inverse")


def test_make_crs_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"'softmaxx'.*acc_clip_mean.*softmax"):
        make_crs("softmaxx")


def test_make_crs_unknown_param_names_it_and_accepted():
    with pytest.raises(ValueError, match=r"no setting 'temp'; settings: temperature, scale"):
        make_crs("softmax", temp=0.1)


def test_make_crs_defaults_are_the_scenario_defaults():
    # The constructor's defaults are what a scenario gets when it sets nothing.
    assert make_crs("clip") == Clip(threshold=1.0)
    assert make_crs("softmax") == Softmax(temperature=0.1, scale=100.0)


# ---------------------------------------------------------------- property tests

SCORE = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([NAN, INF, -INF, 0.0, 0.5]),
)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(SCORE, min_size=1, max_size=8), index=st.integers(0, len(ALL_CRS) - 1))
def test_weights_are_a_distribution_and_nan_never_weighted(values, index):
    # Prepare
    crs = ALL_CRS[index]
    tensor = scores(*values)
    finite = torch.isfinite(tensor)

    # Execute
    weights = crs(tensor)

    # Assert
    assert weights.shape == tensor.shape and weights.dtype == torch.float64
    assert bool(torch.isfinite(weights).all()) and bool((weights >= 0).all())
    assert bool((weights[~finite] == 0).all())
    expected_total = 1.0 if bool(finite.any()) else 0.0
    assert math.isclose(weights.sum().item(), expected_total, abs_tol=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(SCORE, min_size=1, max_size=8),
    index=st.integers(0, len(ALL_CRS) - 1),
    data=st.data(),
)
def test_crs_is_permutation_equivariant(values, index, data):
    # Prepare
    crs = ALL_CRS[index]
    perm = data.draw(st.permutations(range(len(values))))
    if isinstance(crs, LossDropHighest):
        # It never drops the first candidate (the own model): equivariant in the others' order.
        perm = [0, *data.draw(st.permutations(range(1, len(values))))]
    tensor = scores(*values)
    permuted = tensor[list(perm)]

    # Execute
    direct = crs(tensor)
    shuffled = crs(permuted)

    # Assert
    torch.testing.assert_close(shuffled, direct[list(perm)], atol=1e-12, rtol=0)


@settings(max_examples=40, deadline=None)
@given(
    honest=st.lists(st.floats(0.1, 2.0), min_size=2, max_size=8),
    outlier=st.floats(100.0, 1e6),
)
def test_loss_clip_never_weights_a_far_outlier(honest, outlier):
    # Prepare: the outlier alone exceeds the mean of everything, so it is clipped
    tensor = scores(*honest, outlier)

    # Execute
    weights = {w: LossClippedAtMean(w)(tensor) for w in ("proportional", "inverse", "uniform")}

    # Assert
    for weight in weights.values():
        assert weight[-1].item() == 0.0


def test_rank_hand_computed():
    # Prepare: losses (0.3, 0.1, 0.2) -> ranks (2, 0, 1), C - rank = (1, 3, 2), sum 6
    crs = Rank()

    # Execute
    weights = crs(scores(0.3, 0.1, 0.2))

    # Assert
    assert_weights(weights, [1 / 6, 3 / 6, 2 / 6])
    # prefer="high" (accuracies): the same scores rank the other way round -> (3, 1, 2) / 6
    assert_weights(Rank(prefer="high")(scores(0.3, 0.1, 0.2)), [3 / 6, 1 / 6, 2 / 6])
    # Ties share their mean rank: (0.1, 0.1, 0.5) -> ranks (0.5, 0.5, 2) -> (2.5, 2.5, 1) / 6
    assert_weights(crs(scores(0.1, 0.1, 0.5)), [2.5 / 6, 2.5 / 6, 1 / 6])
    # Only the order matters; a NaN gets 0 and is not ranked: (5, NaN, 1e300) -> (2, 0, 1) / 3
    assert_weights(crs(scores(5.0, NAN, 1e300)), [2 / 3, 0.0, 1 / 3])
    assert make_crs("rank", prefer="high") == Rank("high")


@pytest.mark.parametrize("prefer", ["lowest", "", 1, None])
def test_rank_refuses_bad_preference(prefer):
    with pytest.raises(ValueError, match="Rank: prefer must be one of"):
        Rank(prefer=prefer)


# ---------------------------------------------------------------- loss clipped at the median


@pytest.mark.parametrize(
    "weighting, expected",
    [
        # Losses (1, 2, 3, 10, 100): lower median 3, kept 1, 2, 3.
        ("inverse", [6 / 11, 3 / 11, 2 / 11, 0.0, 0.0]),  # (1, 1/2, 1/3) / (11/6)
        ("uniform", [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0]),
        ("proportional", [1 / 6, 2 / 6, 3 / 6, 0.0, 0.0]),
    ],
)
def test_loss_clipped_at_median_hand_computed(weighting, expected):
    assert_weights(LossClippedAtMedian(weighting)(scores(1.0, 2.0, 3.0, 10.0, 100.0)), expected)


def test_the_median_of_an_even_count_is_the_lower_middle_and_the_margin_widens_it():
    # (1, 2, 3, 4): lower middle 2; with margin 0.5 the threshold is 3.
    assert_weights(LossClippedAtMedian("uniform")(scores(4.0, 1.0, 3.0, 2.0)), [0.0, 0.5, 0.0, 0.5])
    assert_weights(LossClippedAtMedian("uniform", margin=0.5)(scores(4.0, 1.0, 3.0, 2.0)), [0.0, 1 / 3, 1 / 3, 1 / 3])


def test_a_decoy_that_lifts_the_mean_does_not_lift_the_median():
    # The decoy's huge loss lifts the mean past a stealth model's 5.0 (kept by the mean clip),
    # not the median: the stealth model is clipped, as the decoy is.
    losses = scores(1.0, 1.2, 1.4, 1.6, 5.0, 1000.0)
    assert LossClippedAtMean("proportional")(losses)[4].item() > 0.45  # 5 / 10.2
    kept = LossClippedAtMedian()(losses)
    assert kept[4].item() == 0.0 and kept[5].item() == 0.0


@settings(max_examples=60, deadline=None)
@given(
    honest=st.lists(st.floats(0.01, 10.0), min_size=2, max_size=9),
    outliers=st.lists(st.floats(10.5, 1e9), min_size=1, max_size=8),
    weighting=st.sampled_from(["inverse", "uniform", "proportional"]),
)
def test_fewer_outliers_than_honest_scores_never_get_weight(honest, outliers, weighting):
    # Outliers above every honest score, fewer than the honest ones: the lower median is an
    # honest score, whatever the outliers' size, so none of them is kept.
    outliers = outliers[: len(honest) - 1]
    weights = LossClippedAtMedian(weighting)(scores(*honest, *outliers))
    assert all(w == 0.0 for w in weights[len(honest):].tolist())
    assert math.isclose(weights[: len(honest)].sum().item(), 1.0, abs_tol=1e-9)


@pytest.mark.parametrize("settings_, message", [({"weighting": "mean"}, "weighting"), ({"margin": -0.1}, "margin"), ({"margin": float("nan")}, "margin")])
def test_loss_clip_median_refuses_bad_settings(settings_, message):
    with pytest.raises(ValueError, match=message):
        LossClippedAtMedian(**settings_)


# ---------------------------------------------------------------- drop the highest losses


def test_drop_highest_hand_computed():
    # Told 2: of the neighbours' losses (5, 2, 100, 3) the two highest (100, 5) go; the own
    # model (first, loss 9: the worst) stays.
    losses = scores(9.0, 5.0, 2.0, 100.0, 3.0)
    assert_weights(LossDropHighest(2)(losses), [1 / 3, 0.0, 1 / 3, 0.0, 1 / 3])
    # (1/9, 1/2, 1/3) over their sum 17/18.
    assert_weights(LossDropHighest(2, "inverse")(losses), [2 / 17, 0.0, 9 / 17, 0.0, 6 / 17])
    # Told 0: every candidate, as an average.
    assert_weights(LossDropHighest(0)(losses), [0.2] * 5)
    # Told more than there are neighbours: the own model alone.
    assert_weights(LossDropHighest(9)(losses), [1.0, 0.0, 0.0, 0.0, 0.0])


def test_drop_highest_drops_every_neighbour_tied_with_the_last_one_dropped():
    assert_weights(LossDropHighest(1)(scores(1.0, 4.0, 4.0, 2.0)), [0.5, 0.0, 0.0, 0.5])


def test_the_rule_gives_the_crs_the_number_of_byzantine_neighbours_it_is_told():
    from dfedrw.peer.config.scenario import load_scenario
    from dfedrw.peer.wiring.assembly import client_rule
    from dfedrw.peer.wiring.plan import scenario_topology

    sc = load_scenario(None, ["aggregation.crs=loss_drop_highest", "aggregation.assumed_byzantine=3"])
    assert client_rule(sc, scenario_topology(sc), 0).crs == LossDropHighest(3)
    with pytest.raises(ValueError, match="set by the running system"):
        load_scenario(None, ["aggregation.crs=loss_drop_highest", "aggregation.crs_params.loss_drop_highest.num_byzantine=1"])
