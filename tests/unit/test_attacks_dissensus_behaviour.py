"""Unit tests for the dissensus attack (peer.attacks.dissensus) and the omission behaviour
(peer.attacks.behaviour)."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfedrw.peer.attacks import ATTACK_REGISTRY, AttackView, craft_round, make_attack

# Through the registry, which imports the attack modules in their declared order: importing
# behaviour before dissensus here would register omission first and reorder the README table.
Dissensus = ATTACK_REGISTRY["dissensus"]
Omission = ATTACK_REGISTRY["omission"]


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def view_of(models, *, senders=None, receivers=(0, 1), round=1, colluders=(), pool=None, attacker=9):
    received = torch.tensor(models, dtype=torch.float32) if len(models) else torch.empty(0, 2)
    senders = tuple(range(len(models))) if senders is None else senders
    return AttackView(
        round=round, attacker=attacker, receivers=receivers, senders=senders, received=received,
        colluders=colluders, pool_senders=tuple(range(len(pool))) if pool is not None else (),
        pool=None if pool is None else torch.tensor(pool, dtype=torch.float32),
    )


# Models of senders 0, 1, 2.
TRIANGLE = [[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]]


# ---------------------------------------------------------------- dissensus


def test_dissensus_hand_computed_with_neighbour_counts():
    # Prepare: receiver 0: x = (0,0), others' mean ((2,0) + (0,2)) / 2 = (1,1), ratio 2 / 1 = 2:
    # (0,0) + 1.5 * 2 * ((0,0) - (1,1)) = (-3,-3). Receiver 1: x = (2,0), others' mean (0,1):
    # (2,0) + 3 * (2,-1) = (8,-3). Receiver 5 sent nothing: silent.
    view = view_of(TRIANGLE, receivers=(0, 1, 5))

    # Execute
    crafted = craft_round(Dissensus(), view, seeded())

    # Assert
    assert torch.equal(crafted.messages[0], torch.tensor([-3.0, -3.0]))
    assert torch.equal(crafted.messages[1], torch.tensor([8.0, -3.0]))
    assert crafted.messages[5] is None
    assert crafted.note == {"epsilon": 1.5, "scale": "neighbour_counts", "pushed": [0, 1]}
    json.dumps(crafted.note)


def test_dissensus_without_scaling():
    # Receiver 0: (0,0) + 1.5 * ((0,0) - (1,1)) = (-1.5,-1.5).
    crafted = craft_round(Dissensus(scale="none"), view_of(TRIANGLE, receivers=(0,)), seeded())
    assert torch.equal(crafted.messages[0], torch.tensor([-1.5, -1.5]))


def test_dissensus_colluding_uses_the_pool_and_counts_the_colluders():
    # Prepare: it received only sender 0's model; the pool holds all three. Ratio 2 / 2 = 1:
    # receiver 0: (0,0) + 1.5 * 1 * ((0,0) - (1,1)) = (-1.5,-1.5).
    view = view_of([[0.0, 0.0]], receivers=(0,), colluders=(8, 9), pool=TRIANGLE)

    # Execute
    crafted = craft_round(Dissensus(), view, seeded())

    # Assert
    assert torch.equal(crafted.messages[0], torch.tensor([-1.5, -1.5]))


def test_dissensus_echoes_the_receiver_when_it_knows_no_other_model_and_is_silent_with_none():
    # Prepare
    alone = view_of([[3.0, -1.0]], receivers=(0,))
    nothing = view_of([], receivers=(0, 1))

    # Execute / Assert
    assert torch.equal(craft_round(Dissensus(), alone, seeded()).messages[0], torch.tensor([3.0, -1.0]))
    assert craft_round(Dissensus(), nothing, seeded()).messages == {0: None, 1: None}


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6), st.integers(1, 10), st.floats(1.01, 4.0))
def test_dissensus_with_exact_estimates_cancels_or_reverses_uniform_gossip(seed, count, dim, epsilon):
    # Prepare: the receiver 0 averages uniformly its own model, its honest neighbours (exactly
    # the other known models) and the one Byzantine message: that is the paper's setting.
    models = torch.randn(count, dim, generator=seeded(seed), dtype=torch.float64)
    view = AttackView(round=1, attacker=9, receivers=(0,), senders=tuple(range(count)), received=models.float())
    own, others = models.float().double()[0], models.float().double()[1:]

    def gossip(eps):
        message = Dissensus(epsilon=eps).plan(view, seeded()).messages[0].double()
        return (own + others.sum(dim=0) + message) / (count + 1)

    # Execute
    frozen, pushed = gossip(1.0), gossip(epsilon)

    # Assert: epsilon = 1 cancels the pull towards the neighbours; epsilon > 1 moves the
    # receiver farther from their mean than it was.
    assert torch.allclose(frozen, own, atol=1e-5 * (1 + float(own.abs().max())))
    target = others.mean(dim=0)
    before = float(torch.linalg.vector_norm(own - target))
    after = float(torch.linalg.vector_norm(pushed - target))
    assert after >= before


def test_dissensus_is_deterministic_and_tailored():
    view = view_of(TRIANGLE, receivers=(0, 1, 2))
    first = craft_round(Dissensus(), view, seeded(1))
    second = craft_round(Dissensus(), view, seeded(2))
    assert all(torch.equal(first.messages[k], second.messages[k]) for k in (0, 1, 2))
    assert not torch.equal(first.messages[0], first.messages[1])
    assert ATTACK_REGISTRY["dissensus"].threat_model.tailored


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"epsilon": 0.0}, "epsilon must be > 0"),
        ({"epsilon": -1.0}, "epsilon must be > 0"),
        ({"epsilon": float("nan")}, "epsilon must be finite"),
        ({"scale": "weights"}, "scale must be one of"),
    ],
)
def test_dissensus_refuses_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Dissensus(**kwargs)


# ---------------------------------------------------------------- omission


def test_omission_schedule():
    # every 3, phase 1, within [2, 9): rounds 4 and 7 (1 is before the window, 10 after it).
    attack = Omission(every=3, phase=1, start=2, stop=9)
    assert [t for t in range(12) if attack.silent_in(t)] == [4, 7]
    # Defaults: every even round, for ever.
    assert [t for t in range(6) if Omission().silent_in(t)] == [0, 2, 4]
    # every = 1: a crash from start on.
    assert [t for t in range(6) if Omission(every=1, start=3).silent_in(t)] == [3, 4, 5]


def test_omission_silent_round_and_mean_round():
    # Prepare: mean of the triangle = (2/3, 2/3).
    attack = Omission()

    # Execute
    silent = craft_round(attack, view_of(TRIANGLE, round=2), seeded())
    speaking = craft_round(attack, view_of(TRIANGLE, round=3), seeded())

    # Assert
    assert silent.messages == {0: None, 1: None} and silent.note == {"silent": True}
    assert speaking.note == {"silent": False}
    assert torch.allclose(speaking.messages[0], torch.tensor([2 / 3, 2 / 3]))
    assert torch.equal(speaking.messages[0], speaking.messages[1])


def test_omission_gaussian_is_the_mean_plus_one_draw_per_round():
    # Prepare: the draw the attack will make from the same generator state
    z = torch.randn(2, generator=seeded(3), dtype=torch.float64)
    expected = (torch.tensor([2 / 3, 2 / 3], dtype=torch.float64) + 0.5 * z).float()

    # Execute
    crafted = craft_round(Omission(otherwise="gaussian", std=0.5), view_of(TRIANGLE, round=1), seeded(3))

    # Assert
    assert torch.allclose(crafted.messages[0], expected, atol=1e-6)
    assert torch.equal(crafted.messages[0], crafted.messages[1])


def test_omission_gaussian_colluders_draw_their_own_noise():
    attack = Omission(otherwise="gaussian", std=1.0)
    eight = view_of(TRIANGLE, colluders=(8, 9), pool=TRIANGLE, attacker=8)
    nine = view_of(TRIANGLE, colluders=(8, 9), pool=TRIANGLE, attacker=9)
    a = craft_round(attack, eight, seeded(4)).messages[0]
    b = craft_round(attack, nine, seeded(4)).messages[0]
    again = craft_round(attack, nine, seeded(4)).messages[0]
    assert not torch.equal(a, b) and torch.equal(b, again)


def test_omission_is_silent_when_it_knows_nothing_in_a_speaking_round():
    crafted = craft_round(Omission(), view_of([], round=1), seeded())
    assert crafted.messages == {0: None, 1: None}
    assert crafted.note == {"silent": True, "why": "knows no model"}


def test_omission_from_the_registry():
    attack = make_attack("omission", every=1)
    assert attack == Omission(every=1)
    assert all(craft_round(attack, view_of(TRIANGLE, round=t), seeded()).messages[0] is None for t in range(4))
    assert not ATTACK_REGISTRY["omission"].threat_model.tailored


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"every": 0}, "every must be >= 1"),
        ({"every": True}, "every must be an integer"),
        ({"every": 2, "phase": 2}, "phase must be < every"),
        ({"phase": -1}, "phase must be >= 0"),
        ({"start": -1}, "start must be >= 0"),
        ({"start": 5, "stop": 5}, "stop must be > start"),
        ({"stop": 2.5}, "stop must be an integer"),
        ({"otherwise": "sign_flip"}, "otherwise must be one of"),
        ({"std": 0.0}, "std must be > 0"),
    ],
)
def test_omission_refuses_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Omission(**kwargs)
