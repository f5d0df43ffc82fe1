"""Unit tests for target performance metrics and aggregation rules.

Hand-computed expectations are worked out in the comments. The "tiny logistic problem" is a
2-feature, 2-class softmax regression (D = 6: W [2, 2] then b [2]) on 32 fixed points whose
label is [x0 + x1 > 0]; its ``evaluate`` is the true loss/accuracy of each candidate.
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfedrw.peer.aggregation import (
    RULE_REGISTRY,
    TPM_REGISTRY,
    Accuracy,
    AccuracyClippedAtMean,
    Aggregate,
    DFedAvg,
    DFedReweighting,
    Loss,
    LossClippedAtMean,
    Proportional,
    RoundInputs,
    Softmax,
    WeightedCombination,
    build_rule,
    make_tpm,
)
from tests.support import rules

NAN = float("nan")
INF = float("inf")


def fixed_evaluate(accuracy: list[float], loss: list[float]):
    """An evaluate that ignores the models and returns the given metrics."""

    def evaluate(candidates: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"accuracy": torch.tensor(accuracy), "loss": torch.tensor(loss)}

    return evaluate


# The rows' own scores (loss = first coordinate, accuracy = second), at round 3.
inputs_for = partial(rules.inputs_for, round_=3)


def weights_list(aggregate: Aggregate) -> list[float]:
    return list(aggregate.weights.values())


# ---------------------------------------------------------------- tiny logistic problem

_POINTS = torch.randn(32, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
_LABELS = (_POINTS.sum(dim=1) > 0).long()
TRUE_MODEL = torch.tensor([-3.0, -3.0, 3.0, 3.0, 0.0, 0.0])  # class-1 logit 3(x0+x1)


def logistic_evaluate(candidates: torch.Tensor) -> dict[str, torch.Tensor]:
    # One row at a time so each candidate's score cannot depend on its batch neighbours.
    losses, accuracies = [], []
    for row in candidates.to(torch.float64):
        logits = _POINTS @ row[:4].view(2, 2).T + row[4:]
        losses.append(torch.nn.functional.cross_entropy(logits, _LABELS))
        accuracies.append((logits.argmax(dim=1) == _LABELS).double().mean())
    return {"loss": torch.stack(losses), "accuracy": torch.stack(accuracies)}


# ---------------------------------------------------------------- TPMs


def test_accuracy_and_loss_tpms_pick_their_metric():
    # Prepare
    candidates = torch.zeros(2, 3)
    evaluate = fixed_evaluate([0.5, 1.0], [2.0, 0.4])

    # Execute
    accuracy = Accuracy()(candidates, evaluate)
    loss = Loss()(candidates, evaluate)

    # Assert
    assert accuracy.dtype == torch.float64 and loss.dtype == torch.float64
    assert accuracy.tolist() == [0.5, 1.0]
    assert loss.tolist() == pytest.approx([2.0, 0.4])


@pytest.mark.parametrize(
    ("coefficients", "expected"),
    [
        ({}, [1.25, 0.7]),  # 0.5 * (0.5, 1.0) + 0.5 * (2.0, 0.4)
        ({"accuracy": 1.0, "loss": -1.0}, [-1.5, 0.6]),  # (0.5 - 2.0, 1.0 - 0.4)
        ({"accuracy": 0.0, "loss": 2.0}, [4.0, 0.8]),
    ],
)
def test_weighted_combination(coefficients, expected):
    # Prepare
    tpm = WeightedCombination(**coefficients)
    evaluate = fixed_evaluate([0.5, 1.0], [2.0, 0.4])

    # Execute
    score = tpm(torch.zeros(2, 3), evaluate)

    # Assert
    assert score.tolist() == pytest.approx(expected)


def test_weighted_combination_zero_coefficient_hides_nan_of_that_metric():
    # Prepare: loss NaN but b = 0 -> score = accuracy (0 * NaN would be NaN)
    tpm = WeightedCombination(accuracy=1.0, loss=0.0)

    # Execute
    score = tpm(torch.zeros(2, 3), fixed_evaluate([0.5, 1.0], [NAN, 1.0]))

    # Assert
    assert score.tolist() == [0.5, 1.0]


def test_weighted_combination_rejects_two_zero_coefficients():
    with pytest.raises(ValueError, match="both 0"):
        WeightedCombination(accuracy=0.0, loss=0)


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"accuracy": torch.ones(2)}, "lacks 'loss'"),
        ({"loss": torch.ones(3)}, r"shape \(2,\)"),
        ({"loss": torch.ones(2, 1)}, r"shape \(2,\)"),
        ([1.0, 2.0], "mapping"),
    ],
)
def test_loss_tpm_rejects_malformed_evaluate_results(result, message):
    with pytest.raises(ValueError, match=message):
        Loss()(torch.zeros(2, 3), lambda candidates: result)


def test_make_tpm_registry_and_errors():
    # Execute
    built = {name: make_tpm(name) for name in TPM_REGISTRY}

    # Assert
    assert built == {"accuracy": Accuracy(), "loss": Loss(), "combined": WeightedCombination()}
    assert make_tpm("combined", loss=-1.0) == WeightedCombination(0.5, -1.0)
    with pytest.raises(ValueError, match=r"unknown tpm 'acc'.*'accuracy', 'combined', 'loss'"):
        make_tpm("acc")
    with pytest.raises(ValueError, match=r"no setting 'beta'; settings: accuracy, loss"):
        make_tpm("combined", beta=1.0)


# ---------------------------------------------------------------- RoundInputs


def test_round_inputs_normalises_sequences_to_tuples():
    # Execute
    inputs = RoundInputs(1, 0, [1, 2], torch.zeros(2, 3), [10, 20])

    # Assert
    assert inputs.ids == (1, 2) and inputs.num_samples == (10, 20)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ids": (2, 1)}, "ids\\[0\\] must be own_id 1"),
        ({"ids": (1, 1)}, "distinct"),
        ({"ids": (1, 2, 3)}, "2 rows but there are 3 ids"),
        ({"num_samples": (1,)}, "num_samples has 1 entries"),
        ({"num_samples": (1, -1)}, "num_samples.*>= 0"),
        ({"vectors": torch.zeros(2)}, "2-D"),
        ({"vectors": torch.zeros(2, 3, dtype=torch.long)}, "floating"),
        ({"round": -1}, "round must be >= 0"),
        ({"evaluate": 3}, "evaluate must be callable"),
    ],
)
def test_round_inputs_rejects_inconsistent_fields(kwargs, message):
    # Prepare
    fields = {"own_id": 1, "round": 0, "ids": (1, 2), "vectors": torch.zeros(2, 3),
              "num_samples": (5, 5)}
    fields.update(kwargs)

    # Execute / Assert
    with pytest.raises(ValueError, match=message):
        RoundInputs(**fields)


# ---------------------------------------------------------------- DFedAvg


@pytest.mark.parametrize(
    ("rule", "sizes", "expected_weights", "expected_model"),
    [
        # (1, 1, 2) / 4 -> [1*.25 + 3*.25 + 5*.5, 2*.25 + 4*.25 + 6*.5]
        (DFedAvg(), (1, 1, 2), [0.25, 0.25, 0.5], [3.5, 4.5]),
        (DFedAvg("uniform"), (1, 1, 2), [1 / 3] * 3, [3.0, 4.0]),
        (DFedAvg(), (0, 0, 0), [1 / 3] * 3, [3.0, 4.0]),  # nothing declared -> uniform
    ],
)
def test_dfedavg_hand_computed(rule, sizes, expected_weights, expected_model):
    # Prepare
    inputs = inputs_for([[1, 2], [3, 4], [5, 6]], num_samples=sizes, evaluate=None)

    # Execute
    result = rule(inputs)

    # Assert
    assert list(result.weights) == [7, 100, 101]
    assert weights_list(result) == pytest.approx(expected_weights, abs=1e-12)
    assert result.model.dtype == torch.float32 and result.model.shape == (2,)
    assert result.model.tolist() == pytest.approx(expected_model, abs=1e-6)
    assert result.scores is None


def test_dfedavg_excludes_non_finite_rows():
    # Prepare: row 1 holds NaN -> sizes (1, -, 2) -> 1/3, 0, 2/3
    inputs = inputs_for([[1, 2], [NAN, 4], [5, 6]], num_samples=(1, 100, 2), evaluate=None)

    # Execute
    result = DFedAvg()(inputs)

    # Assert: (1 + 10) / 3, (2 + 12) / 3
    assert weights_list(result) == pytest.approx([1 / 3, 0.0, 2 / 3], abs=1e-12)
    assert result.model.tolist() == pytest.approx([11 / 3, 14 / 3], abs=1e-6)


def test_dfedavg_keeps_own_model_when_every_row_is_non_finite():
    # Prepare
    inputs = inputs_for([[INF, 2], [NAN, 4]], num_samples=(1, 1), evaluate=None)

    # Execute
    result = DFedAvg()(inputs)

    # Assert
    assert weights_list(result) == [1.0, 0.0]
    assert result.model[0].item() == INF and result.model[1].item() == 2.0


# ---------------------------------------------------------------- DFedReweighting


def test_dfedreweighting_loss_clip_hand_computed():
    # Prepare: losses (1, 2, 3, 10), mean 4 -> weights (1, 2, 3, 0) / 6
    rule = DFedReweighting(Loss(), LossClippedAtMean())
    inputs = inputs_for([[1, 5], [2, 6], [3, 7], [10, 8]])

    # Execute
    result = rule(inputs)

    # Assert: (1 + 4 + 9) / 6, (5 + 12 + 21) / 6
    assert weights_list(result) == pytest.approx([1 / 6, 2 / 6, 3 / 6, 0.0], abs=1e-12)
    assert result.model.tolist() == pytest.approx([14 / 6, 38 / 6], abs=1e-6)
    assert result.scores == {7: 1.0, 100: 2.0, 101: 3.0, 102: 10.0}


def test_dfedreweighting_softmax_accuracy_hand_computed():
    # Prepare: accuracies (0.8, 0.9), T = 0.1 -> (1, e) / (1 + e)
    rule = DFedReweighting(Accuracy(), Softmax(temperature=0.1, scale=1.0))
    inputs = RoundInputs(0, 0, (0, 1), torch.tensor([[0.0, 0.8], [10.0, 0.9]]), (0, 0),
                         evaluate=lambda c: {"accuracy": torch.tensor([0.8, 0.9],
                                             dtype=torch.float64), "loss": torch.zeros(2)})
    e = math.e

    # Execute
    result = rule(inputs)

    # Assert
    assert weights_list(result) == pytest.approx([1 / (1 + e), e / (1 + e)], abs=1e-12)
    assert result.model.tolist() == pytest.approx([10 * e / (1 + e), (0.8 + 0.9 * e) / (1 + e)],
                                                  abs=1e-6)


def test_dfedreweighting_never_weights_or_evaluates_non_finite_rows():
    # Prepare: evaluate would call every row perfect; rows 1, 2 are broken
    seen = []

    def evaluate(candidates):
        seen.append(candidates.clone())
        count = candidates.shape[0]
        return {"loss": torch.zeros(count), "accuracy": torch.ones(count)}

    rule = DFedReweighting(Loss(), LossClippedAtMean())
    inputs = inputs_for([[1, 1], [NAN, 2], [3, INF], [5, 5]], evaluate=evaluate)

    # Execute
    result = rule(inputs)

    # Assert: rows 0 and 3 tie -> 1/2 each -> (3, 3)
    assert weights_list(result) == [0.5, 0.0, 0.0, 0.5]
    assert result.model.tolist() == [3.0, 3.0]
    assert len(seen) == 1 and seen[0].tolist() == [[1.0, 1.0], [5.0, 5.0]]
    assert math.isnan(result.scores[100]) and math.isnan(result.scores[101])


def test_dfedreweighting_enforces_zero_weight_for_non_finite_rows_with_custom_crs():
    # Prepare: a careless CRS that weights everything equally
    rule = DFedReweighting(Loss(), lambda scores: torch.full(scores.shape, 1 / len(scores)))
    inputs = inputs_for([[1, 1], [NAN, NAN], [3, 3]])

    # Execute
    result = rule(inputs)

    # Assert
    assert weights_list(result) == pytest.approx([0.5, 0.0, 0.5])
    assert result.model.tolist() == [2.0, 2.0]


def test_dfedreweighting_keeps_own_model_when_no_score_is_finite():
    # Prepare
    rule = DFedReweighting(Loss(), LossClippedAtMean())
    inputs = inputs_for([[1, 2], [3, 4]], evaluate=fixed_evaluate([0.5, 0.5], [NAN, INF]))

    # Execute
    result = rule(inputs)

    # Assert
    assert weights_list(result) == [1.0, 0.0]
    assert result.model.tolist() == [1.0, 2.0]


def test_dfedreweighting_keeps_own_model_when_every_row_is_non_finite():
    # Prepare: evaluate must not even be called
    def evaluate(candidates):
        raise AssertionError("evaluate called with no finite candidate")

    rule = DFedReweighting(Loss(), LossClippedAtMean())
    inputs = inputs_for([[NAN, 2], [INF, 4]], evaluate=evaluate)

    # Execute
    result = rule(inputs)

    # Assert
    assert weights_list(result) == [1.0, 0.0]
    assert math.isnan(result.model[0].item())


def test_dfedreweighting_needs_evaluate():
    with pytest.raises(ValueError, match="evaluate is None"):
        DFedReweighting(Loss(), LossClippedAtMean())(inputs_for([[1, 2]], evaluate=None))


def test_dfedreweighting_rejects_tpm_with_wrong_shape():
    # Prepare
    rule = DFedReweighting(lambda candidates, evaluate: torch.zeros(5), Proportional())

    # Execute / Assert
    with pytest.raises(ValueError, match=r"returned shape \(5,\), expected \(2,\)"):
        rule(inputs_for([[1, 2], [3, 4]]))


def test_single_candidate_keeps_own_model():
    # Prepare
    inputs = inputs_for([[1.5, 0.25]])

    # Execute
    results = [DFedReweighting(Loss(), LossClippedAtMean())(inputs), DFedAvg()(inputs)]

    # Assert
    for result in results:
        assert result.weights == {7: 1.0}
        assert result.model.tolist() == [1.5, 0.25]


# ---------------------------------------------------------------- build_rule


def test_build_rule_from_names():
    # Execute
    robust = build_rule("dfedreweighting", "loss", "loss_clip_mean",
                        crs_params={"weighting": "inverse"})
    fair = build_rule("dfedreweighting", crs_params={"temperature": 0.1, "scale": 100})
    average = build_rule("dfedavg", rule_params={"weighting": "uniform"})

    # Assert
    assert robust == DFedReweighting(Loss(), LossClippedAtMean("inverse"))
    assert fair == DFedReweighting(Accuracy(), Softmax(0.1, 100.0))
    assert average == DFedAvg("uniform")
    assert set(RULE_REGISTRY) >= {
        "dfedreweighting", "dfedavg", "median", "trimmed_mean", "krum", "multi_krum",
        "geometric_median", "flame", "balance", "qfdfl", "acc_above_mean",
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rule": "fedavg"}, r"unknown rule 'fedavg'.*'dfedavg', 'dfedreweighting'"),
        ({"rule": "dfedavg", "crs_params": {"temperature": 1}}, "crs_params"),
        ({"rule": "dfedavg", "rule_params": {"weights": "x"}}, r"no setting 'weights'; settings: weighting"),
        ({"rule": "dfedreweighting", "crs": "softmax", "crs_params": {"temperature": 0}}, "temperature must be > 0"),
        ({"rule": "dfedreweighting", "crs": "proportional", "rule_params": {"tpm": "loss"}},
         "'tpm' is set by the running system"),
        ({"rule": "dfedreweighting", "tpm": "f1", "crs": "proportional"}, "unknown tpm 'f1'"),
    ],
)
def test_build_rule_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_rule(**kwargs)


# ---------------------------------------------------------------- property tests

RULES = [
    DFedReweighting(Loss(), LossClippedAtMean()),
    DFedReweighting(Loss(), LossClippedAtMean("inverse")),
    DFedReweighting(Accuracy(), Softmax(temperature=0.1)),
    DFedReweighting(Accuracy(), AccuracyClippedAtMean()),
    DFedReweighting(WeightedCombination(1.0, -1.0), Proportional()),
    DFedAvg(),
    DFedAvg("uniform"),
]


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    count=st.integers(1, 6),
    broken=st.sets(st.integers(0, 5), max_size=2),
    rule_index=st.integers(0, len(RULES) - 1),
    data=st.data(),
)
def test_rule_output_does_not_depend_on_neighbour_order(seed, count, broken, rule_index, data):
    # Prepare
    generator = torch.Generator().manual_seed(seed)
    vectors = TRUE_MODEL + 2.0 * torch.randn(count, 6, generator=generator)
    for row in broken:
        if row < count:
            vectors[row, row] = NAN
    sizes = tuple(int(n) for n in torch.randint(0, 50, (count,), generator=generator))
    ids = (0, *range(10, 10 + count - 1))
    order = [0, *data.draw(st.permutations(range(1, count)))]
    rule = RULES[rule_index]
    inputs = RoundInputs(0, 1, ids, vectors, sizes, logistic_evaluate)
    shuffled = RoundInputs(0, 1, tuple(ids[i] for i in order), vectors[order],
                           tuple(sizes[i] for i in order), logistic_evaluate)

    # Execute
    direct = rule(inputs)
    permuted = rule(shuffled)

    # Assert
    assert sum(direct.weights.values()) == pytest.approx(1.0, abs=1e-9)
    assert all(w >= 0 for w in direct.weights.values())
    for sender in ids:
        assert permuted.weights[sender] == pytest.approx(direct.weights[sender], abs=1e-6)
    torch.testing.assert_close(permuted.model, direct.model, atol=1e-6, rtol=0, equal_nan=True)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    honest_count=st.integers(2, 6),
    flip_scale=st.floats(2.0, 50.0),
    attacker_position=st.integers(1, 6),
)
def test_robust_rule_gives_far_candidate_no_weight(seed, honest_count, flip_scale,
                                                   attacker_position):
    # Prepare: honest = true model + small noise; attacker = -scale * honest mean (sign flip)
    generator = torch.Generator().manual_seed(seed)
    honest = TRUE_MODEL + 0.3 * torch.randn(honest_count, 6, generator=generator)
    attacker = -flip_scale * honest.mean(dim=0, keepdim=True)
    position = min(attacker_position, honest_count)
    vectors = torch.cat([honest[:position], attacker, honest[position:]]).float()
    ids = tuple(range(honest_count + 1))
    rule = DFedReweighting(Loss(), LossClippedAtMean())

    # Execute
    result = rule(RoundInputs(0, 0, ids, vectors, (0,) * len(ids), logistic_evaluate))

    # Assert: no weight to the attacker, and the model stays inside the honest range
    assert result.weights[position] == 0.0
    low, high = honest.float().min(dim=0).values, honest.float().max(dim=0).values
    assert bool((result.model >= low - 1e-5).all()) and bool((result.model <= high + 1e-5).all())


def test_robust_rule_rejects_gaussian_attack_on_logistic_problem():
    # Prepare: honest mean + 30 N(0, I), the authors' Gaussian attack, fixed seed
    generator = torch.Generator().manual_seed(43)
    honest = TRUE_MODEL + 0.3 * torch.randn(4, 6, generator=generator)
    attacker = honest.mean(dim=0) + 30.0 * torch.randn(6, generator=generator)
    vectors = torch.cat([honest, attacker[None]]).float()
    rule = DFedReweighting(Loss(), LossClippedAtMean())

    # Execute
    result = rule(RoundInputs(0, 0, (0, 1, 2, 3, 4), vectors, (0,) * 5, logistic_evaluate))

    # Assert
    assert result.weights[4] == 0.0
    assert result.scores[4] > 3 * max(result.scores[i] for i in range(4))

