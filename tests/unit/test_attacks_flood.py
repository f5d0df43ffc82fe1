"""The flooding attack: stale and far-future copies besides a benign-looking model."""

from __future__ import annotations

import pytest
import torch

from dfedrw.peer.attacks import AttackView, Crafted, craft_round, make_attack

KNOWN = torch.tensor([[1.0, 2.0], [3.0, 6.0]])  # mean [2, 4]


def view(round_: int, received: torch.Tensor = KNOWN) -> AttackView:
    return AttackView(round=round_, attacker=9, receivers=(0, 1), senders=tuple(range(len(received))), received=received)


def test_both_kinds_label_copies_behind_and_beyond_the_window():
    # round 5, lag 2: stale label 3; window 2, lead 1: future label 5 + 2 + 2 + 1 = 10
    attack = make_attack("flood", kind="both", copies=2, lag=2, lead=1, round_window=2)
    crafted = craft_round(attack, view(5), torch.Generator())
    assert all(torch.equal(m, torch.tensor([2.0, 4.0])) for m in crafted.messages.values())
    assert [r for r, _ in crafted.extra[0]] == [3, 3, 10, 10] and [r for r, _ in crafted.extra[1]] == [3, 3, 10, 10]
    assert all(torch.equal(m, torch.tensor([2.0, 4.0])) for _, m in crafted.extra[1])
    assert crafted.note == {"stale": 2, "future": 2}


def test_no_stale_label_before_round_lag_and_one_kind_only():
    assert make_attack("flood", kind="both", lag=3, round_window=2).labels(2) == [6]  # 2 + 2 + 2
    assert make_attack("flood", kind="stale", lag=1, round_window=2).labels(4) == [3]
    assert make_attack("flood", kind="future", round_window=4, lead=0).labels(0) == [6]


def test_silent_when_it_knows_no_model():
    crafted = craft_round(make_attack("flood"), view(3, torch.empty(0, 2)), torch.Generator())
    assert crafted.messages == {0: None, 1: None} and crafted.extra == {}


@pytest.mark.parametrize("setting", [{"kind": "replay"}, {"copies": 0}, {"lag": 0}, {"lead": -1}, {"round_window": 0}])
def test_bad_settings_are_refused_by_name(setting):
    name = next(iter(setting))
    with pytest.raises(ValueError, match=name):
        make_attack("flood", **setting)


def test_extra_messages_are_checked_like_the_others():
    class Stray:
        def plan(self, view, generator):
            return Crafted({0: None, 1: None}, extra={7: ((1, torch.zeros(2)),)})

    class Short:
        def plan(self, view, generator):
            return Crafted({0: None, 1: None}, extra={0: ((1, torch.zeros(3)),)})

    with pytest.raises(ValueError, match="not among its receivers"):
        craft_round(Stray(), view(2), torch.Generator())
    with pytest.raises(ValueError, match="2 values"):
        craft_round(Short(), view(2), torch.Generator())
