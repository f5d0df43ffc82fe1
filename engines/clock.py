"""The timeline of the synchronous round protocol over emulated links, on a simulated clock.

A batched engine runs every client as one tensor, with no real time, so nothing in it waits for
a message: :class:`SimulatedClock` works out, round by round, when each client would start, send
and stop waiting, and so which senders' models a real client process would miss over the same
links (:class:`~dfedrw.peer.transport.links.LinkSchedule`, one per directed link, each with its
own seeded stream, so the timeline is reproducible).

It follows the real client's round (``peer.client.rounds``, ``peer.client.presence``): train for
``step_seconds``, send the round's model to every receiver, wait for the expected senders until all
are in or the deadline passes, aggregate for ``aggregate_seconds``, start the next round. A sender
that misses ``max_missed_rounds`` deadlines in a row is not waited for (though still sent every
model) until a model of it arrives, in time or late: from the receiver's next round begun after
that, it is waited for again. A model that arrives after its receiver stopped waiting goes unused.

Left out: the lead bound (a real client begins no round more than ``round_window`` rounds ahead of a
neighbour it knows to be behind, :mod:`peer.client.presence`; here a client that stopped waiting for
a slower one runs on at its own pace), the model sent again to a neighbour that comes back, the
transport's word on reachability (no client here is unreachable, so none is only probed), and time
spent on the receiving side. Pure: no threads, no real time, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.transport.links import LinkProfile, LinkSchedule, links_for
from dfedrw.peer.wiring.build import link_profiles

__all__ = ["RoundTiming", "SimulatedClock", "link_schedules"]

Schedules = Mapping[tuple[int, int], LinkSchedule] | Callable[[int, int], LinkSchedule]


@dataclass(frozen=True)
class RoundTiming:
    """One round of every client: when it started, sent and stopped waiting (``start``, ``send``,
    ``end``, seconds, per client); per receiver, the expected senders whose model it missed
    (``missing``) and the senders whose model it aggregates (``used``), sorted ids; how many
    messages the links lost (``lost``) or delivered after their receiver's ``end`` (``late``)."""

    round: int
    start: tuple[float, ...]
    send: tuple[float, ...]
    end: tuple[float, ...]
    missing: tuple[tuple[int, ...], ...]
    used: tuple[tuple[int, ...], ...]
    lost: int
    late: int
    sent: tuple[int, ...] = ()  # per client, the messages it put on its links this round
    planned: frozenset[tuple[int, int]] = frozenset()  # the links (src, dst) that carried one


def link_schedules(
    default: LinkProfile, overrides: Mapping[tuple[int, int], LinkProfile], seed: int
) -> Callable[[int, int], LinkSchedule]:
    """A factory of the schedule of each link ``(src, dst)``, as :func:`links_for` builds it
    for the real clients: the same profiles and the same seeded streams."""
    return lambda src, dst: links_for(default, overrides, seed, src, (dst,))[dst]


