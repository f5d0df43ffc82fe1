"""Emulated links (peer/transport/links.py): profiles are validated, a link's timing follows
its bandwidth, latency and loss as computed by hand, its draws come from its own seeded
stream, and the wrapper hands a message to the inner transport at its arrival time and never
before (driven by a fake clock through ``pump``; one short test with the real worker)."""

from __future__ import annotations

import hashlib
import math
import threading
import time

import numpy as np
import pytest
import torch

from dfedrw.peer.transport.links import EmulatedLinks, LinkProfile, LinkSchedule, distance_profiles, links_for
from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.serde import TensorSpec, message_out

MB = 1_000_000
MBIT = 1_000_000


class Chunk:
    """A chunk of a given serialized size."""

    def __init__(self, size: int) -> None:
        self.size = size

    def ByteSize(self) -> int:  # noqa: N802 - the protobuf method's name
        return self.size


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Recorder:
    """An inner transport that records (time, to, chunks) of every send."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.sent: list[tuple[float, int, object]] = []
        self.flushed: list[float] = []
        self.closed = False
        self.bytes_sent = 0
        self.dropped = 0
        self.skipped_stale = 0
        self.event = threading.Event()

    def start(self, deliver) -> str:
        return "fake:0"

    def connect(self, addresses, on_reachability) -> None:
        self.addresses = dict(addresses)

    def wait_ready(self, timeout: float) -> list[int]:
        return []

    def send(self, to: int, chunks) -> None:
        self.sent.append((self.clock(), to, chunks))
        self.bytes_sent += sum(c.ByteSize() for c in chunks)
        self.event.set()

    def flush(self, timeout: float) -> None:
        self.flushed.append(timeout)

    def close(self) -> None:
        self.closed = True


# ------------------------------------------------------------------------------------ profiles


def test_a_profile_is_perfect_only_with_nothing_to_emulate():
    assert LinkProfile().perfect
    assert LinkProfile(0, 0, 0, 0).perfect
    assert not LinkProfile(latency=0.01).perfect
    assert not LinkProfile(jitter=0.01).perfect
    assert not LinkProfile(bandwidth=1e9).perfect
    assert not LinkProfile(loss=0.01).perfect


def test_a_profile_holds_plain_floats():
    profile = LinkProfile(latency=np.float32(0.5), bandwidth=8, loss=0)
    assert type(profile.latency) is float and type(profile.bandwidth) is float and type(profile.loss) is float
    assert profile == LinkProfile(latency=0.5, bandwidth=8.0)


def test_transfer_time_is_bits_over_bandwidth():
    assert LinkProfile(bandwidth=8 * MBIT).transfer_seconds(MB) == pytest.approx(1.0)
    assert LinkProfile(bandwidth=1000.0).transfer_seconds(250) == pytest.approx(2.0)
    assert LinkProfile().transfer_seconds(10 * MB) == 0.0
    with pytest.raises(ValueError):
        LinkProfile().transfer_seconds(-1)


# ------------------------------------------------------------------------------------ schedules


def test_back_to_back_messages_queue_on_the_link():
    schedule = LinkSchedule(LinkProfile(latency=0.05, bandwidth=8 * MBIT), seed=0, src=0, dst=1)
    # Transmitted 0..1 and 1..2, each arriving 50 ms after its last bit left.
    assert schedule.plan(0.0, MB) == pytest.approx(1.05)
    assert schedule.plan(0.0, MB) == pytest.approx(2.05)
    assert schedule.busy_until == pytest.approx(2.0)
    # The link is idle again at 2.0: a message sent at 5.0 starts at 5.0.
    assert schedule.plan(5.0, MB) == pytest.approx(6.05)
    # One sent while that one is on the link waits for it.
    assert schedule.plan(5.5, MB // 2) == pytest.approx(6.55)
    assert (schedule.sent, schedule.lost, schedule.bytes) == (4, 0, 3 * MB + MB // 2)


def test_an_unlimited_link_adds_only_latency():
    schedule = LinkSchedule(LinkProfile(latency=0.02), seed=3, src=1, dst=2)
    assert schedule.plan(1.0, 10 * MB) == pytest.approx(1.02)
    assert schedule.plan(1.0, 10 * MB) == pytest.approx(1.02)
    assert LinkSchedule(LinkProfile(), seed=3, src=1, dst=2).plan(7.5, MB) == 7.5


def test_arrivals_keep_their_order_under_jitter():
    # Jitter (20 ms) far above the transfer time (1 ms): drawn alone, delays would reorder.
    schedule = LinkSchedule(LinkProfile(latency=0.01, jitter=0.02, bandwidth=8 * MBIT), seed=1, src=0, dst=1)
    arrivals = [schedule.plan(i * 0.001, 1000) for i in range(2000)]
    assert all(b >= a for a, b in zip(arrivals, arrivals[1:]))
    # Jitter did draw: arrivals are not just send time + transfer + latency.
    gaps = [arrival - (i * 0.001 + 0.001) for i, arrival in enumerate(arrivals)]
    assert max(gaps) > 0.03
    # Clamped at >= 0 delay: never before the message has left.
    assert all(gap >= -1e-12 for gap in gaps)


def test_the_stream_is_the_documented_one():
    """Two draws per message from PCG64 seeded by blake2b of ``links/{seed}/{src}/{dst}``: a
    uniform (lost when below ``loss``), then a standard normal (the jitter)."""
    digest = hashlib.blake2b(b"links/7/2/5", digest_size=8).digest()
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest, "big")))
    profile = LinkProfile(latency=0.1, jitter=0.03, loss=0.3)
    schedule = LinkSchedule(profile, seed=7, src=2, dst=5)
    last = -math.inf
    for i in range(50):
        uniform, normal = rng.random(), rng.standard_normal()
        arrival = schedule.plan(float(i), 100)
        if uniform < 0.3:
            assert arrival is None
        else:
            last = max(float(i) + max(0.0, 0.1 + 0.03 * normal), last)
            assert arrival == pytest.approx(last)


def lost_pattern(seed: int, src: int, dst: int, n: int = 300, loss: float = 0.5) -> list[bool]:
    schedule = LinkSchedule(LinkProfile(loss=loss), seed=seed, src=src, dst=dst)
    return [schedule.plan(0.0, 10) is None for _ in range(n)]


def test_loss_is_seeded_per_link():
    assert lost_pattern(11, 0, 1) == lost_pattern(11, 0, 1)
    assert lost_pattern(11, 0, 1) != lost_pattern(12, 0, 1)
    assert lost_pattern(11, 0, 1) != lost_pattern(11, 1, 0)
    assert lost_pattern(11, 0, 1) != lost_pattern(11, 0, 2)


def test_which_messages_are_lost_does_not_depend_on_latency_or_jitter():
    a = LinkSchedule(LinkProfile(loss=0.4), seed=5, src=0, dst=1)
    b = LinkSchedule(LinkProfile(latency=0.2, jitter=0.1, bandwidth=1e6, loss=0.4), seed=5, src=0, dst=1)
    assert [a.plan(0.0, 100) is None for _ in range(500)] == [b.plan(0.0, 100) is None for _ in range(500)]


def test_the_lost_share_is_the_loss_probability():
    schedule = LinkSchedule(LinkProfile(loss=0.1), seed=2024, src=3, dst=4)
    lost = sum(schedule.plan(0.0, 100) is None for _ in range(10_000))
    assert abs(lost / 10_000 - 0.1) <= 0.01
    assert (schedule.sent, schedule.lost) == (10_000, lost)
    assert LinkSchedule(LinkProfile(), seed=0, src=0, dst=1).plan(0.0, 1) is not None


def test_a_lost_message_still_occupies_the_link():
    profile = LinkProfile(latency=0.05, bandwidth=8 * MBIT, loss=0.5)
    schedule = LinkSchedule(profile, seed=9, src=0, dst=1)
    pattern = lost_pattern(9, 0, 1, n=50)
    first_lost = pattern.index(True)
    for i in range(first_lost):  # the ones before, transmitted back to back from 0
        assert schedule.plan(0.0, MB) == pytest.approx(i + 1.05)
    assert schedule.plan(0.0, MB) is None
    assert schedule.busy_until == pytest.approx(first_lost + 1.0)
    assert schedule.bytes == (first_lost + 1) * MB and schedule.lost == 1
    # The next one not lost starts after the lost one's transfer (and any lost after it).
    k = first_lost + 1
    while pattern[k]:
        assert schedule.plan(0.0, MB) is None
        k += 1
    assert schedule.plan(0.0, MB) == pytest.approx(k + 1.05)


def test_links_for_takes_the_override_of_each_link():
    default, slow = LinkProfile(latency=0.01), LinkProfile(latency=0.5, loss=0.2)
    schedules = links_for(default, {(2, 3): slow, (3, 2): LinkProfile(loss=0.9)}, seed=4, src=2, receivers=[0, 3, 5])
    assert sorted(schedules) == [0, 3, 5]
    assert schedules[3].profile == slow
    assert schedules[0].profile == default and schedules[5].profile == default
    assert all((s.src, s.dst) == (2, k) for k, s in schedules.items())
    # Each its own stream: the schedule of (2, 3) draws as a fresh one of the same link.
    fresh = LinkSchedule(slow, 4, 2, 3)
    assert [schedules[3].plan(0.0, 1) for _ in range(40)] == [fresh.plan(0.0, 1) for _ in range(40)]


def test_distance_profiles():
    base = LinkProfile(latency=0.005, jitter=0.001, bandwidth=1e8, loss=0.01)
    profiles = distance_profiles(6, seed=3, latency_per_unit=0.1, base=base)
    assert sorted(profiles) == [(i, j) for i in range(6) for j in range(6) if i != j]
    for (i, j), profile in profiles.items():
        assert profile == profiles[j, i]
        assert base.latency <= profile.latency <= base.latency + 0.1 * math.sqrt(2)
        assert (profile.jitter, profile.bandwidth, profile.loss) == (0.001, 1e8, 0.01)
    assert distance_profiles(6, seed=3, latency_per_unit=0.1, base=base) == profiles
    assert distance_profiles(6, seed=4, latency_per_unit=0.1, base=base) != profiles
    # The points are the documented stream's.
    digest = hashlib.blake2b(b"links/points/3", digest_size=8).digest()
    points = np.random.Generator(np.random.PCG64(int.from_bytes(digest, "big"))).random((6, 2))
    distance = float(np.hypot(*(points[1] - points[4])))
    assert profiles[1, 4].latency == pytest.approx(0.005 + 0.1 * distance)
    # Without a per-unit latency every link is the base.
    assert set(distance_profiles(4, seed=3, latency_per_unit=0.0, base=base).values()) == {base}
    assert distance_profiles(1, seed=3, latency_per_unit=0.1, base=base) == {}


# ------------------------------------------------------------------------------------ the wrapper


def emulated(schedules, now: float = 0.0):
    clock = FakeClock(now)
    inner = Recorder(clock)
    return EmulatedLinks(inner, schedules, clock=clock, start_worker=False), inner, clock


def test_a_message_is_handed_over_at_its_arrival_and_not_before():
    schedule = LinkSchedule(LinkProfile(latency=0.05, bandwidth=8 * MBIT), 0, 0, 1)
    links, inner, clock = emulated({1: schedule})
    message = [Chunk(MB // 2), Chunk(MB // 2)]
    links.send(1, message)
    assert schedule.bytes == MB and links.pending == 1
    assert links.pump(1.0) == 0 and links.pump(1.049) == 0
    assert inner.sent == [] and links.bytes_sent == 0
    clock.now = 1.05
    assert links.pump(1.05) == 1
    assert inner.sent == [(1.05, 1, message)]
    assert links.bytes_sent == MB and links.delayed == 1 and links.pending == 0
    assert links.pump(10.0) == 0


def test_messages_are_handed_over_in_arrival_order():
    fast = LinkSchedule(LinkProfile(latency=0.01), 0, 0, 1)
    slow = LinkSchedule(LinkProfile(latency=0.5), 0, 0, 2)
    links, inner, clock = emulated({1: fast, 2: slow})
    a, b, c = [Chunk(10)], [Chunk(20)], [Chunk(30)]
    links.send(2, a)
    links.send(1, b)
    clock.now = 0.2
    links.send(1, c)  # arrives at 0.21
    assert links.pump(0.3) == 2
    assert [(to, chunks) for _, to, chunks in inner.sent] == [(1, b), (1, c)]
    assert links.pump(0.5) == 1
    assert inner.sent[-1][1:] == (2, a)


def test_a_lost_message_is_never_handed_over():
    schedule = LinkSchedule(LinkProfile(loss=0.5), 21, 0, 1)
    pattern = lost_pattern(21, 0, 1, n=20)
    links, inner, _ = emulated({1: schedule})
    messages = [[Chunk(i + 1)] for i in range(20)]
    for message in messages:
        links.send(1, message)
    links.pump(100.0)
    assert [chunks for _, _, chunks in inner.sent] == [m for m, lost in zip(messages, pattern) if not lost]
    assert links.lost == sum(pattern) == schedule.lost
    assert links.delayed == 0  # a perfect-latency link: each arrived when sent


def test_an_unscheduled_destination_is_sent_at_once():
    links, inner, _ = emulated({1: LinkSchedule(LinkProfile(latency=1.0), 0, 0, 1)})
    message = [Chunk(5)]
    links.send(7, message)
    assert inner.sent == [(0.0, 7, message)] and links.pending == 0


def test_a_real_model_chunk_and_a_wire_message_are_sized_as_on_the_wire():
    schedule = LinkSchedule(LinkProfile(latency=0.1), 0, 0, 1)
    links, inner, clock = emulated({1: schedule})
    chunks = [
        pb.ModelChunk(header=pb.ModelHeader(sender=0, round=3), data=b"x" * 1000),
        pb.ModelChunk(data=b"y" * 10, offset=1000),
    ]
    links.send(1, chunks)
    assert schedule.bytes == sum(c.ByteSize() for c in chunks) > 1010
    specs = (TensorSpec("w", "float32", (300,)),)
    message = message_out(0, 3, torch.arange(300, dtype=torch.float32), specs, chunk_bytes=512)
    links.send(1, message)
    assert schedule.bytes - sum(c.ByteSize() for c in chunks) == sum(c.ByteSize() for c in message) == message.nbytes
    clock.now = 0.1
    links.pump(0.1)
    assert [sent for _, _, sent in inner.sent] == [chunks, message]  # the message itself, not rebuilt


def test_an_iterator_of_chunks_is_read_once():
    schedule = LinkSchedule(LinkProfile(latency=0.1), 0, 0, 1)
    links, inner, _ = emulated({1: schedule})
    chunks = [Chunk(3), Chunk(4)]
    links.send(1, iter(chunks))
    links.pump(1.0)
    assert schedule.bytes == 7 and inner.sent[0][2] == chunks


def test_flush_on_an_empty_queue_passes_its_time_to_the_inner():
    links, inner, _ = emulated({1: LinkSchedule(LinkProfile(), 0, 0, 1)})
    links.flush(5.0)
    assert len(inner.flushed) == 1 and 4.0 < inner.flushed[0] <= 5.0


def test_flush_gives_up_after_its_timeout():
    links, inner, _ = emulated({1: LinkSchedule(LinkProfile(latency=1.0), 0, 0, 1)})
    links.send(1, [Chunk(1)])
    links.flush(0.01)  # nobody pumps: it waits its 10 ms, no more
    assert inner.flushed == [0.0] and links.pending == 1


def test_the_wrapper_delegates_and_close_sends_nothing_more():
    links, inner, _ = emulated({1: LinkSchedule(LinkProfile(latency=1.0), 0, 0, 1)})
    assert links.start(lambda chunks, sender: (True, "", 0)) == "fake:0"
    links.connect({1: "a"}, lambda peer, state: None)
    assert inner.addresses == {1: "a"} and links.wait_ready(1.0) == []
    inner.dropped, inner.skipped_stale = 2, 3
    assert (links.dropped, links.skipped_stale) == (2, 3)
    links.send(1, [Chunk(1)])
    links.close()
    assert inner.closed and links.pending == 0
    links.send(1, [Chunk(1)])
    links.send(9, [Chunk(1)])
    assert links.pump(100.0) == 0 and inner.sent == []


def test_the_worker_hands_a_message_over_after_its_latency():
    inner = Recorder()
    links = EmulatedLinks(inner, {1: LinkSchedule(LinkProfile(latency=0.02), 0, 0, 1)})
    try:
        before = time.monotonic()
        links.send(1, [Chunk(8)])
        assert inner.event.wait(5.0)
        links.flush(5.0)
        (at, to, _), = inner.sent
        assert to == 1 and at - before >= 0.02
        assert links.delayed == 1 and links.pending == 0 and links.bytes_sent == 8
    finally:
        links.close()
    assert inner.closed


def test_it_wraps_the_in_process_transport():
    from dfedrw.peer.transport.inproc import InprocHub, InprocTransport

    hub, received = InprocHub(), []
    InprocTransport(hub, "b").start(lambda chunks, sender: (received.append(list(chunks)), (True, "", 0))[1])
    clock = FakeClock()
    schedules = {1: LinkSchedule(LinkProfile(latency=0.3), 0, 0, 1)}
    links = EmulatedLinks(InprocTransport(hub, "a"), schedules, clock=clock, start_worker=False)
    links.connect({1: "b"}, lambda peer, state: None)
    message = message_out(0, 1, torch.ones(4), (TensorSpec("w", "float32", (4,)),))
    links.send(1, message)
    links.pump(0.29)
    assert received == [] and links.bytes_sent == 0
    links.pump(0.3)
    assert received == [list(message)] and links.bytes_sent == message.nbytes
    links.close()


def test_under_asynchronous_gossip_a_busy_link_takes_no_new_model():
    # 1 MB at 8 Mbit/s: the link transmits for 1 s. While it does, the sender's next models
    # are turned away (asked before encoding, or at the send), then the link takes one again.
    schedule = LinkSchedule(LinkProfile(latency=0.05, bandwidth=8 * MBIT), 0, 0, 1)
    links = EmulatedLinks(Recorder(), {1: schedule}, clock=(clock := FakeClock(0.0)), start_worker=False, newest_only=True)
    assert not schedule.busy(0.0) and links.offer(1)
    links.send(1, [Chunk(MB)])
    assert schedule.busy(0.5) and not schedule.busy(1.0)
    clock.now = 0.5
    assert not links.offer(1)
    links.send(1, [Chunk(MB)])  # sent without asking: turned away all the same
    assert links.skipped_busy == 2 and links.pending == 1 and schedule.sent == 1
    clock.now = 1.0
    assert links.offer(1)
    links.send(1, [Chunk(MB)])
    assert links.pending == 2 and links.skipped_busy == 2
    # Under the round protocol the same link queues the message behind the one before.
    queued = LinkSchedule(LinkProfile(bandwidth=8 * MBIT), 0, 0, 1)
    sync = EmulatedLinks(Recorder(), {1: queued}, clock=FakeClock(0.0), start_worker=False)
    sync.send(1, [Chunk(MB)])
    assert sync.offer(1)
    sync.send(1, [Chunk(MB)])
    assert sync.pending == 2 and sync.skipped_busy == 0
