"""Unit tests for the attacks that know DFedReweighting (peer.attacks.reweighting)."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from dfedrw.peer.aggregation import RoundInputs, build_rule
from dfedrw.peer.attacks import ATTACK_REGISTRY, AttackerData, AttackView, craft_round, make_attack
from dfedrw.peer.learning.data import Dataset
from dfedrw.peer.learning.models import build_model, get_vector
from dfedrw.peer.learning.training import LocalTrainer
from dfedrw.peer.learning.model_matrix import VectorEvaluator

# Through the registry, which imports every attack module in its declared order: importing this
# module first would register its attacks first and reorder `dfedrw list` and the README table.
TPMAware = ATTACK_REGISTRY.resolve("tpm_aware")
DecoyStealth = ATTACK_REGISTRY.resolve("decoy_stealth")
_reweighting = importlib.import_module(TPMAware.__module__)
bisect_kept, harmful_direction = _reweighting.bisect_kept, _reweighting.harmful_direction

PAPER = build_rule("dfedreweighting", "loss", "loss_clip_mean")


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- a 1-D toy, closed form

# One parameter w whose "loss" is w^2: the kept boundary of LossClippedAtMean is solvable by
# hand. Honest models 1 and 3 (losses 1 and 9, mean model 2); a message of loss L is kept iff
# L <= (1 + 9 + L) / 3, i.e. L <= 5.


def toy_evaluate(candidates: torch.Tensor) -> dict[str, torch.Tensor]:
    w = candidates[:, 0].double()
    return {"loss": w**2, "accuracy": torch.zeros(len(w), dtype=torch.float64)}


def toy_data() -> AttackerData:
    return AttackerData(lambda n: (torch.zeros(n, 1), torch.zeros(n, dtype=torch.long)), lambda x, y: toy_evaluate, num_classes=2)


TOY_KNOWN = torch.tensor([[1.0], [3.0]])


def toy_view(receivers=(0, 1), **extra) -> AttackView:
    return AttackView(round=0, attacker=9, receivers=receivers, senders=(0, 1), received=TOY_KNOWN, **extra)


def test_bisection_iterates_by_hand():
    # kept on [0, 0.3]: 0.5 no -> hi 0.5; 0.25 yes -> lo 0.25; 0.375 no -> hi 0.375; lo = 0.25
    calls = []

    def kept(lam):
        calls.append(lam)
        return lam <= 0.3

    assert bisect_kept(kept, 1.0, 3) == 0.25
    assert calls == [1.0, 0.0, 0.5, 0.25, 0.375]


def test_bisection_ends_of_the_interval():
    assert bisect_kept(lambda lam: True, 2.0, 5) == 2.0
    assert bisect_kept(lambda lam: False, 2.0, 5) == 0.0


def test_tpm_aware_finds_the_closed_form_boundary():
    # Prepare: reverse direction d = -2, message(lam) = 2 - 2 lam, loss 4 (1 - lam)^2 <= 5
    # <=> lam <= 1 + sqrt(5)/2 = 2.1180339887...; there the kept losses are 1 and 5, so the
    # paper weighting gives the message 5 / (1 + 5) = 5/6.
    attack = TPMAware(defence=PAPER, attacker_data=toy_data(), lam_max=4.0, steps=40, margin=0.0)
    boundary = 1 + math.sqrt(5) / 2

    # Execute
    crafted = craft_round(attack, toy_view(), seeded())

    # Assert
    assert crafted.note["lam"] == pytest.approx(boundary, abs=1e-6)
    assert crafted.note["lam"] <= boundary
    assert crafted.note["predicted_weight"] == pytest.approx(5 / 6, abs=1e-5)
    assert crafted.note["predicted_score"] == pytest.approx(5.0, abs=1e-5)
    assert crafted.messages[0].item() == pytest.approx(2 - 2 * boundary, abs=1e-5)  # -sqrt(5)
    assert torch.equal(crafted.messages[0], crafted.messages[1])


def test_tpm_aware_margin_steps_back_inside():
    # lam = (1 + sqrt(5)/2) * 0.9 = 1.906230...; message 2 - 2 lam = -1.812461, loss 3.285
    # weight 3.285 / (1 + 3.285) = 0.76667
    attack = TPMAware(defence=PAPER, attacker_data=toy_data(), lam_max=4.0, steps=40, margin=0.1)

    crafted = craft_round(attack, toy_view(), seeded())

    lam = (1 + math.sqrt(5) / 2) * 0.9
    loss = (2 - 2 * lam) ** 2
    assert crafted.note["lam"] == pytest.approx(lam, abs=1e-6)
    assert crafted.note["predicted_weight"] == pytest.approx(loss / (1 + loss), abs=1e-5)


def test_tpm_aware_tailored_centres_on_each_receivers_own_model():
    # Receiver 0 (w = 1): d = -1, loss (1 - lam)^2 <= 5 -> message 1 - (1 + sqrt5) = -sqrt5.
    # Receiver 1 (w = 3): d = -3, loss 9 (1 - lam)^2 <= 5 -> message 3 - 3 (1 + sqrt5/3) = -sqrt5.
    # Receiver 5 sent nothing: centred on the mean 2, as untailored: -sqrt5 too.
    attack = TPMAware(defence=PAPER, attacker_data=toy_data(), lam_max=8.0, steps=50, margin=0.0, tailored=True)

    crafted = craft_round(attack, toy_view(receivers=(0, 1, 5)), seeded())

    per = crafted.note["per_receiver"]
    assert per["0"]["lam"] == pytest.approx(1 + math.sqrt(5), abs=1e-6)
    assert per["1"]["lam"] == pytest.approx(1 + math.sqrt(5) / 3, abs=1e-6)
    assert (per["0"]["centre"], per["5"]["centre"]) == ("own", "mean")
    for k in (0, 1, 5):
        assert crafted.messages[k].item() == pytest.approx(-math.sqrt(5), abs=1e-5)


def test_directions_by_hand():
    known = torch.tensor([[1.0, 2.0], [3.0, -4.0]])  # mean (2, -1); population std (1, 3)
    mean = known.double().mean(0)
    assert harmful_direction("reverse", mean, known, None).tolist() == [-2.0, 1.0]
    assert harmful_direction("alie", mean, known, None).tolist() == [-1.0, -3.0]
    # away: reference (0, 0) - mean (2, -1) = (-2, 1); without a reference: reverse
    assert harmful_direction("away", mean, known, torch.zeros(2)).tolist() == [-2.0, 1.0]
    assert harmful_direction("away", mean, known, torch.tensor([5.0, 5.0])).tolist() == [3.0, 6.0]
    assert harmful_direction("away", mean, known, None).tolist() == [-2.0, 1.0]


def test_alie_with_one_known_model_sends_it():
    # std of one model is 0: every lam gives the model itself (kept: one distinct loss).
    attack = TPMAware(defence=PAPER, attacker_data=toy_data(), direction="alie")
    view = AttackView(round=0, attacker=9, receivers=(0,), senders=(0,), received=torch.tensor([[1.5]]))

    crafted = craft_round(attack, view, seeded())

    assert crafted.messages[0].item() == 1.5
    assert crafted.note["predicted_weight"] == pytest.approx(0.5)


def test_tpm_aware_silent_when_nothing_known():
    attack = TPMAware(defence=PAPER, attacker_data=toy_data())
    view = AttackView(round=0, attacker=9, receivers=(0, 1), senders=(), received=torch.empty(0, 1))

    crafted = craft_round(attack, view, seeded())

    assert crafted.messages == {0: None, 1: None}
    assert crafted.note["known"] == 0


def test_tpm_aware_leaves_non_finite_known_models_out():
    # A NaN row gets no weight at a receiver and no place in its mean: the prediction drops it.
    attack = TPMAware(defence=PAPER, attacker_data=toy_data(), lam_max=4.0, steps=40, margin=0.0)
    view = AttackView(round=0, attacker=9, receivers=(0,), senders=(0, 1, 2), received=torch.tensor([[1.0], [3.0], [math.nan]]))

    crafted = craft_round(attack, view, seeded())

    assert crafted.note["known"] == 2
    assert crafted.note["lam"] == pytest.approx(1 + math.sqrt(5) / 2, abs=1e-6)


@pytest.mark.parametrize(
    "settings",
    [
        {"direction": "sideways"}, {"lam_max": 0.0}, {"lam_max": math.inf}, {"steps": 0}, {"margin": 1.0},
        {"margin": -0.1}, {"samples": 0}, {"tailored": 1},
    ],
)
def test_tpm_aware_bad_settings_raise(settings):
    with pytest.raises(ValueError):
        TPMAware(defence=PAPER, attacker_data=toy_data(), **settings)


@pytest.mark.parametrize("settings", [{"decoy_scale": 0.0}, {"rotate": "yes"}, {"send_decoy": 0}, {"steps": 1.5}])
def test_decoy_stealth_bad_settings_raise(settings):
    with pytest.raises(ValueError):
        DecoyStealth(defence=PAPER, attacker_data=toy_data(), **settings)


@pytest.mark.parametrize("name", ["tpm_aware", "decoy_stealth"])
def test_a_defence_that_is_no_rule_is_refused(name):
    with pytest.raises(ValueError, match="defence must be an aggregation rule"):
        make_attack(name, defence=42, attacker_data=toy_data())


def test_against_a_rule_without_tpm_and_crs_the_whole_rule_is_played():
    # Prepare: the coordinate-wise median of three candidates keeps a candidate in a coordinate
    # only while it is the middle value there, so a message pushed far keeps no coordinate.
    median = build_rule("median")
    attack = make_attack("tpm_aware", defence=median, attacker_data=toy_data(), direction="reverse", lam_max=10.0)

    # Execute
    crafted = craft_round(attack, toy_view(), seeded())

    # Assert: the message still wins coordinates of the median as the attacker predicts it, and
    # a model moved by lam_max would not.
    note = crafted.note
    assert 0 < note["lam"] < 10.0 and note["predicted_weight"] > 0
    known = TOY_KNOWN.to(torch.float64)
    far = (known.mean(0) - 10.0 * known.mean(0)).to(torch.float32)
    agg = median(RoundInputs(own_id=0, round=0, ids=(0, 1, 2), vectors=torch.cat([TOY_KNOWN, far[None]]), num_samples=(1, 1, 1)))
    assert agg.weights[2] == 0


@pytest.mark.parametrize("name", ["tpm_aware", "decoy_stealth"])
def test_what_the_running_system_supplies_is_required_when_it_plans(name):
    # Built by hand or listed without them it constructs; it refuses to plan without them.
    with pytest.raises(ValueError, match="defence must be an aggregation rule"):
        craft_round(make_attack(name), toy_view(), seeded())
    with pytest.raises(ValueError, match="no attacker_data"):
        craft_round(make_attack(name, defence=PAPER), toy_view(), seeded())


# ---------------------------------------------------------------- a tiny softmax regression

FEATURES, CLASSES = 4, 3
CENTRES = torch.tensor([[2.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]])
TEMPLATE = build_model("softmax_regression", FEATURES, CLASSES, hidden=0, seed=0)


def blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = seeded(seed)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return CENTRES[y] + 0.8 * torch.randn(n, FEATURES, generator=g), y


def sample_data(seed: int = 100) -> AttackerData:
    return AttackerData(
        lambda n: blobs(n, seed), lambda x, y: VectorEvaluator(TEMPLATE, Dataset(x, y, CLASSES)), num_classes=CLASSES,
    )


def honest_models(count: int = 4) -> torch.Tensor:
    """Softmax regressions trained a little, each on its own shard (losses near 0.4)."""
    models = []
    for k in range(count):
        model = build_model("softmax_regression", FEATURES, CLASSES, hidden=0, seed=k)
        x, y = blobs(64, k)
        LocalTrainer(model, Dataset(x, y, CLASSES), lr=0.2, batch_size=16, local_steps=30, seed=k).step()
        models.append(get_vector(model))
    return torch.stack(models)


HONEST = honest_models()
POOL_SENDERS = (0, 1, 2, 3)
AUX = VectorEvaluator(TEMPLATE, Dataset(*blobs(150, 7), CLASSES))  # a receiver's own auxiliary set


def weights_at_receiver(extra_ids: tuple[int, ...], extra: list[torch.Tensor]) -> dict[int, float]:
    """DFedReweighting (loss, loss_clip_mean) at receiver 0, its own model HONEST[0], the other
    honest models and ``extra`` (sent by ``extra_ids``) as its neighbours' messages."""
    vectors = torch.cat([HONEST, *(m[None] for m in extra)])
    ids = POOL_SENDERS + extra_ids
    inputs = RoundInputs(own_id=0, round=0, ids=ids, vectors=vectors, num_samples=(1,) * len(ids), evaluate=AUX)
    return PAPER(inputs).weights


