"""Rules written once, over a batch: a client's call is its round as a batch of one
(``RoundBatch.of``, ``BatchOfOne``), so a client process runs the batched engine's arithmetic
(the coordinate-wise rules against a plain sort: tests/unit/test_batched_robust_rules.py).
Also the one check of a whole model's values that every intake and the batched engine make
(``Plausible.model_error``)."""

from __future__ import annotations

import pytest
import torch

from dfedrw.peer.aggregation import RoundBatch, RoundInputs
from dfedrw.peer.aggregation.rules import RULE_REGISTRY, BatchOfOne, build_rule
from dfedrw.peer.transport.serde import Plausible

NAN, INF = float("nan"), float("inf")


def evaluate(vectors):
    return {"accuracy": vectors.sum(1).abs(), "loss": vectors.abs().mean(1)}


FULL = {
    "declared_losses": (0.5, NAN, 1.25), "reference": torch.tensor([0.0, 1.0]), "finite": (True, False, True),
    "staleness": (0, 3, 1), "reports": ({4: 0.5}, None, {}), "memory": {4: 0.25}, "evaluate": evaluate, "total_rounds": 30,
}


@pytest.mark.parametrize("optional", [{}, FULL], ids=["bare", "every field"])
def test_a_batch_of_one_hands_its_client_the_inputs_it_was_made_of(optional):
    # Prepare: client 4's round 7 with candidates of 9 and 2 (one of them not finite)
    vectors = torch.tensor([[1.0, 2.0], [NAN, 0.0], [3.0, -1.0]])
    inputs = RoundInputs(own_id=4, round=7, ids=(4, 9, 2), vectors=vectors, num_samples=(10, 0, 5), **optional)

    # Execute
    batch = RoundBatch.of(inputs)
    again = batch.one(0)

    # Assert: one client, its rows the whole pool, every field as given
    assert len(batch) == 1 and batch.rows == ((0, 1, 2),)
    for name in ("own_id", "round", "ids", "num_samples", "declared_losses", "finite", "staleness", "reports", "memory", "evaluate", "total_rounds"):
        assert repr(getattr(again, name)) == repr(getattr(inputs, name)), name
    assert torch.equal(again.vectors.nan_to_num(), vectors.nan_to_num())
    assert (again.reference is None) == (inputs.reference is None)
    if inputs.reference is not None:
        assert torch.equal(again.reference, inputs.reference)
    assert batch.finite().tolist() == [True, False, True]


def test_every_rule_with_a_batched_path_is_written_once():
    # Prepare: every registered rule class of the package
    classes = {name: RULE_REGISTRY[name] for name in RULE_REGISTRY.names()}

    # Execute
    batched = sorted(name for name, cls in classes.items() if hasattr(cls, "batched"))
    twice = [name for name in batched if not issubclass(classes[name], BatchOfOne) or "__call__" in vars(classes[name])]

    # Assert: thirteen rules have a batched path, and none a one-client call of its own
    assert len(batched) == 13 and twice == []


@pytest.mark.parametrize(
    ("name", "params"),
    [("dfedreweighting", {"tpm": "loss", "crs": "loss_clip_mean"}), ("krum", {"rule_params": {"num_byzantine": 1}}), ("qfdfl", {})],
)
def test_a_call_is_the_batched_path_of_the_clients_batch_of_one(name, params):
    # Prepare
    rule = build_rule(name, **params)
    inputs = RoundInputs(
        own_id=0, round=3, ids=(0, 5, 6, 7), vectors=torch.tensor([[1.0, 0.0], [0.5, 0.5], [9.0, -9.0], [0.75, 0.25]]),
        num_samples=(4, 4, 4, 4), evaluate=evaluate, declared_losses=(0.5, 0.4, 0.3, 0.6), reference=torch.tensor([1.0, 1.0]),
    )

    # Execute
    called, batched = rule(inputs), rule.batched(RoundBatch.of(inputs))[0]

    # Assert
    assert torch.equal(called.model, batched.model)
    assert called.weights == batched.weights and called.scores == batched.scores


def test_qfdfl_without_a_reference_says_what_it_needs():
    inputs = RoundInputs(own_id=0, round=0, ids=(0, 1), vectors=torch.zeros(2, 2), num_samples=(1, 1), declared_losses=(0.5, 0.5))
    with pytest.raises(ValueError, match="QFDFL: inputs.reference is None"):
        build_rule("qfdfl")(inputs)


@pytest.mark.parametrize(
    ("values", "reason"),
    [([0.5, -2.0], None), ([], None), ([1.0, NAN], "non_finite"), ([-INF, 0.0], "non_finite"), ([3e6, 0.0], "implausible"), ([0.0, -3e6], "implausible")],
)
def test_a_models_values_are_judged_once_for_every_intake(values, reason):
    error = Plausible(max_abs_value=1e6).model_error(torch.tensor(values, dtype=torch.float32))
    assert (None if error is None else error.reason) == reason
