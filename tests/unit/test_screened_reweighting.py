"""Unit tests for ScreenedReweighting (peer.aggregation.screened): Krum's screen, then the TPM
and CRS on what it lets through. Every expected value is worked out by hand next to it; the
shared conventions (a distribution over every id, arrival order, NaN rows, one candidate) are
the property tests of test_robust.py, where the rule is in ALL_RULES."""

from __future__ import annotations

import math

import pytest
import torch

from dfedrw.peer.aggregation import RULE_REGISTRY, build_rule
from dfedrw.peer.aggregation.crs import LossDropHighest
from dfedrw.peer.aggregation.tpm import Loss
from dfedrw.peer.kinds.registries import build_named_rule
from tests.support.rules import NAN, assert_model, assert_weights, inputs_for

ScreenedReweighting = RULE_REGISTRY.resolve("screened_reweighting")


def screened(f: int, weighting: str = "uniform"):
    return ScreenedReweighting(tpm=Loss(), crs=LossDropHighest(num_byzantine=f, weighting=weighting), num_byzantine=f)


def test_the_furthest_is_screened_then_the_worst_loss_dropped_by_hand():
    # Prepare: loss = first coordinate. C = 4, f = 1: each Krum score is the squared distance
    # to the nearest other (C - f - 2 = 1): own 0 -> 1 (to 1), 1 -> 1, 2 -> 1 (to 1), 10 -> 64
    # (to 2). Screen: 10 (id 102) goes. Losses of the rest 0, 1, 2: the CRS drops the highest
    # neighbour loss, 2 (id 101); own and id 100 share the weight.
    inputs = inputs_for([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [10.0, 0.0]])

    # Execute
    result = screened(1)(inputs)

    # Assert
    assert_weights(result, {7: 0.5, 100: 0.5, 101: 0.0, 102: 0.0})
    assert_model(result, [0.5, 0.0])
    assert result.scores[7] == 0.0 and result.scores[100] == 1.0 and result.scores[101] == 2.0
    assert math.isnan(result.scores[102])  # screened: never scored


def test_a_far_model_with_the_lowest_loss_is_screened_where_the_loss_alone_keeps_it():
    # Prepare: the dissensus shape, far from every honest model yet the best on the client's
    # rows (loss -0.5). Krum scores (nearest one): own [1, 0] -> 1, [2, 0] -> 1, [3, 0] -> 1,
    # far -> (1.5^2 + 50^2) = 2502.25: screened. Then the losses 1, 2, 3: 3 (id 101) dropped.
    rows = [[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [-0.5, 50.0]]
    reweighting = build_rule("dfedreweighting", "loss", "loss_drop_highest", crs_params={"num_byzantine": 1})

    # Execute
    two_stage = screened(1)(inputs_for(rows))
    loss_only = reweighting(inputs_for(rows))

    # Assert
    assert_weights(two_stage, {7: 0.5, 100: 0.5, 101: 0.0, 102: 0.0})
    assert_model(two_stage, [1.5, 0.0])
    assert loss_only.weights[102] == pytest.approx(1 / 3)  # kept by the loss: its score is the lowest


def test_ties_in_the_screen_drop_the_higher_id_whatever_the_order():
    # Prepare: own 0, neighbours 2 and -2. C = 3, f = 1, one nearest: every score is 4 (own
    # to either, 2 to own, -2 to own); the tie goes to the higher id, 101, whichever row it is.
    # A CRS told 0 then averages the two left.
    rule = ScreenedReweighting(tpm=Loss(), crs=LossDropHighest(num_byzantine=0), num_byzantine=1)
    rows = [[0.0, 0.0], [2.0, 0.0], [-2.0, 0.0]]

    # Execute
    direct = rule(inputs_for(rows, ids=(7, 100, 101)))
    swapped = rule(inputs_for(rows, ids=(7, 101, 100)))

    # Assert
    assert_weights(direct, {7: 0.5, 100: 0.5, 101: 0.0})
    assert_model(direct, [1.0, 0.0])
    assert_weights(swapped, {7: 0.5, 101: 0.0, 100: 0.5})
    assert_model(swapped, [-1.0, 0.0])


def test_told_no_byzantine_it_is_dfedreweighting():
    # Prepare
    rows = [[0.3, 1.0], [1.0, 0.0], [2.0, 5.0], [10.0, -1.0]]
    plain = build_rule("dfedreweighting", "loss", "loss_drop_highest", crs_params={"num_byzantine": 0, "weighting": "inverse"})

    # Execute
    result = screened(0, "inverse")(inputs_for(rows))
    expected = plain(inputs_for(rows))

    # Assert
    assert result.weights == expected.weights and result.scores == expected.scores
    assert torch.equal(result.model, expected.model)


def test_non_finite_rows_take_no_part_in_the_screen():
    # Prepare: a NaN row and the rows of the first test: the screen runs on the four finite
    # ones (10 goes), the CRS drops 2, the NaN row weighs 0 and has no score.
    inputs = inputs_for([[0.0, 0.0], [1.0, 0.0], [NAN, 0.0], [2.0, 0.0], [10.0, 0.0]])

    # Execute
    result = screened(1)(inputs)

    # Assert
    assert_weights(result, {7: 0.5, 100: 0.5, 101: 0.0, 102: 0.0, 103: 0.0})
    assert math.isnan(result.scores[101]) and math.isnan(result.scores[103])


def test_the_running_system_tells_the_screen_and_the_crs_the_same_bound():
    # Execute
    rule = build_named_rule("screened_reweighting", "loss", "loss_drop_highest", {"crs": {"weighting": "inverse"}}, {"num_byzantine": 2, "seed": 1})

    # Assert
    assert rule.num_byzantine == 2 and rule.crs.num_byzantine == 2 and rule.crs.weighting == "inverse"


def test_a_negative_bound_is_refused():
    with pytest.raises(ValueError, match="ScreenedReweighting: num_byzantine must be >= 0, got -1"):
        ScreenedReweighting(tpm=Loss(), crs=LossDropHighest(), num_byzantine=-1)