def colluder_view(attacker: int, round: int = 0, colluders=(8, 9)) -> AttackView:
    return AttackView(
        round=round, attacker=attacker, receivers=(0, 1), senders=(0, 1), received=HONEST[:2],
        colluders=colluders, pool_senders=POOL_SENDERS, pool=HONEST,
    )


def nothing_known_view() -> AttackView:
    """A colluder's view of a round in which neither it nor its colluders received a model."""
    return AttackView(
        round=0, attacker=9, receivers=(0, 1), senders=(), received=torch.empty(0, HONEST.shape[1]),
        colluders=(8, 9), pool_senders=(), pool=torch.empty(0, HONEST.shape[1]),
    )


def test_tpm_aware_message_is_kept_and_further_from_the_mean():
    # Prepare
    attack = TPMAware(defence=PAPER, attacker_data=sample_data())
    view = AttackView(round=0, attacker=9, receivers=(0, 1), senders=POOL_SENDERS, received=HONEST)
    mean = HONEST.double().mean(0)

    # Execute
    crafted = craft_round(attack, view, seeded())
    message = crafted.messages[0]

    # Assert: predicted kept, moved off the lam = 0 model (the mean), and kept at a receiver
    assert crafted.note["predicted_weight"] > 0 and crafted.note["lam"] > 0
    assert float((message.double() - mean).norm()) > 0
    losses = sample_data().evaluate(200)(torch.stack([message, mean.float()]))["loss"]
    assert losses[0] > losses[1]  # worse than the lam = 0 model, yet predicted kept
    own = TPMAware(defence=PAPER, attacker_data=sample_data(7), samples=150)  # the receiver's aux set: exact
    exact = craft_round(own, view, seeded())
    assert weights_at_receiver((9,), [exact.messages[0]])[9] == pytest.approx(exact.note["predicted_weight"], rel=1e-6)