class SimulatedClock:
    """The rounds of ``num_clients`` clients over the links ``schedules`` times: a mapping from
    ``(src, dst)`` to its schedule, or a factory called once per link, the first time it is sent
    on (the schedule is kept: its stream and its queue go on from round to round).

    ``step_seconds[i]``: client ``i``'s local training per round; ``aggregate_seconds[i]``: its
    aggregation (scoring included); ``round_timeout``, ``max_missed_rounds``: the network's
    settings. ``reactive``: clients that train nothing and answer what they receive, as a
    Byzantine client does: each waits for its non-reactive senders from its round's start
    (deadline ``round_timeout`` after it), then sends, ``step_seconds`` later (its crafting), to
    its non-reactive receivers only, and starts its next round. Its arguments come from a checked
    scenario (:func:`scenario_clock`) and a schedule's graphs: it checks none of them again."""

    def __init__(
        self,
        num_clients: int,
        schedules: Schedules,
        *,
        step_seconds: Sequence[float],
        aggregate_seconds: Sequence[float],
        round_timeout: float,
        max_missed_rounds: int,
        reactive: Collection[int] = (),
    ) -> None:
        self.num_clients = n = num_clients
        self.step_seconds, self.aggregate_seconds = tuple(step_seconds), tuple(aggregate_seconds)
        self.round_timeout, self.max_missed_rounds = round_timeout, max_missed_rounds
        self.reactive = frozenset(reactive)
        self._schedules = schedules
        self._links: dict[tuple[int, int], LinkSchedule] = {}
        self._start = [0.0] * n
        self._round = 0
        # Per receiver: senders presumed gone, deadlines missed in a row, when each was given up.
        self._gone: list[set[int]] = [set() for _ in range(n)]
        self._missed: list[dict[int, int]] = [{} for _ in range(n)]
        self._given_up_at: list[dict[int, float]] = [{} for _ in range(n)]
        # Per link: when its models of the rounds past arrive (those not yet past at the
        # receiver), for a sender given up on whose late model brings it back.
        self._arriving: dict[tuple[int, int], list[float]] = {}

    @property
    def now(self) -> tuple[float, ...]:
        """When each client starts its next round."""
        return tuple(self._start)

    def link(self, src: int, dst: int) -> LinkSchedule:
        """The schedule of ``src -> dst``, built on first use; its counters tell what was sent."""
        key = (src, dst)
        schedule = self._links.get(key)
        if schedule is None:
            if isinstance(self._schedules, Mapping):
                if key not in self._schedules:
                    raise ValueError(f"schedules: no LinkSchedule for the link {key}")
                schedule = self._schedules[key]
            else:
                schedule = self._schedules(src, dst)
            if not isinstance(schedule, LinkSchedule) or (schedule.src, schedule.dst) != key:
                raise ValueError(f"schedules: expected a LinkSchedule of the link {key}, got {schedule!r}")
            self._links[key] = schedule
        return schedule

    def lost_from(self, src: int) -> int:
        """Messages the links of ``src`` lost so far."""
        return sum(link.lost for (i, _), link in self._links.items() if i == src)

    def round(
        self, r: int, senders_to: Sequence[Sequence[int]], message_bytes: int | Sequence[int] | Mapping[tuple[int, int], int]
    ) -> RoundTiming:
        """Round ``r`` of every client. ``senders_to[i]``: who sends to client ``i`` in round
        ``r`` (the round's graph, directed: ``j`` sends to ``i``). ``message_bytes``: the size of
        every message, per sender, or per link ``(src, dst)``. Rounds must be asked in order 0, 1, 2..."""
        n = self.num_clients
        if r != self._round:
            raise ValueError(f"round {r!r} out of order: the next round is {self._round}")
        reactive = self.reactive
        # A reactive client (a Byzantine one) hears from the others only and sends to them only.
        graph = [tuple(sorted(row)) for row in senders_to]
        senders = [tuple(k for k in row if k not in reactive) if i in reactive else row for i, row in enumerate(graph)]
        sizes = self._sizes(message_bytes)
        start = tuple(self._start)
        send = [start[i] + self.step_seconds[i] for i in range(n)]
        receivers: list[list[int]] = [[] for _ in range(n)]
        for j in range(n):
            for k in senders[j]:
                receivers[k].append(j)
        arrival: dict[tuple[int, int], float | None] = {}  # (src, dst) -> arrival, None: lost
        end: list[float] = [0.0] * n
        missing: list[tuple[int, ...]] = [()] * n
        used: list[tuple[int, ...]] = [()] * n
        sent = [0] * n

        def plan(i: int) -> None:
            for j in sorted(receivers[i]):
                arrival[i, j] = self.link(i, j).plan(send[i], sizes(i, j))
                sent[i] += 1

        def wait(i: int, since: float) -> None:
            got = {k: arrival.get((k, i)) for k in senders[i]}  # None: not sent, or lost
            gone, missed, given_up = self._gone[i], self._missed[i], self._given_up_at[i]
            for k in senders[i]:
                times = self._arriving.get((k, i))
                if not times:
                    continue
                if k in gone and any(given_up[k] < t <= since for t in times):
                    gone.discard(k)  # a late model of it came since: waited for again from this round
                    missed[k] = 0
                self._arriving[k, i] = [t for t in times if t > since]
            expected = [k for k in senders[i] if k not in gone]
            times = [got[k] for k in expected]
            deadline = since + self.round_timeout
            end_i = max([since, *times]) if all(t is not None and t <= deadline for t in times) else deadline
            used_i = tuple(k for k in senders[i] if got[k] is not None and got[k] <= end_i)
            for k in senders[i]:  # liveness, as the real client's Liveness
                if k in used_i:
                    gone.discard(k)  # back, if it was gone: waited for again from the next round
                    missed[k] = 0
                elif k not in gone:
                    missed[k] = missed.get(k, 0) + 1
                    if missed[k] >= self.max_missed_rounds:
                        gone.add(k)
                        given_up[k] = end_i
                        missed[k] = 0
            end[i], used[i], missing[i] = end_i, used_i, tuple(k for k in expected if k not in used_i)

        others = [i for i in range(n) if i not in reactive]
        for i in others:  # train, then send
            plan(i)
        for i in sorted(reactive):  # wait for the others' models from the round's start, craft, then send
            wait(i, start[i])
            send[i] = end[i] + self.step_seconds[i]
            plan(i)
        for i in others:
            wait(i, send[i])
        for link, t in arrival.items():
            if t is not None and t > end[link[1]]:
                self._arriving.setdefault(link, []).append(t)
        lost = sum(1 for t in arrival.values() if t is None)
        late = sum(1 for (_, j), t in arrival.items() if t is not None and t > end[j])
        # A reactive client begins its next round once it sent; the others after aggregating.
        self._start = [send[i] if i in reactive else end[i] + self.aggregate_seconds[i] for i in range(n)]
        self._round += 1
        return RoundTiming(r, start, tuple(send), tuple(end), tuple(missing), tuple(used), lost, late, tuple(sent), frozenset(arrival))

    def _sizes(self, message_bytes: int | Sequence[int] | Mapping[tuple[int, int], int]) -> Callable[[int, int], int]:
        """(src, dst) -> the bytes of the link's message: one size, one per sender, or one per
        link (a mapping; a compression's messages differ from link to link)."""
        if isinstance(message_bytes, Mapping):
            return lambda src, dst: message_bytes[src, dst]
        sizes = [message_bytes] * self.num_clients if isinstance(message_bytes, int) else list(message_bytes)
        return lambda src, dst: sizes[src]


def scenario_clock(scenario: Scenario, byzantine: frozenset[int] | set[int]) -> SimulatedClock:
    """The simulated clock of a batched run: the scenario's links (the same profiles and seeded
    streams as its clients' :class:`EmulatedLinks`), each client's ``[clock]`` compute at its
    speed, the network's deadline and liveness; the Byzantine clients are ``reactive``."""
    default, own = link_profiles(scenario)
    clock, n = scenario.clock, scenario.num_clients
    speeds = [scenario.speed_of(k) for k in range(n)]
    return SimulatedClock(
        n, link_schedules(default, own, scenario.seed),
        step_seconds=[0.0 if k in byzantine else clock.step_seconds / speeds[k] for k in range(n)],
        aggregate_seconds=[0.0 if k in byzantine else clock.aggregate_seconds / speeds[k] for k in range(n)],
        round_timeout=scenario.network.round_timeout, max_missed_rounds=scenario.network.max_missed_rounds,
        reactive=byzantine,
    )
