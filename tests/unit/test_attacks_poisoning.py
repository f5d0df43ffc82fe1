"""Unit tests for the data-poisoning attacks (peer.attacks.poisoning)."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.nn import functional as F

from dfedrw.peer.attacks import ATTACK_REGISTRY, AttackerData, AttackView, craft_round, make_attack
from dfedrw.peer.learning.data import Dataset
from dfedrw.peer.learning.models import build_model
from dfedrw.peer.learning.model_matrix import VectorEvaluator

# Through the registry, which imports every attack module in its declared order: importing this
# module first would register its attack first and reorder `dfedrw list` and the README table.
LabelFlip = ATTACK_REGISTRY.resolve("label_flip")
flip_labels = importlib.import_module(LabelFlip.__module__).flip_labels

FEATURES, CLASSES = 2, 3
TEMPLATE = build_model("softmax_regression", FEATURES, CLASSES, hidden=0, seed=0)  # D = 3*2 + 3 = 9


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sample_data(x: torch.Tensor, y: torch.Tensor) -> AttackerData:
    return AttackerData(lambda n: (x[:n], y[:n]), lambda a, b: VectorEvaluator(TEMPLATE, Dataset(a, b, CLASSES)), num_classes=CLASSES)


def view(received: torch.Tensor, receivers=(0, 1)) -> AttackView:
    return AttackView(round=0, attacker=9, receivers=receivers, senders=tuple(range(len(received))), received=received)


def test_flipped_labels_by_hand():
    y = torch.tensor([0, 1, 2, 9])
    assert flip_labels(y, 10, "reverse").tolist() == [9, 8, 7, 0]
    assert flip_labels(y, 10, "shift").tolist() == [1, 2, 3, 0]


def test_one_step_on_the_whole_sample_by_hand():
    # Prepare: two received models of zeros and ones (mean 0.5 everywhere); one sample
    # x = (1, 2), y = 0, flipped (reverse, C = 3) to 2; one full-batch SGD step, lr 0.1.
    # logits = W x + b = (0.5*1 + 0.5*2 + 0.5) = 2 for every class -> p = (1/3, 1/3, 1/3)
    # dCE/dlogits = p - e_2 = (1/3, 1/3, -2/3); dW = (p - e_2) x^T, db = p - e_2
    # w' = 0.5 - 0.1 * grad: W rows (0.5 - 0.1/3 * (1, 2)), ..., (0.5 + 0.2/3 * (1, 2))
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([0])
    attack = LabelFlip(attacker_data=sample_data(x, y), lr=0.1, steps=1, batch_size=1, samples=1)
    received = torch.stack([torch.zeros(9), torch.ones(9)])

    # Execute
    crafted = craft_round(attack, view(received), seeded())

    # Assert
    g = torch.tensor([1 / 3, 1 / 3, -2 / 3])
    weight = 0.5 - 0.1 * g[:, None] * torch.tensor([1.0, 2.0])[None, :]
    expected = torch.cat([weight.reshape(-1), 0.5 - 0.1 * g])
    assert torch.allclose(crafted.messages[0], expected, atol=1e-6)
    assert torch.equal(crafted.messages[0], crafted.messages[1])
    assert crafted.note["flipped_loss"] == pytest.approx(torch.log(torch.tensor(3.0)).item(), abs=1e-6)


def test_training_lowers_the_flipped_loss_and_raises_the_true_one():
    # Prepare: three separable clusters; start from a model that classifies them right
    g = seeded(1)
    y = torch.randint(0, CLASSES, (120,), generator=g)
    x = torch.tensor([[3.0, 0.0], [0.0, 3.0], [-3.0, -3.0]])[y] + 0.5 * torch.randn(120, 2, generator=g)
    good = torch.cat([torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]).reshape(-1), torch.zeros(3)])
    attack = LabelFlip(attacker_data=sample_data(x, y), lr=0.5, steps=40, batch_size=16, samples=120, flip="shift")

    # Execute
    message = craft_round(attack, view(good[None]), seeded(2)).messages[0]

    # Assert: judged on the sample, the message fits the shifted labels and not the true ones
    def ce(vector, labels):
        weight, bias = vector[:6].view(3, 2), vector[6:]
        return float(F.cross_entropy(x @ weight.t() + bias, labels))

    shifted = flip_labels(y, CLASSES, "shift")
    assert ce(message, shifted) < ce(good, shifted)
    assert ce(message, y) > ce(good, y)


def test_lr_scale_multiplies_the_supplied_lr():
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([0])
    received = torch.stack([torch.zeros(9), torch.ones(9)])

    scaled = craft_round(LabelFlip(attacker_data=sample_data(x, y), lr=0.1, lr_scale=3.0, steps=1, samples=1), view(received), seeded())
    direct = craft_round(LabelFlip(attacker_data=sample_data(x, y), lr=0.3, steps=1, samples=1), view(received), seeded())

    assert scaled.note["lr"] == pytest.approx(0.3)
    assert torch.allclose(scaled.messages[0], direct.messages[0], atol=1e-7)


def test_minibatches_come_from_the_generator():
    # Prepare
    g = seeded(3)
    x, y = torch.randn(50, 2, generator=g), torch.randint(0, CLASSES, (50,), generator=g)
    attack = LabelFlip(attacker_data=sample_data(x, y), lr=0.1, steps=3, batch_size=4, samples=50)
    received = torch.randn(2, 9, generator=g)

    # Execute
    first = craft_round(attack, view(received), seeded(7)).messages[0]
    again = craft_round(attack, view(received), seeded(7)).messages[0]
    other = craft_round(attack, view(received), seeded(8)).messages[0]

    # Assert
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_silent_when_nothing_known_and_one_known_model_is_the_start():
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([0])
    attack = LabelFlip(attacker_data=sample_data(x, y), lr=0.1, steps=1, samples=1)

    nothing = craft_round(attack, view(torch.empty(0, 9)), seeded())
    one = craft_round(attack, view(torch.full((1, 9), 0.5)), seeded())
    two = craft_round(attack, view(torch.stack([torch.zeros(9), torch.ones(9)])), seeded())

    assert nothing.messages == {0: None, 1: None} and nothing.note == {"known": 0}
    assert torch.equal(one.messages[0], two.messages[0])  # the same start, 0.5 everywhere


def test_built_from_the_registry_with_the_supplied_lr():
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([0])

    attack = make_attack("label_flip", attacker_data=sample_data(x, y), lr=0.05, flip="shift")

    assert (attack.lr, attack.flip, attack.samples) == (0.05, "shift", 200)


@pytest.mark.parametrize(
    "settings",
    [{"lr": 0.0}, {"steps": 0}, {"lr_scale": -1.0}, {"batch_size": 0}, {"flip": "random"}, {"samples": 0}, {"attacker_data": object()}],
)
def test_bad_settings_raise(settings):
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([0])
    with pytest.raises(ValueError):
        LabelFlip(**{"attacker_data": sample_data(x, y), "lr": 0.1, **settings})


def test_without_a_sample_it_refuses_to_plan():
    with pytest.raises(ValueError, match="no attacker_data"):
        craft_round(make_attack("label_flip"), view(torch.zeros(1, 9)), seeded())


def test_an_evaluator_without_the_model_is_refused():
    data = AttackerData(lambda n: (torch.zeros(n, 2), torch.zeros(n, dtype=torch.long)), lambda a, b: (lambda v: {}), num_classes=CLASSES)
    attack = LabelFlip(attacker_data=data, lr=0.1, samples=1)

    with pytest.raises(ValueError, match="VectorEvaluator"):
        craft_round(attack, view(torch.zeros(1, 9)), seeded())
