"""The gRPC transport over loopback: one sender and one receiver in this process."""

import threading
import time
from concurrent import futures

import grpc
import pytest
import torch

from dfedrw.peer.transport.grpc.transport import GrpcTransport
from dfedrw.peer.transport.pb import peer_pb2_grpc as pb_grpc
from dfedrw.peer.transport.serde import encode
from tests.support.wire import SPECS, handle_push, roundtrip, split_messages, vec


def _pair(deliver, chunk_bytes=16):
    receiver = GrpcTransport("127.0.0.1", 0, chunk_bytes=chunk_bytes)
    address = receiver.start(deliver)
    sender = GrpcTransport("127.0.0.1", 0, chunk_bytes=chunk_bytes)
    sender.start(lambda m, sender=None: (True, "", 0))
    return sender, receiver, address


class _ThreadedReceiver(pb_grpc.PeerServicer):
    """A receiver on gRPC's threaded server. Its ``deliver`` may block (a slow receiver) without
    stalling the sender: a GrpcTransport's deliver runs on the event loop its sender shares."""

    def __init__(self, deliver):
        self.deliver = deliver
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_PeerServicer_to_server(self, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def Exchange(self, request_iterator, context):  # noqa: N802 - gRPC method name
        for message in split_messages(request_iterator, 1 << 20):
            yield handle_push(message, self.deliver)

    def close(self):
        self.server.stop(grace=0).wait()


def _slow_pair(deliver):
    receiver = _ThreadedReceiver(deliver)
    sender = GrpcTransport("127.0.0.1", 0, chunk_bytes=16)
    sender.start(lambda m, sender=None: (True, "", 0))
    return sender, receiver, receiver.address


def test_grpc_stream_delivers_every_message_in_order_over_loopback():
    got, lock = [], threading.Lock()

    def deliver(chunks, sender=None):
        with lock:
            got.append(roundtrip(list(chunks)))
        return True, "", 0

    sender, receiver, address = _pair(deliver)
    try:
        sender.connect({1: address}, lambda peer, state: None)
        assert sender.wait_ready(10.0) == []
        for r in range(12):
            sender.send(1, encode(0, r, vec(r), SPECS, chunk_bytes=16))
            if r % 3 == 0:
                sender.flush(10.0)
        sender.flush(10.0)
        assert [m.round for m in got] == list(range(12))
        assert all(torch.equal(m.vector, vec(m.round)) for m in got)
        assert sender.bytes_sent == sum(sum(c.ByteSize() for c in encode(0, r, vec(r), SPECS, chunk_bytes=16)) for r in range(12))
    finally:
        sender.close()
        receiver.close()


def test_grpc_sender_reports_a_neighbour_that_went_away():
    sender, receiver, address = _pair(lambda chunks, sender=None: (len(list(chunks)) > 0, "", 0))
    events = []
    try:
        sender.connect({1: address}, lambda peer, state: events.append((peer, state)))
        sender.send(1, encode(0, 0, vec(), SPECS))
        sender.flush(10.0)
        assert (1, "reachable") in events
        receiver.close()
        deadline = time.monotonic() + 15
        while (1, "unreachable") not in events and time.monotonic() < deadline:
            sender.send(1, encode(0, 1, vec(), SPECS))
            time.sleep(0.2)
        assert (1, "unreachable") in events
    finally:
        sender.close()


class _SlowFirstReply:
    """A receiver that holds its reply to the round-0 message until released, answering it
    with ``first_reply_round`` as its round (and every later message with that message's)."""

    def __init__(self, first_reply_round=0):
        self.first_reply_round = first_reply_round
        self.release, self.first_in = threading.Event(), threading.Event()
        self.got, self.lock = [], threading.Lock()

    def __call__(self, chunks, sender=None):
        m = roundtrip(list(chunks))
        with self.lock:
            self.got.append(m.round)
        if m.round == 0:
            self.first_in.set()
            self.release.wait(10.0)
            return True, "", self.first_reply_round
        return True, "", m.round

    def queue_behind_the_first(self, sender, address, later_rounds):
        sender.connect({1: address}, lambda peer, state: None)
        assert sender.wait_ready(10.0) == []
        sender.send(1, encode(0, 0, vec(), SPECS, chunk_bytes=16))
        assert self.first_in.wait(10.0)
        for r in later_rounds:
            sender.send(1, encode(0, r, vec(r), SPECS, chunk_bytes=16))


def test_grpc_sender_keeps_one_message_in_flight_and_the_newest_queued():
    """The next message goes out only after the reply to the previous one; meanwhile the queue
    keeps the newest MAX_QUEUED messages, so a slow receiver gets fresh models, not a backlog."""
    receiver_logic = _SlowFirstReply()
    sender, receiver, address = _slow_pair(receiver_logic)
    try:
        receiver_logic.queue_behind_the_first(sender, address, range(1, 8))
        time.sleep(0.3)
        with receiver_logic.lock:
            assert receiver_logic.got == [0]  # nothing else left while round 0 awaits its reply
        receiver_logic.release.set()
        sender.flush(10.0)
        assert receiver_logic.got == [0, 4, 5, 6, 7] and sender.dropped == 3 and sender.skipped_stale == 0
    finally:
        receiver_logic.release.set()
        sender.close()
        receiver.close()


def test_grpc_sender_gives_up_on_an_overdue_reply_and_opens_a_new_call():
    release = threading.Event()
    got = []

    def deliver(chunks, sender=None):
        m = roundtrip(list(chunks))
        got.append(m.round)
        if m.round == 0:
            release.wait(10.0)  # never answered in time
        return True, "", 0

    sender, receiver, address = _slow_pair(deliver)
    sender.send_timeout = 0.5
    try:
        sender.connect({1: address}, lambda peer, state: None)
        assert sender.wait_ready(10.0) == []
        sender.send(1, encode(0, 0, vec(), SPECS, chunk_bytes=16))
        sender.send(1, encode(0, 1, vec(1), SPECS, chunk_bytes=16))
        deadline = time.monotonic() + 10
        while 1 not in got and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got == [0, 1]  # round 1 went out on a new call once round 0's was cancelled
    finally:
        release.set()
        sender.close()
        receiver.close()


def test_grpc_sender_drops_queued_messages_the_receiver_is_past():
    """Each reply carries the receiver's round: what is queued for earlier rounds would only
    arrive stale, so it is never sent."""
    receiver_logic = _SlowFirstReply(first_reply_round=3)  # meanwhile it moved on to round 3
    sender, receiver, address = _slow_pair(receiver_logic)
    try:
        receiver_logic.queue_behind_the_first(sender, address, range(1, 5))
        receiver_logic.release.set()
        sender.flush(10.0)
        assert receiver_logic.got == [0, 3, 4] and sender.skipped_stale == 2 and sender.dropped == 0
    finally:
        receiver_logic.release.set()
        sender.close()
        receiver.close()


def test_grpc_transport_refuses_a_port_in_use():
    first = GrpcTransport("127.0.0.1", 0)
    first.start(lambda m, sender=None: (True, "", 0))
    try:
        with pytest.raises(OSError, match=f"could not listen on 127.0.0.1:{first.port}"):
            GrpcTransport("127.0.0.1", first.port).start(lambda m, sender=None: (True, "", 0))
    finally:
        first.close()


def test_grpc_sender_queues_no_more_than_its_byte_bound(monkeypatch):
    """Each queued message is a model the client still holds: past MAX_QUEUED_BYTES the oldest
    queued ones go, however few messages that leaves (here two)."""
    from dfedrw.peer.transport.grpc.sender import Sender
    from dfedrw.peer.transport.chunks import wire_size

    size = wire_size(encode(0, 1, vec(1), SPECS, chunk_bytes=16))
    monkeypatch.setattr(Sender, "MAX_QUEUED_BYTES", 2 * size + 10)
    receiver_logic = _SlowFirstReply()
    sender, receiver, address = _slow_pair(receiver_logic)
    try:
        receiver_logic.queue_behind_the_first(sender, address, range(1, 8))
        receiver_logic.release.set()
        sender.flush(10.0)
        assert receiver_logic.got == [0, 6, 7] and sender.dropped == 5
    finally:
        receiver_logic.release.set()
        sender.close()
        receiver.close()


def test_grpc_sender_gives_up_a_large_message_in_flight_for_one_two_rounds_newer(monkeypatch):
    """A large message whose reply has not come by the time a model two rounds newer is queued
    would reach the receiver stale, and holds a model until then: its call is cancelled and the
    queued messages go on a new one."""
    from dfedrw.peer.transport.grpc import sender as grpc_sender
    monkeypatch.setattr(grpc_sender, "LARGE_MESSAGE", 10)
    receiver_logic = _SlowFirstReply()
    sender, receiver, address = _slow_pair(receiver_logic)
    try:
        receiver_logic.queue_behind_the_first(sender, address, [1])
        assert sender.dropped == 0  # one round newer: the one in flight may still be of use
        sender.send(1, encode(0, 2, vec(2), SPECS, chunk_bytes=16))
        deadline = time.monotonic() + 10
        while receiver_logic.got != [0, 1, 2] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert receiver_logic.got == [0, 1, 2] and sender.dropped == 1
    finally:
        receiver_logic.release.set()
        sender.close()
        receiver.close()


def test_grpc_sender_lets_a_message_go_once_its_reply_came():
    """The sender holds a message (the client's model) only while it is queued or in flight."""
    import gc
    import weakref

    from dfedrw.peer.transport.serde import message_out

    sender, receiver, address = _pair(lambda chunks, sender=None: (True, "", 0))
    try:
        sender.connect({1: address}, lambda peer, state: None)
        assert sender.wait_ready(10.0) == []
        sent = [message_out(0, r, vec(r), SPECS, chunk_bytes=16) for r in range(3)]
        refs = [weakref.ref(m) for m in sent]
        for m in sent:
            sender.send(1, m)
            sender.flush(10.0)
        del sent, m
        gc.collect()
        assert [r() for r in refs] == [None, None, None]
    finally:
        sender.close()
        receiver.close()
