"""Unit tests for the decentralized rules in peer.aggregation.decentralized: ClippedGossip, UBAR, CS+-RG.

Every expected value is worked out by hand in the comments next to it. The property tests
check the shared conventions (weights form a distribution over every id, arrival order does
not matter to the last bit, a NaN row gets no weight), that ``batched`` gives each client
exactly what its own call gives, and the displacement bound the clipping rules are built for.
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
    UBAR,
    ClippedGossip,
    CSPlusRG,
    RoundBatch,
    RoundInputs,
)
from tests.support import rules
from tests.support.rules import NAN, assert_model, assert_weights


def loss_to_three(candidates: torch.Tensor) -> dict[str, torch.Tensor]:
    """loss = |x[0] - 3|: a model is better the closer its first coordinate is to 3."""
    loss = (candidates[:, 0] - 3.0).abs()
    return {"accuracy": -loss, "loss": loss}


inputs_for = partial(rules.inputs_for, evaluate=loss_to_three)


# Own model 0, neighbours at 1, 2, 10 (ids 100, 101, 102): distances 1, 2, 10; C = 4 candidates.
LINE = [[0.0], [1.0], [2.0], [10.0]]


# ---------------------------------------------------------------- ClippedGossip


@pytest.mark.parametrize(
    ("rule", "expected_model", "expected_weights"),
    [
        # furthest, b = 1: tau = 2nd largest distance = 2; s = (1, 1, 2/10);
        # model = (1 + 2 + 0.2 * 10) / 4 = 1.25; own 1 - 2.2/4 = 0.45, then 0.25, 0.25, 0.05.
        (ClippedGossip(1), [1.25], {7: 0.45, 100: 0.25, 101: 0.25, 102: 0.05}),
        # spread, b = 1: the n - b = 2 closest give tau^2 = (1^2 + 2^2) / 1 = 5; s = (1, 1,
        # sqrt5/10); model = (1 + 2 + sqrt5) / 4 = 0.75 + sqrt5/4; own 1 - (2 + sqrt5/10)/4.
        (ClippedGossip(1, radius="spread"), [0.75 + math.sqrt(5) / 4],
         {7: 0.5 - math.sqrt(5) / 40, 100: 0.25, 101: 0.25, 102: math.sqrt(5) / 40}),
        # fixed tau = 1: s = (1, 1/2, 1/10); model = (1 + 1 + 1) / 4 = 0.75;
        # own 1 - 1.6/4 = 0.6, then 0.25, 0.125, 0.025.
        (ClippedGossip(1, radius="fixed", tau=1.0), [0.75], {7: 0.6, 100: 0.25, 101: 0.125, 102: 0.025}),
        # b = 0: tau = inf, plain gossip mean (0 + 1 + 2 + 10) / 4 = 3.25.
        (ClippedGossip(0), [3.25], {7: 0.25, 100: 0.25, 101: 0.25, 102: 0.25}),
        (ClippedGossip(0, radius="spread"), [3.25], {7: 0.25, 100: 0.25, 101: 0.25, 102: 0.25}),
        # b >= n = 3: tau = 0, every neighbour clipped to nothing: the own model.
        (ClippedGossip(3), [0.0], {7: 1.0, 100: 0.0, 101: 0.0, 102: 0.0}),
        (ClippedGossip(5, radius="spread"), [0.0], {7: 1.0, 100: 0.0, 101: 0.0, 102: 0.0}),
    ],
    ids=["furthest", "spread", "fixed", "b0-furthest", "b0-spread", "b-all-furthest", "b-all-spread"],
)
def test_clipped_gossip_hand_computed(rule, expected_model, expected_weights):
    # Execute
    result = rule(inputs_for(LINE))

    # Assert
    assert_model(result, expected_model)
    assert_weights(result, expected_weights)
    assert result.scores is None


def test_clipped_gossip_furthest_with_two_byzantine_in_two_dimensions():
    # Prepare: own (0, 0); neighbours (3, 4) d=5, (0, 1) d=1, (6, 8) d=10, (1, 0) d=1; b = 2:
    # tau = 3rd largest distance = 1 -> s = (1/5, 1, 1/10, 1), C = 5;
    # model = (0.2*(3, 4) + (0, 1) + 0.1*(6, 8) + (1, 0)) / 5 = (2.2, 2.6) / 5 = (0.44, 0.52)
    inputs = inputs_for([[0, 0], [3, 4], [0, 1], [6, 8], [1, 0]])

    # Execute
    result = ClippedGossip(2)(inputs)

    # Assert: coefficients 0.04, 0.2, 0.02, 0.2 and the own 1 - 0.46 = 0.54
    assert_model(result, [0.44, 0.52])
    assert_weights(result, {7: 0.54, 100: 0.04, 101: 0.2, 102: 0.02, 103: 0.2})


def test_clipped_gossip_leaves_a_neighbour_at_the_radius_whole():
    # Prepare: own 0, neighbours 1, 2, -2 (distances 1, 2, 2); b = 1: tau = 2nd largest = 2,
    # so both neighbours at distance 2 sit at the radius and nothing is clipped
    result = ClippedGossip(1)(inputs_for([[0.0], [1.0], [2.0], [-2.0]]))

    # Assert: the plain mean (0 + 1 + 2 - 2) / 4 = 0.25
    assert_model(result, [0.25])
    assert_weights(result, {7: 0.25, 100: 0.25, 101: 0.25, 102: 0.25})


# ---------------------------------------------------------------- CS+-RG


def test_cs_plus_rg_clips_the_two_b_furthest():
    # Prepare: LINE with b = 1 clips 2b = 2: tau = 3rd largest distance = 1 -> s = (1, 1/2,
    # 1/10); model = (1 + 0.5*2 + 0.1*10) / 4 = 0.75; own 1 - 1.6/4 = 0.6.
    result = CSPlusRG(1)(inputs_for(LINE))

    # Assert
    assert_model(result, [0.75])
    assert_weights(result, {7: 0.6, 100: 0.25, 101: 0.125, 102: 0.025})


def test_cs_plus_rg_in_two_dimensions_and_its_limits():
    # Prepare: own (0, 0); neighbours (3, 4) d=5, (0, 1) d=1, (6, 8) d=10, (1, 0) d=1; b = 1:
    # 2b = 2 clipped, tau = 3rd largest = 1 -> as ClippedGossip with b = 2 above:
    # model (0.44, 0.52), coefficients 0.54, 0.04, 0.2, 0.02, 0.2.
    rows = [[0, 0], [3, 4], [0, 1], [6, 8], [1, 0]]

    # Execute
    result = CSPlusRG(1)(inputs_for(rows))
    mean = CSPlusRG(0)(inputs_for(rows))  # b = 0: tau = inf, the mean (10, 13) / 5
    own = CSPlusRG(2)(inputs_for(rows))  # 2b = 4 >= n = 4: tau = 0, the own model

    # Assert
    assert_model(result, [0.44, 0.52])
    assert_weights(result, {7: 0.54, 100: 0.04, 101: 0.2, 102: 0.02, 103: 0.2})
    assert_model(mean, [2.0, 2.6])
    assert_model(own, [0.0, 0.0])
    assert_weights(own, {7: 1.0, 100: 0.0, 101: 0.0, 102: 0.0, 103: 0.0})
    assert CSPlusRG(1)(inputs_for(rows)).weights == ClippedGossip(2)(inputs_for(rows)).weights


# ---------------------------------------------------------------- UBAR


def test_ubar_hand_computed():
    # Prepare: own 1 (loss |1 - 3| = 2); neighbours 2 (d 1, loss 1), 0.5 (d 0.5, loss 2.5),
    # 1.5 (d 0.5, loss 1.5), 100 (d 99). b = 1: n - b = 3 closest = 2, 0.5, 1.5.
    # Stage 2 keeps losses <= 2: 2 and 1.5. alpha = 0.5: 0.5*1 + 0.5*(2 + 1.5)/2 = 1.375.
    inputs = inputs_for([[1.0], [2.0], [0.5], [1.5], [100.0]])

    # Execute
    result = UBAR(num_byzantine=1)(inputs)

    # Assert: the far model (103) is never evaluated, so its score is NaN
    assert_model(result, [1.375])
    assert_weights(result, {7: 0.5, 100: 0.25, 101: 0.0, 102: 0.25, 103: 0.0})
    assert {k: v for k, v in result.scores.items() if k != 103} == {7: 2.0, 100: 1.0, 101: 2.5, 102: 1.5}
    assert math.isnan(result.scores[103])


def test_ubar_keeps_the_best_shortlisted_one_when_none_beats_the_own_model():
    # Prepare: own 3 (loss 0); neighbours 2 (d 1, loss 1), 4.5 (d 1.5, loss 1.5), 100.
    # b = 1 shortlists 2 and 4.5; neither has loss <= 0, so the lower loss (2) is kept:
    # 0.5*3 + 0.5*2 = 2.5. With alpha = 0.2: 0.2*3 + 0.8*2 = 2.2.
    inputs = inputs_for([[3.0], [2.0], [4.5], [100.0]])

    # Execute
    result = UBAR(1)(inputs)
    own_light = UBAR(1, alpha=0.2)(inputs)

    # Assert
    assert_model(result, [2.5])
    assert_weights(result, {7: 0.5, 100: 0.5, 101: 0.0, 102: 0.0})
    assert_model(own_light, [2.2])
    assert_weights(own_light, {7: 0.2, 100: 0.8, 101: 0.0, 102: 0.0})


def test_ubar_rho_sets_the_shortlist_size():
    # Prepare: as the hand-computed case; rho = 0.5 of n = 4 -> the 2 closest: 0.5 and 1.5 at
    # distance 0.5 each (2 is at 1). Only 1.5 (loss 1.5 <= 2) is kept: 0.5*1 + 0.5*1.5 = 1.25.
    inputs = inputs_for([[1.0], [2.0], [0.5], [1.5], [100.0]])

    # Execute
    result = UBAR(1, rho=0.5)(inputs)
    everyone = UBAR(0, alpha=0.0)(inputs)  # b = 0: all 4 neighbours shortlisted

    # Assert
    assert_weights(result, {7: 0.5, 100: 0.0, 101: 0.0, 102: 0.5, 103: 0.0})
    assert_model(result, [1.25])
    # b = 0, alpha = 0: losses 1 (2), 2.5 (0.5), 1.5 (1.5), 97 (100): kept 2 and 1.5 -> 1.75
    assert_model(everyone, [1.75])
    assert_weights(everyone, {7: 0.0, 100: 0.5, 101: 0.0, 102: 0.5, 103: 0.0})


def test_ubar_ties_in_distance_go_to_the_lower_id():
    # Prepare: own 1; neighbours 0 and 2 both at distance 1; rho = 0.5 of n = 2 keeps one:
    # the lower id (100, model 0, loss 3 > 2) -> kept as the best shortlisted: 0.5*1 + 0.5*0
    result = UBAR(1, rho=0.5)(inputs_for([[1.0], [0.0], [2.0]], ids=(7, 100, 101)))
    swapped = UBAR(1, rho=0.5)(inputs_for([[1.0], [2.0], [0.0]], ids=(7, 101, 100)))

    # Assert
    assert_model(result, [0.5])
    assert result.weights == swapped.weights == {7: 0.5, 100: 0.5, 101: 0.0}


def test_ubar_never_keeps_a_non_finite_loss():
    # Prepare: an evaluate that answers NaN for the neighbour at 2 and -inf for the one at 2.5
    def odd(candidates):
        loss = (candidates[:, 0] - 3.0).abs()
        loss[candidates[:, 0] == 2.0] = NAN
        loss[candidates[:, 0] == 2.5] = -math.inf
        return {"accuracy": -loss, "loss": loss}

    # Execute: own 1 (loss 2), 2 (NaN), 2.5 (-inf), 1.5 (loss 1.5) -> only 1.5 is kept
    result = UBAR(0)(inputs_for([[1.0], [2.0], [2.5], [1.5]], evaluate=odd))
    none = UBAR(0)(inputs_for([[1.0], [2.0], [2.5]], evaluate=odd))

    # Assert
    assert_weights(result, {7: 0.5, 100: 0.0, 101: 0.0, 102: 0.5})
    assert_model(result, [1.25])
    assert_weights(none, {7: 1.0, 100: 0.0, 101: 0.0})


def test_ubar_needs_evaluate_and_a_loss():
    with pytest.raises(ValueError, match="UBAR: inputs.evaluate is None"):
        UBAR(1)(inputs_for(LINE, evaluate=None))
    with pytest.raises(ValueError, match="UBAR: evaluate returned no 'loss'"):
        UBAR(1)(inputs_for(LINE, evaluate=lambda c: {"accuracy": c[:, 0]}))
    with pytest.raises(ValueError, match=r"UBAR: evaluate returned losses of shape \(1,\), expected \(3,\)"):
        UBAR(1)(inputs_for(LINE, evaluate=lambda c: {"loss": c[:1, 0]}))


def test_ubar_evaluates_only_finite_shortlisted_rows():
    # Prepare: record what evaluate is asked to score
    seen = []

    def recording(candidates):
        seen.append(candidates.clone())
        return loss_to_three(candidates)

    # Execute: a NaN row and a far row; b = 1 shortlists the closest finite 2 of n = 3
    result = UBAR(1)(inputs_for([[1.0], [NAN], [2.0], [100.0], [1.5]], evaluate=recording))

    # Assert: one call, own + the two closest, in id order (7 first, then 101, 103)
    assert len(seen) == 1
    assert seen[0].tolist() == [[1.0], [2.0], [1.5]]
    assert result.weights[100] == 0.0 and math.isnan(result.scores[100])


# ---------------------------------------------------------------- shared edge cases

ALL_RULES = [
    ClippedGossip(1),
    ClippedGossip(1, radius="spread"),
    ClippedGossip(1, radius="fixed", tau=0.5),
    CSPlusRG(1),
    UBAR(1),
    UBAR(0, alpha=0.3, rho=0.6),
]


def rule_id(rule) -> str:
    return repr(rule).replace(" ", "")


@pytest.mark.parametrize("rule", ALL_RULES, ids=rule_id)
def test_every_rule_with_one_candidate_keeps_it(rule):
    # Execute
    result = rule(inputs_for([[1.5, 0.25]]))

    # Assert
    assert result.weights == {7: 1.0}
    assert_model(result, [1.5, 0.25])


@pytest.mark.parametrize("rule", ALL_RULES, ids=rule_id)
def test_every_rule_keeps_own_model_when_it_is_non_finite(rule):
    # Execute
    result = rule(inputs_for([[NAN, 1.0], [2.0, 2.0], [3.0, 3.0]]))

    # Assert
    assert_weights(result, {7: 1.0, 100: 0.0, 101: 0.0})
    assert math.isnan(float(result.model[0])) and float(result.model[1]) == 1.0


@pytest.mark.parametrize("rule", ALL_RULES, ids=rule_id)
def test_every_rule_gives_a_nan_row_no_weight(rule):
    # Prepare: own 1, a NaN neighbour, and two finite ones close by
    inputs = inputs_for([[1.0, 0.0], [NAN, 0.0], [2.0, 0.0], [1.5, math.inf], [1.2, 0.0]])

    # Execute
    result = rule(inputs)

    # Assert
    assert result.weights[100] == 0.0 and result.weights[102] == 0.0
    assert sum(result.weights.values()) == pytest.approx(1.0, abs=1e-12)
    assert bool(torch.isfinite(result.model).all())


@pytest.mark.parametrize("rule", ALL_RULES, ids=rule_id)
def test_every_rule_returns_equal_models_unchanged(rule):
    # Execute: every candidate the same model
    result = rule(inputs_for([[0.5, -2.0]] * 4))

    # Assert: all distances are 0, nothing is clipped or rejected for being far
    assert_model(result, [0.5, -2.0])
    assert sum(result.weights.values()) == pytest.approx(1.0, abs=1e-12)


# ---------------------------------------------------------------- construction and registry


def test_rules_are_registered_and_built_with_what_the_run_supplies():
    # Execute
    clipped = RULE_REGISTRY.build("clipped_gossip", {"radius": "fixed", "tau": 2}, {"num_byzantine": 1, "lr": 0.01})
    ubar = RULE_REGISTRY.build("ubar", {"alpha": 0.1}, {"num_byzantine": 2, "seed": 3})
    cs_plus = RULE_REGISTRY.build("cs_plus_rg", {}, {"num_byzantine": 1})

    # Assert
    assert clipped == ClippedGossip(1, radius="fixed", tau=2.0) and isinstance(clipped.tau, float)
    assert ubar == UBAR(2, alpha=0.1)
    assert cs_plus == CSPlusRG(1)
    assert RULE_REGISTRY.supplied("ubar") == ["num_byzantine"]
    assert [s.name for s in RULE_REGISTRY.settings("clipped_gossip")] == ["radius", "tau"]
    assert [s.name for s in RULE_REGISTRY.settings("cs_plus_rg")] == []
    with pytest.raises(ValueError, match="set by the running system"):
        RULE_REGISTRY.build("ubar", {"num_byzantine": 1}, {"num_byzantine": 1})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ClippedGossip(-1), r"ClippedGossip: num_byzantine must be >= 0, got -1"),
        (lambda: ClippedGossip(1.5), r"ClippedGossip: num_byzantine must be an integer, got 1.5"),
        (lambda: ClippedGossip(1, radius="median"),
         r"ClippedGossip: radius must be one of \['furthest', 'spread', 'fixed'\], got 'median'"),
        (lambda: ClippedGossip(1, radius="fixed"), r"ClippedGossip: tau must be set when radius='fixed'"),
        (lambda: ClippedGossip(1, radius="fixed", tau=0.0), r"ClippedGossip: tau must be > 0, got 0.0"),
        (lambda: ClippedGossip(1, radius="fixed", tau=NAN), r"ClippedGossip: tau must be finite"),
        (lambda: ClippedGossip(1, tau=2.0), r"ClippedGossip: tau is only used with radius='fixed'"),
        (lambda: CSPlusRG(-2), r"CSPlusRG: num_byzantine must be >= 0, got -2"),
        (lambda: CSPlusRG(True), r"CSPlusRG: num_byzantine must be an integer, got True"),
        (lambda: UBAR(-1), r"UBAR: num_byzantine must be >= 0, got -1"),
        (lambda: UBAR(1, alpha=1.5), r"UBAR: alpha must be in \[0, 1\], got 1.5"),
        (lambda: UBAR(1, alpha=-0.1), r"UBAR: alpha must be >= 0, got -0.1"),
        (lambda: UBAR(1, rho=0.0), r"UBAR: rho must be > 0, got 0.0"),
        (lambda: UBAR(1, rho=1.2), r"UBAR: rho must be in \(0, 1\], got 1.2"),
        (lambda: UBAR(1, rho="half"), r"UBAR: rho must be a real number, got 'half'"),
    ],
)
def test_hyper_parameters_are_validated(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# ---------------------------------------------------------------- batched


def distance_loss(target: torch.Tensor):
    """A client's evaluate: loss = squared distance to its own target, row by row."""

    def evaluate(candidates: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = ((candidates.double() - target) ** 2).sum(dim=1).float()
        return {"accuracy": -loss, "loss": loss}

    return evaluate


def random_batch(data, *, many: bool, calls: list | None = None) -> RoundBatch:
    """A pool of models (own models first, a NaN row and exact copies possible), each client
    with its own row and a random set of others, ids that are not the pool order."""
    clients = data.draw(st.integers(1, 5), label="clients")
    pool = clients + data.draw(st.integers(0, 6), label="extra rows")
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    vectors = torch.randn(pool, 4, generator=generator)
    if data.draw(st.booleans(), label="nan row"):
        vectors[data.draw(st.integers(0, pool - 1), label="which nan")] = NAN
    if pool > 1 and data.draw(st.booleans(), label="a copy"):
        vectors[pool - 1] = vectors[0]
    id_of = data.draw(st.permutations(range(200, 200 + pool)), label="ids")
    rows, ids = [], []
    for c in range(clients):
        others = data.draw(st.lists(st.sampled_from([r for r in range(pool) if r != c]), unique=True, max_size=pool - 1)
                           if pool > 1 else st.just([]), label=f"rows of {c}")
        rows.append((c, *others))
        ids.append(tuple(id_of[r] for r in rows[-1]))
    targets = {id_of[c]: torch.randn(4, generator=generator, dtype=torch.float64) for c in range(clients)}
    evaluates = {k: distance_loss(t) for k, t in targets.items()}
    owner_of = {id(e): k for k, e in evaluates.items()}

    def evaluate_many(vectors, owners, candidate_rows):
        if calls is not None:
            calls.append([owner_of[id(e)] for e in owners])
        return [e(vectors[list(r)]) for e, r in zip(owners, candidate_rows, strict=True)]

    return RoundBatch(
        round=1, vectors=vectors, rows=tuple(rows), ids=tuple(ids), num_samples=tuple((10,) * len(r) for r in rows),
        evaluate=tuple(evaluates[i[0]] for i in ids), evaluate_many=evaluate_many if many else None,
    )


def same_scores(left, right) -> bool:
    if left is None or right is None:
        return left is right
    return left.keys() == right.keys() and all(
        (math.isnan(a) and math.isnan(b)) or a == b for a, b in ((left[k], right[k]) for k in left)
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data(), rule=st.sampled_from(ALL_RULES + [ClippedGossip(0), CSPlusRG(2), UBAR(3)]), many=st.booleans())
def test_batched_gives_each_client_exactly_what_its_own_call_gives(data, rule, many):
    # Prepare
    batch = random_batch(data, many=many)

    # Execute
    together = rule.batched(batch)

    # Assert: the same model bits, the same weights and scores, for every client
    assert len(together) == len(batch)
    for c, agg in enumerate(together):
        one = rule(batch.one(c))
        torch.testing.assert_close(agg.model, one.model, rtol=0, atol=0, equal_nan=True)
        assert agg.weights == one.weights, c
        assert same_scores(agg.scores, one.scores), c


def test_batched_ubar_scores_every_client_in_one_call_and_only_what_it_needs():
    # Prepare: client 0 has neighbours, client 1 has none, client 2's own row is NaN
    calls = []
    vectors = torch.tensor([[0.0, 0.0], [5.0, 5.0], [NAN, 0.0], [0.1, 0.0], [9.0, 9.0]])
    targets = {10: torch.zeros(2, dtype=torch.float64), 11: torch.ones(2, dtype=torch.float64),
               12: torch.zeros(2, dtype=torch.float64)}

    evaluates = {k: distance_loss(targets[k]) for k in (10, 11, 12)}
    owner_of = {id(e): k for k, e in evaluates.items()}

    def evaluate_many(pool, owners, rows):
        calls.append(([owner_of[id(e)] for e in owners], [tuple(r) for r in rows]))
        return [e(pool[list(r)]) for e, r in zip(owners, rows, strict=True)]

    batch = RoundBatch(
        round=0, vectors=vectors, rows=((0, 3, 4), (1,), (2, 0)), ids=((10, 13, 14), (11,), (12, 10)),
        num_samples=((1, 1, 1), (1,), (1, 1)), evaluate=tuple(evaluates[k] for k in (10, 11, 12)),
        evaluate_many=evaluate_many,
    )

    # Execute: b = 1 shortlists the closer of 3 and 4 for client 0
    results = UBAR(1).batched(batch)

    # Assert: one call, for client 0 only, with its own row and row 3 (id 13); 13 has loss
    # 0.01 <= 0 is false, so it is kept as the best shortlisted: 0.5*0 + 0.5*(0.1, 0)
    assert calls == [([10], [(0, 3)])]
    assert_model(results[0], [0.05, 0.0])
    assert results[0].weights == {10: 0.5, 13: 0.5, 14: 0.0}
    assert results[1].weights == {11: 1.0} and results[2].weights == {12: 1.0, 10: 0.0}


# ---------------------------------------------------------------- property tests


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    count=st.integers(1, 8),
    broken=st.sets(st.integers(1, 7), max_size=2),
    rule=st.sampled_from(ALL_RULES),
    data=st.data(),
)
def test_weights_are_a_distribution_independent_of_order(seed, count, broken, rule, data):
    # Prepare: a NaN in some neighbour rows; the own model is finite
    generator = torch.Generator().manual_seed(seed)
    vectors = torch.randn(count, 5, generator=generator) * 2.0
    for row in broken:
        if row < count:
            vectors[row, row % 5] = NAN
    ids = (0, *range(10, 10 + count - 1))
    order = [0, *data.draw(st.permutations(range(1, count)))]
    evaluate = distance_loss(torch.zeros(5, dtype=torch.float64))

    def make(rows):
        return RoundInputs(0, 2, tuple(ids[i] for i in rows), vectors[rows], (0,) * count, evaluate)

    # Execute
    direct = rule(make(list(range(count))))
    permuted = rule(make(order))

    # Assert: a distribution over every id, none on a broken row, and the very same result
    assert set(direct.weights) == set(ids)
    assert sum(direct.weights.values()) == pytest.approx(1.0, abs=1e-12)
    assert all(w >= 0 for w in direct.weights.values())
    for row in broken:
        if row < count:
            assert direct.weights[ids[row]] == 0.0
    assert bool(torch.isfinite(direct.model).all())
    assert permuted.weights == direct.weights
    assert torch.equal(permuted.model, direct.model)
    assert same_scores(permuted.scores, direct.scores)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), radius=st.sampled_from(["furthest", "spread", "cs_plus"]))