def test_decoy_and_stealth_agree_across_colluders():
    # Prepare: the same pool, the same round generator, in each colluder
    attack = DecoyStealth(defence=PAPER, attacker_data=sample_data())

    # Execute
    at8 = craft_round(attack, colluder_view(8), seeded(42))
    at9 = craft_round(attack, colluder_view(9), seeded(42))
    next8 = craft_round(attack, colluder_view(8, round=1), seeded(43))

    # Assert: round 0 % 2 -> colluders[0] = 8 is the decoy, 9 the stealth; round 1 rotates
    assert (at8.note["role"], at9.note["role"]) == ("decoy", "stealth")
    assert at8.note["decoy"] == at9.note["decoy"] == 8
    assert at8.note["plan"] == at9.note["plan"] and at8.note["lam"] == at9.note["lam"]
    assert next8.note["role"] == "stealth" and next8.note["decoy"] == 9
    assert torch.equal(at8.messages[0], (-100.0 * HONEST.double().mean(0)).float())
    again = craft_round(attack, colluder_view(9), seeded(42))
    assert torch.equal(again.messages[0], at9.messages[0]) and again.note == at9.note


def test_without_rotation_the_lowest_id_is_always_the_decoy():
    attack = DecoyStealth(defence=PAPER, attacker_data=sample_data(), rotate=False)

    roles = [craft_round(attack, colluder_view(8, round=r, colluders=(9, 8, 12)), seeded(r)).note for r in range(3)]

    assert [n["decoy"] for n in roles] == [8, 8, 8] and {n["role"] for n in roles} == {"decoy"}


