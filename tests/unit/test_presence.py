"""The lead bound (peer/client/presence.py): a client does not begin a round more than
``round_window`` rounds ahead of neighbours it stopped waiting for, more of them than the
Byzantine neighbours it is told of; unless they cannot be reached or stood still for
``stall_timeout`` seconds. And any model from a neighbour given up on has it waited for again."""

from __future__ import annotations

import threading

import pytest

from dfedrw.peer.client.presence import Presence


class FakeInbox:
    def __init__(self, gone=()):
        self._gone = set(gone)
        self.round = 0

    def gone(self):
        return frozenset(self._gone)

    def set_gone(self, peer, gone=True):
        (self._gone.add if gone else self._gone.discard)(peer)


class FixedGraph:
    dynamic = False

    def receivers_of(self, k, r):
        return (1, 2, 3)


def presence(gone=(1, 2, 3), tolerate=0, stall=60.0):
    return Presence(
        0, (1, 2, 3), inbox=FakeInbox(gone), transport=object(), graphs=FixedGraph(), round_timeout=1.0, round_window=2,
        stall_timeout=stall, tolerate=tolerate,
    )


def hold_in_thread(p, r):
    done = threading.Event()
    thread = threading.Thread(target=lambda: (p.hold_back(r, lambda: None), done.set()), daemon=True)
    thread.start()
    return thread, done


def test_a_client_waits_for_neighbours_it_gave_up_on_that_are_more_than_the_window_behind():
    p = presence()
    for k in (1, 2, 3):
        p.heard(k, 3)
    assert p.behind(5) == [] and p.behind(6) == [1, 2, 3]
    thread, done = hold_in_thread(p, 6)
    assert not done.wait(0.3)  # held
    p.heard(1, 4)
    p.heard(2, 5)
    assert not done.wait(0.3)  # 3 still behind
    p.heard(3, 4)
    assert done.wait(5.0)
    thread.join(5.0)
    assert p.held_rounds == 1 and p.held_seconds > 0.5


def test_as_many_laggards_as_the_byzantine_neighbours_it_is_told_of_hold_nobody_back():
    p = presence(tolerate=1)
    p.heard(1, 10)
    p.heard(2, 10)
    p.heard(3, 0)  # one neighbour far behind (or lying about it)
    p.hold_back(10, lambda: None)
    assert p.held_rounds == 0
    q = presence(tolerate=1)
    for k, r in ((1, 10), (2, 5), (3, 0)):  # two behind: more than the one it is told of
        q.heard(k, r)
    assert q.behind(10) == [2, 3]


def test_neighbours_it_still_waits_for_or_cannot_reach_hold_nobody_back():
    p = presence(gone=(1, 2))
    for k in (1, 2, 3):
        p.heard(k, 0)
    p.on_reachability(2, "unreachable")
    assert p.behind(10) == [1]  # 3 is waited for at the barrier; 2 is gone for good
    p.on_reachability(2, "reachable")  # it answered: it is back, and holds back again
    assert p.behind(10) == [1, 2]


def test_a_neighbour_that_stood_still_for_the_stall_timeout_no_longer_holds_back():
    p = presence(stall=0.2)
    for k in (1, 2, 3):
        p.heard(k, 0)
    p.hold_back(10, lambda: None)  # returns once they stood still for 0.2 s
    assert p.held_rounds == 1 and p.behind(10) == []
    p.heard(1, 1)  # it moved: it holds back again
    assert p.behind(10) == [1]


def test_holding_back_stops_when_the_client_is_asked_to_stop():
    p = presence()

    def stop():
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        p.hold_back(10, stop)


@pytest.mark.parametrize(("accepted", "reason", "back_at"), [(True, "", 7), (False, "stale_round", 5), (False, "future_round", 5)])
def test_any_model_of_a_neighbour_given_up_on_has_it_waited_for_again(accepted, reason, back_at):
    p = presence(gone=(1,))
    p.inbox.round = 4
    p.transport = type("T", (), {"send": lambda self, k, m: None})()
    p.after_offer(1, 7 if accepted else (1 if reason == "stale_round" else 99), accepted, reason, True)
    if not accepted:
        assert 1 not in p.inbox.gone()
    assert p.back_at == {1: back_at}
    assert p.expected(back_at, frozenset({1, 2})) == {1, 2} - p.inbox.gone()
