"""Unit tests for the backdoor attacks (peer.attacks.backdoor): the trigger, the poisoned rows,
the probe a success rate is read on, BadNets' round."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

from dfedrw.peer.attacks import ATTACK_REGISTRY, AttackerData, AttackView, craft_round
from dfedrw.peer.attacks.backdoor import Backdoor, Trigger, attack_success_rate
from dfedrw.peer.learning.data import Dataset
from dfedrw.peer.learning.models import build_model, get_vector, set_vector
from dfedrw.peer.learning.model_matrix import VectorEvaluator
from dfedrw.peer.learning.training import LocalTrainer

BadNets = ATTACK_REGISTRY.resolve("badnets")
SHAPE = (1, 4, 4)  # 16 features
CLASSES = 3
TEMPLATE = build_model("softmax_regression", 16, CLASSES, hidden=0, seed=0)  # D = 3*16 + 3 = 51


def test_a_square_in_the_bottom_right_corner_by_hand():
    # Rows 2-3, columns 2-3 of a 4x4 image: flat 2*4+2, 2*4+3, 3*4+2, 3*4+3.
    index, values = Trigger(size=2, margin=0).pixels(SHAPE)
    assert index.tolist() == [10, 11, 14, 15]
    assert values.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_the_pattern_is_a_checkerboard_in_every_channel():
    # Top left, one pixel in: rows 1-2, columns 1-2 -> 5, 6, 9, 10; the second channel 16 further.
    index, values = Trigger("pattern", "top_left", size=2, margin=1, value=0.5).pixels((2, 4, 4))
    assert index.tolist() == [5, 6, 9, 10, 21, 22, 25, 26]
    assert values.tolist() == [0.5, 0.0, 0.0, 0.5] * 2


@pytest.mark.parametrize("corner, expected", [("top_right", [2, 3, 6, 7]), ("bottom_left", [8, 9, 12, 13])])
def test_each_corner(corner, expected):
    assert Trigger(corner=corner, size=2, margin=0).pixels(SHAPE)[0].tolist() == expected


def test_apply_stamps_the_trigger_and_leaves_every_other_pixel():
    x = torch.rand(5, 16) * 0.5
    out = Trigger(size=2, margin=0).apply(x, SHAPE)
    assert torch.equal(out[:, [10, 11, 14, 15]], torch.ones(5, 4))
    keep = [i for i in range(16) if i not in (10, 11, 14, 15)]
    assert torch.equal(out[:, keep], x[:, keep])
    assert not torch.equal(out, x) and x.max() <= 0.5  # a copy: the input is unchanged


def test_a_trigger_that_does_not_fit_or_a_bad_setting_is_refused():
    with pytest.raises(ValueError, match=r"does not fit a 4x4 image; use size \+ margin <= 4"):
        Trigger(size=4, margin=1).pixels(SHAPE)
    with pytest.raises(ValueError, match="needs images"):
        Trigger().pixels((16,))
    with pytest.raises(ValueError, match=r"value must be a pixel value in \[0, 1\]"):
        Trigger(value=2.0)
    with pytest.raises(ValueError, match="corner"):
        Trigger(corner="middle")
    with pytest.raises(ValueError, match=r"rows must be \[n, 16\]"):
        Trigger(size=1).apply(torch.zeros(2, 15), SHAPE)


def test_poison_triggers_and_relabels_an_evenly_spread_fraction():
    x, y = torch.zeros(8, 16), torch.tensor([1, 2, 1, 2, 1, 2, 1, 2])
    px, py = Backdoor(Trigger(size=1, margin=0), target=0).poison(x, y, 0.5, SHAPE)
    # round(0.5 * 8) = 4 rows: 0, 2, 4, 6 (i * 8 // 4); the 1x1 trigger is pixel 15.
    assert py.tolist() == [0, 2, 0, 2, 0, 2, 0, 2]
    assert px[:, 15].tolist() == [1, 0, 1, 0, 1, 0, 1, 0]
    assert px[:, :15].abs().sum() == 0 and x.abs().sum() == 0


def test_the_probe_keeps_the_other_classes_triggered_and_labelled_the_target():
    test = Dataset(x=torch.zeros(5, 16), y=torch.tensor([0, 1, 2, 0, 1]), num_classes=CLASSES)
    probe = Backdoor(Trigger(size=1, margin=0), target=0).probe(test, SHAPE)
    assert probe.y.tolist() == [0, 0, 0] and probe.x[:, 15].tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match="target class 3 outside 0..2"):
        Backdoor(Trigger(), target=3).probe(test, SHAPE)


def test_the_success_rate_counts_predictions_of_the_target():
    assert attack_success_rate(torch.tensor([0, 0, 2, 0]), 0) == 0.75
    assert attack_success_rate(torch.tensor([1, 2]), 0) == 0.0
    with pytest.raises(ValueError, match="no probe rows"):
        attack_success_rate(torch.tensor([], dtype=torch.long), 0)


def _data(x: torch.Tensor, y: torch.Tensor) -> AttackerData:
    return AttackerData(
        lambda n: (x[:n], y[:n]), lambda a, b: VectorEvaluator(TEMPLATE, Dataset(a, b, CLASSES)), num_classes=CLASSES, input_shape=SHAPE
    )


def _view(received: torch.Tensor) -> AttackView:
    return AttackView(round=0, attacker=9, receivers=(0, 1), senders=tuple(range(len(received))), received=received)


def test_badnets_sends_the_model_trained_from_the_mean_on_its_poisoned_sample():
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(10, 16, generator=g), torch.randint(0, CLASSES, (10,), generator=g)
    received = torch.randn(2, 51, generator=g)
    attack = BadNets(attacker_data=_data(x, y), samples=10, steps=3, batch_size=4, lr=0.1, target=2, trigger_size=2, trigger_margin=0)
    crafted = craft_round(attack, _view(received), torch.Generator().manual_seed(0))

    # By hand: rows 0, 2, 4, 6, 8 triggered (pixels 10, 11, 14, 15) and labelled 2; three steps
    # from the received mean, the minibatch seed the attack's generator's first draw.
    px, py = x.clone(), y.clone()
    for row in (0, 2, 4, 6, 8):
        px[row, [10, 11, 14, 15]] = 1.0
        py[row] = 2
    model = copy.deepcopy(TEMPLATE)
    set_vector(model, received.to(torch.float64).mean(dim=0))
    seed = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(0)))
    LocalTrainer(model, Dataset(px, py, CLASSES), lr=0.1, batch_size=4, local_steps=3, seed=seed).step()
    assert torch.equal(crafted.messages[0], get_vector(model)) and crafted.messages[1] is crafted.messages[0]
    assert crafted.note["known"] == 2 and crafted.note["steps"] == 3


def test_badnets_is_silent_with_nothing_known_and_needs_its_sample():
    attack = BadNets(attacker_data=_data(torch.zeros(4, 16), torch.zeros(4, dtype=torch.long)), samples=4)
    assert craft_round(attack, _view(torch.empty(0, 51)), torch.Generator()).messages == {0: None, 1: None}
    with pytest.raises(ValueError, match="no attacker_data"):
        BadNets().plan(_view(torch.zeros(1, 51)), torch.Generator())
    with pytest.raises(ValueError, match="target class 3 outside 0..2"):
        BadNets(attacker_data=_data(torch.zeros(4, 16), torch.zeros(4, dtype=torch.long)), target=3).plan(_view(torch.zeros(1, 51)), torch.Generator())


@pytest.mark.parametrize(
    "settings, message",
    [({"poisoned_fraction": 0.0}, r"poisoned_fraction must be in \(0, 1\]"), ({"target": -1}, "target"), ({"trigger": "star"}, "shape"),
     ({"trigger_value": -0.5}, r"\[0, 1\]")],
)
def test_badnets_refuses_bad_settings_when_built(settings, message):
    with pytest.raises(ValueError, match=message):
        BadNets(**settings)


def test_badnets_says_what_it_plants():
    assert BadNets(target=4, trigger="pattern", trigger_size=5).backdoor == Backdoor(Trigger("pattern", "bottom_right", 5, 1, 1.0), 4)


# -- the boosted, distributed and durable backdoors ---------------------------------------------
ModelReplacement = ATTACK_REGISTRY.resolve("model_replacement")
DistributedBackdoor = ATTACK_REGISTRY.resolve("dba")
Neurotoxin = ATTACK_REGISTRY.resolve("neurotoxin")
boosted = importlib.import_module(ModelReplacement.__module__)


def test_a_trigger_in_bands_of_rows():
    # A 3-pixel patch one pixel in from the bottom right of a 4x4 image starts at row and column
    # 4 - 1 - 3 = 0: rows 0-2, columns 0-2.
    whole = Trigger(size=3, margin=1).pixels(SHAPE)[0].tolist()
    assert whole == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    # Two parts: rows 3*0//2 .. 3*1//2 - 1 = row 0, then rows 1-2.
    assert Trigger(size=3, margin=1).part(0, 2).pixels(SHAPE)[0].tolist() == [0, 1, 2]
    assert Trigger(size=3, margin=1).part(1, 2).pixels(SHAPE)[0].tolist() == [4, 5, 6, 8, 9, 10]
    with pytest.raises(ValueError, match="cannot be split into 4 bands"):
        Trigger(size=3).part(0, 4)


def test_an_update_is_bounded_in_norm_and_the_most_changed_coordinates_are_found():
    assert torch.allclose(boosted.bounded(torch.tensor([3.0, 4.0]), 1.0), torch.tensor([0.6, 0.8]))
    assert torch.equal(boosted.bounded(torch.tensor([3.0, 4.0]), 10.0), torch.tensor([3.0, 4.0]))
    assert torch.equal(boosted.bounded(torch.tensor([3.0, 4.0]), 0.0), torch.tensor([3.0, 4.0]))
    assert boosted.top_changed(torch.tensor([0.1, -3.0, 2.0, 0.0]), 0.5).tolist() == [False, True, True, False]
    # ceil(0.2 * 4) = 1; a tie goes to the lower index.
    assert boosted.top_changed(torch.tensor([1.0, -1.0, 0.5, 0.0]), 0.2).tolist() == [True, False, False, False]
    assert not boosted.top_changed(torch.tensor([1.0, 2.0]), 0.0).any()


def _sample():
    g = torch.Generator().manual_seed(3)
    return _data(torch.rand(10, 16, generator=g), torch.randint(0, CLASSES, (10,), generator=g)), torch.randn(2, 51, generator=g)


def test_model_replacement_boosts_the_backdoored_update_and_bounds_it():
    data, received = _sample()
    settings = dict(attacker_data=data, samples=10, steps=2, batch_size=5, lr=0.1, trigger_size=2)
    plain = craft_round(BadNets(**settings), _view(received), torch.Generator().manual_seed(0)).messages[0].to(torch.float64)
    centre = received.to(torch.float64).mean(dim=0)
    crafted = craft_round(ModelReplacement(**settings, boost=3.0), _view(received), torch.Generator().manual_seed(0))
    assert torch.allclose(crafted.messages[0].to(torch.float64), centre + 3 * (plain - centre), atol=1e-5)
    # boost 0: the models known + 1 = 3 as well.
    auto = craft_round(ModelReplacement(**settings), _view(received), torch.Generator().manual_seed(0))
    assert auto.note["boost"] == 3.0 and torch.equal(auto.messages[0], crafted.messages[0])
    capped = craft_round(ModelReplacement(**settings, boost=3.0, norm_bound=0.01), _view(received), torch.Generator().manual_seed(0))
    sent = capped.messages[0].to(torch.float64) - centre
    assert abs(float(torch.linalg.vector_norm(sent)) - 0.01) < 1e-4 and capped.note["sent_norm"] == pytest.approx(0.01)
    assert capped.note["update_norm"] == pytest.approx(crafted.note["update_norm"])


def test_each_dba_colluder_plants_its_band_of_the_trigger():
    data, received = _sample()
    attack = DistributedBackdoor(attacker_data=data, samples=10, steps=2, batch_size=5, lr=0.1, trigger_size=2, trigger_margin=0)
    for attacker, part in ((3, 0), (7, 1)):
        view = AttackView(round=0, attacker=attacker, receivers=(0,), senders=(0, 1), received=received, colluders=(7, 3), pool_senders=(0, 1), pool=received)
        crafted = craft_round(attack, view, torch.Generator().manual_seed(0))
        assert crafted.note["part"] == part and crafted.note["colluders"] == [3, 7]
        # The same model as BadNets' with the band's trigger alone (pixels 10, 11, then 14, 15).
        local = Trigger(size=2, margin=0).part(part, 2)
        assert local.pixels(SHAPE)[0].tolist() == [[10, 11], [14, 15]][part]
        by_hand = attack.poisoned_step(view, torch.Generator().manual_seed(0), local)[1]
        assert torch.allclose(crafted.messages[0], by_hand, atol=1e-6)
    assert attack.backdoor.trigger == Trigger(size=2, margin=0)  # measured with the whole trigger


def test_neurotoxin_leaves_the_most_changed_coordinates_at_the_mean():
    data, received = _sample()
    reference = received.to(torch.float64).mean(dim=0).clone()
    reference[:5] += 100.0  # the honest models moved most on coordinates 0..4
    view = AttackView(round=1, attacker=9, receivers=(0,), senders=(0, 1), received=received, reference=reference)
    attack = Neurotoxin(attacker_data=data, samples=10, steps=2, batch_size=5, lr=0.1, trigger_size=2, mask_fraction=5 / 51)
    crafted = craft_round(attack, view, torch.Generator().manual_seed(0))
    centre = received.to(torch.float64).mean(dim=0).to(torch.float32)
    assert crafted.note["masked"] == 5
    assert torch.equal(crafted.messages[0][:5], centre[:5]) and not torch.equal(crafted.messages[0][5:], centre[5:])
    first = craft_round(attack, _view(received), torch.Generator().manual_seed(0))
    assert first.note["masked"] == 0  # no reference in its first round: nothing masked