def test_stealth_is_kept_beside_the_decoy_and_clipped_without_it():
    # Prepare
    attack = DecoyStealth(defence=PAPER, attacker_data=sample_data())
    decoy = craft_round(attack, colluder_view(8), seeded(42)).messages[0]
    crafted = craft_round(attack, colluder_view(9), seeded(42))
    stealth = crafted.messages[0]

    # Execute: the receiver's actual rule, on its own auxiliary data
    with_decoy = weights_at_receiver((8, 9), [decoy, stealth])
    alone = weights_at_receiver((9,), [stealth])

    # Assert: the decoy is clipped, the stealth model kept (and, under the paper's weighting,
    # heavier than any honest model); sent alone the same model is clipped
    assert with_decoy[8] == 0.0
    assert with_decoy[9] > 0 and with_decoy[9] > max(with_decoy[k] for k in POOL_SENDERS)
    assert crafted.note["predicted_weight"] > 0
    assert alone[9] == 0.0


def test_control_keeps_the_decoy_silent_and_the_stealth_model_unchanged():
    sent = DecoyStealth(defence=PAPER, attacker_data=sample_data())
    control = DecoyStealth(defence=PAPER, attacker_data=sample_data(), send_decoy=False)

    decoy = craft_round(control, colluder_view(8), seeded(42))
    stealth = craft_round(control, colluder_view(9), seeded(42))

    assert decoy.messages == {0: None, 1: None} and decoy.note["sent_decoy"] is False
    assert torch.equal(stealth.messages[0], craft_round(sent, colluder_view(9), seeded(42)).messages[0])


