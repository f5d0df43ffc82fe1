"""The simulated clock (engines/clock.py): the round timeline over emulated links, as
computed by hand: who waits for whom, the deadline, queueing on a link's bandwidth, loss,
senders given up on and waited for again once heard from, and reproducible draws."""

from __future__ import annotations

import pytest

from dfedrw.engines.clock import RoundTiming, SimulatedClock, link_schedules
from dfedrw.peer.transport.links import LinkProfile, LinkSchedule

PERFECT = LinkProfile()


class Scripted(LinkSchedule):
    """A link whose messages take the given delays in turn (None: lost)."""

    def __init__(self, src: int, dst: int, delays) -> None:
        super().__init__(PERFECT, 0, src, dst)
        self.delays = list(delays)

    def plan(self, now: float, size_bytes: int) -> float | None:
        self.sent += 1
        delay = self.delays.pop(0)
        return None if delay is None else now + delay


def full(n: int) -> list[list[int]]:
    return [[k for k in range(n) if k != i] for i in range(n)]


def clock(n, profiles=None, *, step=None, aggregate=None, timeout=100.0, missed=2, seed=0, **kw):
    factory = link_schedules(PERFECT, profiles or {}, seed)
    return SimulatedClock(
        n, factory, step_seconds=step or [1.0] * n, aggregate_seconds=aggregate or [0.0] * n,
        round_timeout=timeout, max_missed_rounds=missed, **kw,
    )


def test_perfect_links_nobody_misses_and_the_end_is_the_latest_send():
    c = clock(3, step=[1.0, 2.0, 3.0])
    t = c.round(0, full(3), 1000)
    assert t == RoundTiming(0, (0.0, 0.0, 0.0), (1.0, 2.0, 3.0), (3.0, 3.0, 3.0), ((), (), ()), ((1, 2), (0, 2), (0, 1)), 0, 0, (2, 2, 2),
                            frozenset({(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)}))
    assert c.now == (3.0, 3.0, 3.0)


def test_a_slow_client_makes_its_neighbours_wait_for_its_send():
    c = clock(3, step=[1.0, 1.0, 5.0], aggregate=[0.5] * 3)  # a line 0 - 1 - 2, client 2 five times slower
    line = [[1], [0, 2], [1]]
    t = c.round(0, line, 10)
    assert t.send == (1.0, 1.0, 5.0)
    assert t.end == (1.0, 5.0, 5.0)  # 0 waits only for 1; 1 and 2 for the slow one's send
    assert c.now == (1.5, 5.5, 5.5)
    t = c.round(1, line, 10)
    assert t.send == (2.5, 6.5, 10.5)
    assert t.end == (6.5, 10.5, 10.5)
    assert t.missing == ((), (), ()) and t.used == ((1,), (0, 2), (1,))


def test_the_deadline_cuts_off_a_straggler():
    c = clock(3, step=[1.0, 1.0, 10.0], timeout=3.0)
    t = c.round(0, full(3), 10)
    assert t.end == (4.0, 4.0, 10.0)  # send + round_timeout; the straggler has everything in
    assert t.missing == ((2,), (2,), ())
    assert t.used == ((1,), (0,), (0, 1))
    assert (t.lost, t.late) == (0, 2)  # the straggler's two messages arrive at 10 > 4


def test_a_sender_beyond_the_deadline_is_given_up_and_waited_for_again_once_a_late_model_of_it_arrives():
    # 1 -> 0 takes 10 s, over the 3 s timeout: 0 misses 1 twice, then stops waiting for it until
    # one of its late models arrives (its round-0 model, at 11 s), and so on: a slow neighbour
    # is not a dead one. 0 -> 1 is perfect: 1 waits for 0's model, sent at the end of its step.
    c = clock(2, {(1, 0): LinkProfile(latency=10.0)}, timeout=3.0, missed=2)
    sends, ends, missing = [], [], []
    for r in range(8):
        t = c.round(r, full(2), 10)
        sends.append(t.send[0])
        ends.append(t.end[0])
        missing.append(t.missing[0])
    assert sends == [1.0, 5.0, 9.0, 10.0, 11.0, 15.0, 19.0, 20.0]
    assert ends == [4.0, 8.0, 9.0, 10.0, 14.0, 18.0, 19.0, 23.0]  # the deadline while waited for, else its own send
    assert missing == [(1,), (1,), (), (), (1,), (1,), (), (1,)]  # given up at 8 s; its model of round 0 arrives at 11 s, ...
    # Given up or not, 0 sends 1 every model.
    assert c.link(0, 1).sent == 8


def test_messages_queue_on_a_link_one_transfer_time_apart():
    # Only 1 sends to 0, 1 MB at 1 Mbit/s (8 s) and 0.5 s latency; 1 waits for nobody.
    c = clock(2, {(1, 0): LinkProfile(latency=0.5, bandwidth=1e6)})
    size = 1_000_000
    first = c.round(0, [[1], []], [0, size])
    second = c.round(1, [[1], []], [0, size])
    assert first.send[1] == 1.0 and second.send[1] == 2.0  # sent before the first is transmitted
    one, two = 1.0 + size * 8 / 1e6 + 0.5, 1.0 + 2 * size * 8 / 1e6 + 0.5
    assert (one, two) == (9.5, 17.5)
    assert first.end[0] == one  # 0 waits for it
    assert second.end[0] == two  # the second starts when the first is transmitted, 8 s later
    assert c.link(1, 0).busy_until == 17.0 and c.link(1, 0).bytes == 2 * size


def test_a_lost_message_is_missing():
    c = clock(2, {(1, 0): LinkProfile(loss=0.999999)}, timeout=3.0)
    t = c.round(0, full(2), 10)
    assert c.link(1, 0).lost == 1
    assert t.missing == ((1,), ()) and t.used == ((), (0,))
    assert t.end == (4.0, 1.0) and (t.lost, t.late) == (1, 0)


