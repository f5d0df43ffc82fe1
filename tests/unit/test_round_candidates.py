"""A client's candidates, assembled once for every engine (peer/round/candidates.py)."""

import math

import torch

from dfedrw.peer.round.candidates import Offer, assemble


def test_own_first_then_held_in_the_order_given() -> None:
    c = assemble(Offer(3, "own", 60, 0.5), [Offer(1, "a", 40, 0.25, 2), Offer(7, "b", 50, math.nan, 1)], expected={1, 5, 7})
    assert c.ids == (3, 1, 7) and c.senders == (1, 7)
    assert c.models == ("own", "a", "b")
    assert c.sizes == (60, 40, 50)
    assert c.losses[:2] == (0.5, 0.25) and math.isnan(c.losses[2])
    assert c.staleness == (0, 2, 1)
    assert c.missing == [5]


def test_missing_is_the_expected_senders_not_held_in_ascending_order() -> None:
    assert assemble(Offer(0, None, 1, 0.0), [], expected=[9, 2, 4]).missing == [2, 4, 9]
    assert assemble(Offer(0, None, 1, 0.0), [Offer(2, None, 1, 0.0)], expected=(2,)).missing == []
    # A sender held though not expected (a schedule's graph moved on) is a candidate, not missing.
    assert assemble(Offer(0, None, 1, 0.0), [Offer(6, None, 1, 0.0)], expected=()).ids == (0, 6)


def test_missing_given_by_the_caller_is_kept() -> None:
    # A simulated network knows which models were sent and lost in time.
    assert assemble(Offer(0, None, 1, 0.0), [], expected=[1, 2], missing=[2]).missing == [2]


def test_inputs_hand_the_rule_what_was_assembled() -> None:
    own, other = torch.zeros(4), torch.ones(4)
    c = assemble(Offer(2, own, 10, 0.1), [Offer(5, other, 20, 0.2, 3)], expected=[5])
    vectors = c.stack()
    assert torch.equal(vectors, torch.stack([own, other]))
    sync = c.inputs(7, vectors, evaluate=None, total_rounds=100, reference=own, finite=[True, True])
    assert (sync.own_id, sync.round, sync.ids, sync.num_samples, sync.declared_losses) == (2, 7, (2, 5), (10, 20), (0.1, 0.2))
    assert sync.staleness is None and sync.finite == (True, True) and sync.total_rounds == 100
    gossip = c.inputs(7, vectors, evaluate=None, total_rounds=100, reference=None, finite=None, gossip=True)
    assert gossip.staleness == (0, 3) and gossip.finite is None