def test_a_single_colluder_acts_as_tpm_aware():
    settings = {"defence": PAPER, "attacker_data": sample_data(), "direction": "alie"}
    view = colluder_view(9, colluders=(9,))

    alone = craft_round(DecoyStealth(**settings), view, seeded(42))
    tpm_aware = craft_round(TPMAware(**settings), view, seeded(42))

    assert alone.note["role"] == "alone"
    assert torch.equal(alone.messages[0], tpm_aware.messages[0])
    assert alone.note["lam"] == tpm_aware.note["lam"]


def test_decoy_stealth_silent_when_nothing_known():
    attack = DecoyStealth(defence=PAPER, attacker_data=sample_data())
    crafted = craft_round(attack, nothing_known_view(), seeded(0))

    assert crafted.messages == {0: None, 1: None}
    assert crafted.note == {"role": "stealth", "decoy": 8, "known": 0}


def test_bisection_from_a_clipped_centre_starts_at_the_first_kept_grid_point():
    # kept on [0.25, 0.6]: 1 no, 0 no, grid 0.25 yes -> [0.25, 1]; 0.625 no; 0.4375 yes;
    # 0.53125 yes; 0.578125 yes -> 0.578125
    assert bisect_kept(lambda lam: 0.25 <= lam <= 0.6, 1.0, 4) == 0.578125
    assert bisect_kept(lambda lam: 0.9 < lam < 0.95, 1.0, 4) == 0.0  # between grid points: none found


# ---------------------------------------------------------------- colluding twins

ColludingTwins = ATTACK_REGISTRY.resolve("colluding_twins")
KRUM_SCREEN = build_rule("multi_krum", rule_params={"num_byzantine": 2})