def test_a_sender_presumed_gone_that_arrives_in_time_is_back():
    link = Scripted(1, 0, [None, 0.5, 10.0])  # lost, in time, late
    c = SimulatedClock(2, {(1, 0): link}, step_seconds=[1.0, 1.0], aggregate_seconds=[0.0, 0.0],
                       round_timeout=2.0, max_missed_rounds=1)
    graph = [[1], []]
    t = c.round(0, graph, 10)
    assert t.missing[0] == (1,) and t.end[0] == 3.0  # lost: 1 is presumed gone
    t = c.round(1, graph, 10)  # 0 expects nobody, ends at its send 4; 1's model arrives at 2.5
    assert t.end[0] == 4.0 and t.used[0] == (1,) and t.missing[0] == ()
    t = c.round(2, graph, 10)  # back: waited for again, up to the deadline
    assert t.send[0] == 5.0 and t.end[0] == 7.0 and t.missing[0] == (1,) and t.late == 1
    assert link.sent == 3


def test_a_late_message_is_never_used_later():
    link = Scripted(1, 0, [5.0, 0.0])
    c = SimulatedClock(2, {(1, 0): link}, step_seconds=[1.0, 1.0], aggregate_seconds=[0.0, 0.0],
                       round_timeout=2.0, max_missed_rounds=5)
    assert c.round(0, [[1], []], 10).used[0] == ()  # arrives at 6, after the end at 3
    t = c.round(1, [[1], []], 10)  # round 1: 1 sends at 2, arriving at once; 0 ends at its send 4
    assert t.used[0] == (1,) and t.end[0] == 4.0


def test_the_same_seeds_give_the_same_timeline():
    profile = LinkProfile(latency=0.2, jitter=0.3, bandwidth=5e6, loss=0.2)

    def run(seed):
        c = SimulatedClock(4, link_schedules(profile, {}, seed), step_seconds=[1.0, 1.5, 2.0, 4.0],
                           aggregate_seconds=[0.1] * 4, round_timeout=1.5, max_missed_rounds=2)
        return [c.round(r, full(4), 100_000) for r in range(12)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_a_factory_is_called_once_per_link():
    calls = []

    def factory(i, j):
        calls.append((i, j))
        return LinkSchedule(PERFECT, 0, i, j)

    c = SimulatedClock(3, factory, step_seconds=[1.0] * 3, aggregate_seconds=[0.0] * 3, round_timeout=1.0, max_missed_rounds=1)
    for r in range(3):
        c.round(r, full(3), 10)
    assert sorted(calls) == [(i, j) for i in range(3) for j in range(3) if i != j]


GOOD = dict(step_seconds=[1.0, 1.0], aggregate_seconds=[0.0, 0.0], round_timeout=1.0, max_missed_rounds=1)


def test_rounds_are_asked_in_order():
    c = SimulatedClock(2, link_schedules(PERFECT, {}, 0), **GOOD)
    with pytest.raises(ValueError, match="round 1 out of order: the next round is 0"):
        c.round(1, [[1], [0]], 10)


def test_schedule_checks():
    with pytest.raises(ValueError, match=r"no LinkSchedule for the link \(0, 1\)"):
        SimulatedClock(2, {}, **GOOD).round(0, [[1], [0]], 10)
    wrong = {(0, 1): LinkSchedule(PERFECT, 0, 1, 0), (1, 0): LinkSchedule(PERFECT, 0, 1, 0)}
    with pytest.raises(ValueError, match=r"expected a LinkSchedule of the link \(0, 1\)"):
        SimulatedClock(2, wrong, **GOOD).round(0, [[1], [0]], 10)
    c = SimulatedClock(2, link_schedules(PERFECT, {}, 0), **GOOD)
    c.round(0, [[1], [0]], 10)
    with pytest.raises(ValueError, match="round 0 out of order: the next round is 1"):
        c.round(0, [[1], [0]], 10)


def test_a_reactive_client_waits_for_the_others_then_answers_them():
    # Client 1 is Byzantine: it trains nothing, waits for 0's and 2's models, then sends to
    # them only; every link takes 1 s, local steps 0.5 s.
    latency = {(i, j): LinkProfile(latency=1.0) for i in range(3) for j in range(3) if i != j}
    c = clock(3, latency, step=[0.5, 0.0, 0.5], reactive=[1])
    t = c.round(0, full(3), 10)
    assert t.send == (0.5, 1.5, 0.5)  # the honest models reach it at 1.5, it answers at once
    assert t.end == (2.5, 1.5, 2.5)  # its answer reaches the honest clients at 2.5
    assert t.used == ((1, 2), (0, 2), (0, 1)) and t.missing == ((), (), ())
    assert c.now == (2.5, 1.5, 2.5)  # it begins its next round as soon as it sent
    assert c.link(1, 0).sent == 1 and (1, 1) not in c._links
    # Its deadline runs from its round's start: models later than that are missed.
    slow = clock(3, latency, step=[0.5, 0.0, 5.0], reactive=[1], timeout=2.0)
    t = slow.round(0, full(3), 10)
    assert t.end[1] == 2.0 and t.missing[1] == (2,) and t.used[1] == (0,)


def test_messages_may_differ_in_size_from_link_to_link():
    c = clock(2, {(0, 1): LinkProfile(bandwidth=8.0), (1, 0): LinkProfile(bandwidth=8.0)}, step=[0.0, 0.0])
    t = c.round(0, full(2), {(0, 1): 2, (1, 0): 5})  # 1 byte a second
    assert t.end == (5.0, 2.0)