def test_clipping_rules_move_the_own_model_no_further_than_the_honest_neighbours_allow(data, radius):
    # Each neighbour moves the model by min(d_j, tau) / C, so ||model - own|| <= max(D, tau)
    # with D the largest honest distance. With at most b outliers, the (b+1)-th (or 2b+1-th)
    # largest distance is <= D; the spread radius is <= D * sqrt((n - b) / b) (the n - b
    # smallest distances are all <= D).
    # Prepare: own model and honest neighbours in [-1, 1]^dim, b outliers anywhere
    dim = data.draw(st.integers(1, 3))
    num_byzantine = data.draw(st.integers(0, 3))
    honest_count = data.draw(st.integers(1, 7))
    unit = st.floats(-1.0, 1.0, allow_nan=False)
    honest = [data.draw(st.lists(unit, min_size=dim, max_size=dim)) for _ in range(honest_count)]
    far = st.floats(-1e6, 1e6, allow_nan=False)
    outliers = [data.draw(st.lists(far, min_size=dim, max_size=dim)) for _ in range(num_byzantine)]
    rows = honest[:1] + data.draw(st.permutations(honest[1:] + outliers))
    rule = CSPlusRG(num_byzantine) if radius == "cs_plus" else ClippedGossip(num_byzantine, radius=radius)
    inputs = RoundInputs(0, 0, tuple(range(len(rows))), torch.tensor(rows, dtype=torch.float32), (0,) * len(rows))

    # Execute
    model = rule(inputs).model.double()

    # Assert
    seen = inputs.vectors.double()
    own = seen[0]
    honest_seen = torch.tensor(honest, dtype=torch.float32).double()
    largest = float(torch.linalg.vector_norm(honest_seen - own, dim=1).max())
    n = len(rows) - 1
    factor = math.sqrt((n - num_byzantine) / num_byzantine) if radius == "spread" and num_byzantine else 1.0
    assert float(torch.linalg.vector_norm(model - own)) <= largest * max(1.0, factor) + 1e-5