def test_twins_agree_across_colluders():
    # Prepare: the same pool in each colluder
    attack = ColludingTwins(defence=PAPER, attacker_data=sample_data())

    # Execute
    at8 = craft_round(attack, colluder_view(8), seeded(42))
    at9 = craft_round(attack, colluder_view(9), seeded(7))

    # Assert: one plan, one message, to every receiver
    assert at8.note["role"] == at9.note["role"] == "twin" and at8.note["copies"] == 2
    assert at8.note["plan"] == at9.note["plan"] and at8.note["lam"] == at9.note["lam"]
    assert torch.equal(at8.messages[0], at9.messages[1])


def test_twins_go_further_than_one_attacker_before_the_krum_screen_drops_them():
    # Prepare: multi-Krum told 2 keeps C - 2 of the candidates by Krum's score. Two equal
    # copies are each other's nearest (distance 0), so each counts one honest distance fewer.
    twins = ColludingTwins(defence=KRUM_SCREEN, attacker_data=sample_data())
    alone = TPMAware(defence=KRUM_SCREEN, attacker_data=sample_data())
    view = AttackView(round=0, attacker=9, receivers=(0, 1), senders=POOL_SENDERS, received=HONEST, colluders=(8, 9), pool_senders=POOL_SENDERS, pool=HONEST)

    # Execute
    pair = craft_round(twins, view, seeded())
    single = craft_round(alone, view, seeded())

    # Assert: both predicted kept, the twins at a larger scale
    assert pair.note["predicted_weight"] > 0 and single.note["predicted_weight"] > 0
    assert pair.note["lam"] > single.note["lam"] > 0
    message = pair.messages[0]
    ids = (*POOL_SENDERS, 8, 9)
    with_both = KRUM_SCREEN(RoundInputs(own_id=0, round=0, ids=ids, vectors=torch.cat([HONEST, message[None], message[None]]), num_samples=(1,) * 6))
    assert with_both.weights[8] > 0 and with_both.weights[9] > 0
    with_one = KRUM_SCREEN(RoundInputs(own_id=0, round=0, ids=ids[:5], vectors=torch.cat([HONEST, message[None]]), num_samples=(1,) * 5))
    assert with_one.weights[8] == 0  # alone at that scale the screen drops it


def test_a_single_twin_acts_as_tpm_aware():
    attack = ColludingTwins(defence=PAPER, attacker_data=sample_data())
    view = AttackView(round=0, attacker=9, receivers=(0, 1), senders=POOL_SENDERS, received=HONEST)

    crafted = craft_round(attack, view, seeded())
    expected = craft_round(TPMAware(defence=PAPER, attacker_data=sample_data()), view, seeded())

    assert crafted.note["role"] == "alone"
    assert torch.equal(crafted.messages[0], expected.messages[0])


def test_twins_silent_when_nothing_known():
    attack = ColludingTwins(defence=PAPER, attacker_data=sample_data())
    crafted = craft_round(attack, nothing_known_view(), seeded(0))

    assert crafted.messages == {0: None, 1: None}
    assert crafted.note == {"role": "twin", "known": 0}


def test_the_screened_rule_is_played_whole():
    # Prepare: ScreenedReweighting has a TPM and a CRS, but its screen decides too: the
    # attacker's prediction must be the rule's own weight for the message beside the pool.
    rule = build_rule("screened_reweighting", "loss", "loss_drop_highest", crs_params={"num_byzantine": 1}, rule_params={"num_byzantine": 1})
    attack = TPMAware(defence=rule, attacker_data=sample_data(7), samples=150, margin=0.0)
    view = AttackView(round=0, attacker=9, receivers=(0, 1), senders=POOL_SENDERS, received=HONEST)

    # Execute
    crafted = craft_round(attack, view, seeded())

    # Assert: the rule, run on the candidates the attacker predicted (the first known model as
    # the receiver's own, its sample as the receiver's data: exact here), gives the predicted weight
    message = crafted.messages[0]
    agg = rule(RoundInputs(own_id=0, round=0, ids=(0, 1, 2, 3, 4), vectors=torch.cat([HONEST, message[None]]), num_samples=(1,) * 5, evaluate=AUX))
    assert agg.weights[4] == pytest.approx(crafted.note["predicted_weight"], rel=1e-6)
    assert crafted.note["predicted_weight"] > 0
