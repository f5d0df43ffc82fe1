"""Wire encoding, validation and the inbox: no sockets needed."""

import asyncio
import logging
import threading
import time

import grpc
import numpy as np
import pytest
import torch

from dfedrw.peer.client.client import Client
from dfedrw.peer.client.rounds import Liveness
from dfedrw.peer.transport.inproc import InprocHub, InprocTransport
from dfedrw.peer.transport.framing import MessageSplitter
from dfedrw.peer.transport.grpc.admission import PeerServicer
from dfedrw.peer.transport.grpc.limits import CallLimits
from dfedrw.peer.transport.inbox import Inbox
from dfedrw.peer.transport.serde import ModelMessage, Plausible, TensorSpec, WireError, decode, encode, join_chunks
from tests.support.wire import D, SPECS, handle_push, roundtrip, split_messages, vec


def test_encode_decode_roundtrip_in_many_chunks():
    v = vec()
    chunks = encode(2, 7, v, SPECS, num_samples=100, chunk_bytes=8)
    assert len(chunks) == 8  # 60 bytes in 8-byte chunks
    msg = roundtrip(chunks)
    assert (msg.sender, msg.round, msg.num_samples) == (2, 7, 100)
    assert torch.equal(msg.vector, v)
    assert msg.nbytes > 60


def test_payload_is_little_endian_float32_bytes_not_pickle():
    v = torch.arange(D, dtype=torch.float32)
    chunks = encode(0, 0, v, SPECS)
    assert chunks[0].data == np.arange(D, dtype="<f4").tobytes()


@pytest.mark.parametrize(
    "specs, reason",
    [
        ((TensorSpec("0.weight", "float32", (4, 3)), TensorSpec("0.bias", "float32", (3,))), "shape_mismatch"),
        ((TensorSpec("0.weight", "float32", (3, 4)),), "shape_mismatch"),
    ],
)
def test_layout_mismatch_is_rejected(specs, reason):
    sender_specs = specs if sum(s.numel for s in specs) == D else (TensorSpec("x", "float32", (12,)),)
    chunks = encode(1, 0, vec()[: sum(s.numel for s in sender_specs)], sender_specs)
    with pytest.raises(WireError) as err:
        roundtrip(chunks)
    assert err.value.reason == reason


def test_nan_and_inf_are_rejected():
    for bad in (float("nan"), float("inf")):
        v = vec()
        v[3] = bad
        with pytest.raises(WireError) as err:
            roundtrip(encode(1, 0, v, SPECS))
        assert err.value.reason == "non_finite"


def test_corrupted_payload_fails_checksum():
    chunks = encode(1, 0, vec(), SPECS)
    chunks[0].data = b"\0" + chunks[0].data[1:]
    with pytest.raises(WireError) as err:
        roundtrip(chunks)
    assert err.value.reason == "bad_checksum"


def test_oversized_and_truncated_streams_are_rejected():
    chunks = encode(1, 0, vec(), SPECS, chunk_bytes=16)
    with pytest.raises(WireError) as err:
        join_chunks(iter(chunks), max_bytes=30)
    assert err.value.reason == "too_large"
    with pytest.raises(WireError) as err:
        join_chunks(iter(chunks[:-1]), max_bytes=1 << 20)
    assert err.value.reason == "size_mismatch"
    with pytest.raises(WireError) as err:
        join_chunks(iter(chunks[1:]), max_bytes=1 << 20)
    assert err.value.reason == "no_header"


def test_a_header_without_a_sender_is_not_client_0():
    chunks = encode(0, 0, vec(), SPECS)
    assert chunks[0].header.HasField("sender")  # encode always sets it, 0 included
    assert roundtrip(chunks).sender == 0
    chunks[0].header.ClearField("sender")
    with pytest.raises(WireError) as err:
        roundtrip(chunks)
    assert err.value.reason == "no_sender"


def test_implausible_values_and_declared_sizes_are_rejected():
    limits = Plausible(max_abs_value=1e6, max_num_samples=1000)

    def check(chunks):
        header, payload, wire = join_chunks(iter(chunks), 1 << 20)
        return decode(header, payload, SPECS, wire, limits)

    for big in (3.4e38, -3.4e38, 1.0000001e6, -2e6):
        v = vec()
        v[7] = big
        with pytest.raises(WireError) as err:
            check(encode(1, 0, v, SPECS, num_samples=10))
        assert err.value.reason == "implausible"
    v = vec()
    v[0] = 1e6  # the bound itself is allowed
    assert check(encode(1, 0, v, SPECS, num_samples=10)).vector[0] == 1e6
    for n in (0, 1001, 2**64 - 1):
        with pytest.raises(WireError) as err:
            check(encode(1, 0, vec(), SPECS, num_samples=n))
        assert err.value.reason == "implausible_samples"
    assert check(encode(1, 0, vec(), SPECS, num_samples=1000)).num_samples == 1000


def test_a_declared_loss_out_of_range_reads_as_absent():
    limits = Plausible(max_train_loss=1e6)
    for loss, read in [(0.5, 0.5), (0.0, 0.0), (1e6, 1e6), (1e7, None), (-0.1, None), (float("nan"), None), (float("inf"), None), (float("-inf"), None)]:
        header, payload, wire = join_chunks(iter(encode(1, 0, vec(), SPECS, train_loss=loss)), 1 << 20)
        got = decode(header, payload, SPECS, wire, limits).train_loss
        assert (np.isnan(got) if read is None else got == read), (loss, got)


def test_text_from_a_message_is_escaped_and_cut_in_the_error():
    forged = "0.weight\n2026-01-01 00:00:00 ERROR peer.client.client: forged" + "x" * 500
    wrong = (TensorSpec(forged, "float32", (3, 4)), SPECS[1])
    with pytest.raises(WireError) as err:
        roundtrip(encode(1, 0, vec(), wrong))
    assert err.value.reason == "shape_mismatch" and "\n" not in str(err.value) and len(str(err.value)) < 200
    bad_dtype = (TensorSpec("0.weight", "\x1b[31mfloat32\r", (3, 4)), SPECS[1])
    chunks = encode(1, 0, vec(), SPECS)
    chunks[0].header.tensors[0].dtype = bad_dtype[0].dtype
    with pytest.raises(WireError) as err:
        roundtrip(chunks)
    assert err.value.reason == "dtype_mismatch" and "\x1b" not in str(err.value) and "\r" not in str(err.value)


def msg(sender, rnd):
    return ModelMessage(sender=sender, round=rnd, vector=vec(sender), nbytes=10)


def test_inbox_window_stale_future_duplicate_and_strangers():
    inbox = Inbox(own_id=0, neighbours=[1, 2], num_clients=4, window=2)
    inbox.advance(5)
    assert inbox.offer(msg(1, 5)) == (True, "")
    assert inbox.offer(msg(2, 7)) == (True, "")  # buffered for later
    assert inbox.offer(msg(1, 4)) == (False, "stale_round")
    assert inbox.offer(msg(1, 8)) == (False, "future_round")
    assert inbox.offer(msg(1, 5)) == (False, "duplicate")
    assert inbox.offer(msg(3, 5)) == (False, "not_neighbour")
    assert inbox.offer(msg(9, 5)) == (False, "unknown_sender")
    assert dict(inbox.rejected) == {"future_round": 1, "duplicate": 1, "not_neighbour": 1, "unknown_sender": 1}
    assert inbox.stale == 1
    inbox.advance(7)
    assert set(inbox.wait(7, [], 0.0)) == {2}


def test_inbox_wait_returns_at_deadline_with_what_arrived():
    inbox = Inbox(0, [1, 2], 3, 2)
    inbox.offer(msg(1, 0))
    t0 = time.monotonic()
    got = inbox.wait(0, [1, 2], timeout=0.2)
    assert set(got) == {1}
    assert 0.15 < time.monotonic() - t0 < 2.0


def test_inbox_wait_wakes_on_arrival_and_on_gone():
    inbox = Inbox(0, [1, 2], 3, 2)
    threading.Timer(0.05, lambda: inbox.offer(msg(1, 0))).start()
    threading.Timer(0.1, lambda: inbox.set_gone(2)).start()
    t0 = time.monotonic()
    got = inbox.wait(0, [1, 2], timeout=10.0)
    assert set(got) == {1}
    assert time.monotonic() - t0 < 5.0
    # a message from a peer marked gone brings it back
    inbox.offer(msg(2, 1))
    assert 2 not in inbox.gone()


def test_a_stale_message_is_no_sign_of_life():
    # Messages for rounds already passed, sent in the name of a neighbour presumed gone, must
    # not make this client wait for it again: anyone who can send in its name could replay them.
    inbox = Inbox(0, [1, 2], 3, 2)
    inbox.advance(5)
    inbox.set_gone(2)
    for r in range(5):
        assert inbox.offer(msg(2, r)) == (False, "stale_round")
    assert 2 in inbox.gone() and inbox.stale == 5
    t0 = time.monotonic()
    inbox.offer(msg(1, 5))
    assert set(inbox.wait(5, [1, 2], timeout=10.0)) == {1}  # not waiting for 2
    assert time.monotonic() - t0 < 5.0
    # A message for the current round or the window ahead does bring it back.
    assert inbox.offer(msg(2, 6)) == (True, "")
    assert 2 not in inbox.gone()


def test_a_neighbour_that_came_back_and_goes_silent_again_is_given_up_again():
    """Each absence costs at most max_missed_rounds deadlines, not only the first: a neighbour
    that came back and fell silent again used to be waited for until the deadline every round."""
    inbox, liveness = Inbox(0, [1, 2], 3, 2), Liveness(2)
    given_up = []
    for r in range(12):
        expected = frozenset({1, 2}) - inbox.gone()
        liveness.update(inbox, expected, {1: object()})  # 2 never delivers
        given_up.append(2 in inbox.gone())
        if r == 5:
            inbox.set_gone(2, False)  # it came back (a message of the window arrived)
    # Gone after its second miss; back after round 5, gone again after its next two misses.
    assert given_up == [False, True, True, True, True, True, False, True, True, True, True, True]
    assert liveness.missed[1] == 0


def test_rejections_and_stale_messages_are_counted_each_but_logged_rarely(caplog):
    inbox = Inbox(0, [1], 3, 2)
    inbox.advance(5)
    with caplog.at_level(logging.INFO, logger="dfedrw.peer.transport.inbox"):
        for _ in range(1000):
            inbox.offer(msg(2, 5))  # not a neighbour
            inbox.offer(msg(1, 99))  # far future
            inbox.offer(msg(1, 1))  # stale
    assert dict(inbox.rejected) == {"not_neighbour": 1000, "future_round": 1000} and inbox.stale == 1000
    assert len(caplog.records) == 3  # one line per reason within the 10 s
    assert all(r.exc_info is None for r in caplog.records)


def test_inbox_wakes_the_round_loop_only_when_its_round_is_complete():
    inbox = Inbox(0, [1, 2, 3], 4, 2)
    wakes = []
    notify_all = inbox._cond.notify_all
    inbox._cond.notify_all = lambda: (wakes.append(time.monotonic()), notify_all())
    got = {}
    waiter = threading.Thread(target=lambda: got.update(inbox.wait(0, [1, 2, 3], timeout=10.0)))
    waiter.start()
    while inbox._waiting is None:
        time.sleep(0.001)

    inbox.offer(msg(1, 0))
    inbox.offer(msg(2, 1))  # a later round: nothing to wake for
    inbox.offer(msg(2, 0))
    assert wakes == [] and waiter.is_alive()
    inbox.set_gone(3)  # the last one missing is gone: round 0 is complete
    waiter.join(5.0)
    assert not waiter.is_alive() and len(wakes) == 1 and set(got) == {1, 2}
    inbox.offer(msg(1, 1))  # nobody waiting
    assert len(wakes) == 1


def test_servicer_logic_needs_no_socket():
    seen = []

    def deliver(chunks, sender=None):
        seen.extend(chunks)
        return False, "future_round", 3

    reply = handle_push(iter(encode(1, 0, vec(), SPECS)), deliver)
    assert (reply.accepted, reply.reason, reply.round) == (False, "future_round", 3)
    assert len(seen) == 1


# --------------------------------------------------------------------------- Exchange: many messages on one call


def test_split_messages_cuts_a_call_at_headers():
    messages = [encode(1, r, vec(r), SPECS, chunk_bytes=16) for r in range(3)]
    assert all(len(m) == 4 for m in messages)  # 60 bytes in chunks of 16

    out = list(split_messages([c for m in messages for c in m], max_bytes=1 << 20))

    assert out == messages
    assert [roundtrip(m).round for m in out] == [0, 1, 2]


def test_split_messages_bad_framing_comes_out_to_be_rejected():
    good = encode(1, 0, vec(), SPECS, chunk_bytes=16)
    stray = good[1]  # a data chunk with no message open
    short = encode(1, 1, vec(1), SPECS, chunk_bytes=16)[:2]  # cut short by the next header
    huge = encode(1, 2, vec(2), SPECS, chunk_bytes=16)  # declares more than the limit below
    huge[0].header.total_bytes = 10_000

    out = list(split_messages([stray, *short, *huge, *good], max_bytes=1000))

    assert out == [[stray], short, [huge[0]], good]  # huge's data chunks were skipped
    with pytest.raises(WireError, match="no_header"):
        join_chunks(iter(out[0]), 1000)
    with pytest.raises(WireError, match="size_mismatch"):
        join_chunks(iter(out[1]), 1000)
    with pytest.raises(WireError, match="too_large"):
        join_chunks(iter(out[2]), 1000)


def test_exchange_answers_each_message_and_stops_reading_a_stranger():
    read = []

    def chunks(sender):
        for r in range(5):
            read.append(r)
            yield from encode(sender, r, vec(r), SPECS, chunk_bytes=16)

    verdicts = iter([(True, "", 0), (False, "stale_round", 2), (True, "", 2), (True, "", 3), (True, "", 4)])

    def deliver(message, sender=None):
        assert len(list(message)) == 4  # a whole message per call of deliver
        return next(verdicts)

    replies = exchange(PeerServicer(deliver, 1 << 20), chunks(1))
    assert [(r.accepted, r.reason, r.round) for r in replies] == [(True, "", 0), (False, "stale_round", 2), (True, "", 2), (True, "", 3), (True, "", 4)]

    read.clear()
    replies = exchange(PeerServicer(lambda m, sender=None: (False, "not_neighbour", 0), 1 << 20), chunks(9))
    assert [(r.accepted, r.reason) for r in replies] == [(False, "not_neighbour")] and read == [0]


class Aborted(Exception):
    pass


class FakeContext:
    """What the servicer uses of a gRPC call's context: the replies it writes, how it ends."""

    def __init__(self):
        self.replies, self.status = [], None

    async def write(self, reply):
        self.replies.append(reply)

    async def abort(self, code, details):
        self.status = code
        raise Aborted(details)

    def peer(self):
        return "ipv4:127.0.0.1:50000"


class CertifiedContext(FakeContext):
    """A call whose TLS handshake verified a certificate naming client ``sender`` of run ``run``."""

    def __init__(self, run, sender):
        super().__init__()
        self.uri = f"dfedrw://{run}/client/{sender}".encode()

    def auth_context(self):
        return {"peer_uri": [self.uri]}


def exchange(servicer, chunks, context=None):
    """The replies of the servicer's Exchange handler to a call carrying ``chunks``."""
    context = context or FakeContext()

    async def call():
        async def incoming():
            for chunk in chunks:
                yield chunk

        try:
            await servicer.Exchange(incoming(), context)
        except Aborted:
            pass
        return context.replies

    return asyncio.run(call())


@pytest.fixture
def ring_client(small_scenario, tmp_path):
    """Client 0 of a 4-client ring (neighbours 1 and 3), in round 7, and a model it accepts."""
    scenario = small_scenario("topology.kind=ring", "topology.honest=4", "topology.byzantine=0")
    peer = Client(scenario, 0, tmp_path, transport=InprocTransport(InprocHub(), "inproc:0"))
    try:
        peer.inbox.advance(7)
        yield peer, torch.zeros(sum(s.numel for s in peer.specs))
    finally:
        peer.close()


def test_a_client_answers_with_its_round(ring_client):
    peer, good = ring_client
    assert peer.deliver(iter(encode(1, 7, good, peer.specs))) == (True, "", 7)
    assert peer.deliver(iter(encode(1, 5, good, peer.specs))) == (False, "stale_round", 7)
    assert peer.deliver(iter(encode(2, 7, good, peer.specs))) == (False, "not_neighbour", 7)


def test_a_shut_out_neighbour_is_not_waited_for_until_its_next_accepted_message(ring_client):
    peer, good = ring_client
    peer.presence.on_reachability(1, "reachable")
    assert peer.inbox.gone() == frozenset()
    # Its messages cannot arrive while our server refuses its calls: right away, no
    # deadline is spent on it, even if it sent a model a moment ago.
    assert peer.deliver(iter(encode(1, 7, good, peer.specs))) == (True, "", 7)
    peer.presence.on_reachability(1, "shut_out")
    assert peer.inbox.gone() == {1}
    # It is alive: it still gets every model, unlike a neighbour that cannot be reached.
    sent = []
    peer.transport.send = lambda to, chunks: sent.append(to)
    peer.presence.on_reachability(3, "unreachable")
    for r in range(1, 5):
        peer._send_all(r, good, 10, (1, 3), 0.0)
    assert sent == [1, 1, 1, 1]
    # Once let in again, its next message of the window brings it back.
    assert peer.deliver(iter(encode(1, 8, good, peer.specs))) == (True, "", 7)
    assert peer.inbox.gone() == {3} and peer.presence.back_at == {1: 8} and peer.presence.shut_out == set()


def _push(servicer, sent, read):
    async def call():
        async def incoming():
            for i, chunk in enumerate(sent):
                read.append(i)
                yield chunk

        return await servicer.Push(incoming(), None)

    return asyncio.run(call())


def test_push_reads_one_message_and_no_more():
    read = []
    sent = encode(1, 0, vec(), SPECS, chunk_bytes=16) * 10
    got = []
    servicer = PeerServicer(lambda chunks, sender=None: (got.append(list(chunks)), (True, "", 0))[1], max_bytes=200)
    reply = _push(servicer, sent, read)
    assert reply.accepted and got == [sent[:4]] and read == [0, 1, 2, 3]
    # Header-only chunks: each is a whole (empty) message, so one is read.
    read.clear()
    header = encode(1, 0, vec(), SPECS)[0]
    bare = type(header)()
    bare.header.CopyFrom(header.header)
    bare.header.total_bytes = 0
    _push(servicer, [bare] * 1000, read)
    assert read == [0]
    # A header that declares more than the limit: out at once.
    read.clear()
    huge = type(header)()
    huge.header.CopyFrom(header.header)
    huge.header.total_bytes = 10**9
    _push(servicer, [huge] + sent, read)
    assert read == [0]


def test_a_message_of_empty_chunks_holds_at_most_max_chunks():
    """A header that declares a size within the limit followed by chunks that carry nothing
    would otherwise be buffered without end (each parsed chunk costs memory, not bytes)."""
    header = encode(1, 0, vec(), SPECS)[0]
    header.ClearField("data")
    empty = type(header)()
    empty.data = b""
    splitter = MessageSplitter(max_bytes=1000, max_chunks=8)
    out = []
    for chunk in [header] + [empty] * 100 + encode(1, 1, vec(1), SPECS, chunk_bytes=16):
        out.extend(splitter.feed(chunk))
    assert [len(m) for m in out] == [8, 4]  # the first cut at 8 chunks, its rest skipped
    assert splitter.current is None  # nothing held: the next message began and ended
    with pytest.raises(WireError, match="size_mismatch"):
        join_chunks(iter(out[0]), 1000)


def _flood(servicer, messages):
    """Replies of one Exchange call carrying ``messages``, and how it ended (None: as usual)."""
    context = FakeContext()
    replies = exchange(servicer, [c for m in messages for c in m], context)
    return replies, context.status


def test_a_sender_past_its_bucket_is_answered_rate_limited_then_shut_out():
    limits = CallLimits(burst=4, per_round=2, per_second=0.0, block_seconds=60.0, idle_call_timeout=0.3)
    delivered = []

    def deliver(chunks, sender=None):
        delivered.append(1)
        return False, "stale_round", 0

    servicer = PeerServicer(deliver, 1 << 20, limits=limits)
    replies, refusal = _flood(servicer, [encode(1, 0, vec(), SPECS)] * 100)
    reasons = [r.reason for r in replies]
    # The first copy is news (a late model, the sender's newest): it costs nothing. Then 4
    # delivered (the burst), 8 answered unread (2 x burst past empty), and it is shut out.
    assert reasons == ["stale_round"] * 5 + ["rate_limited"] * 8 and len(delivered) == 5
    assert refusal == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert servicer.refused == {"rate_limited": 8, "disconnected": 1, "blocked": 1}
    # While it is shut out even a new call is refused before a chunk is read, after being held
    # (here for the idle timeout, 0.3 s): one call after another costs it time, not us work.
    t0 = time.monotonic()
    replies, refusal = _flood(servicer, [encode(1, 0, vec(), SPECS)])
    assert replies == [] and refusal == grpc.StatusCode.RESOURCE_EXHAUSTED and len(delivered) == 5
    assert 0.25 < time.monotonic() - t0 < 5
    assert servicer.refused["blocked"] == 2


def test_the_client_is_told_which_authenticated_sender_was_shut_out():
    """So that it stops waiting for a neighbour whose messages cannot arrive for a while. A
    sender known only by its address (no TLS) is no client id: nobody is named."""
    limits = CallLimits(burst=2, per_round=0, per_second=0.0, block_seconds=60.0)
    flood = [encode(1, 0, vec(), SPECS)] * 20
    shut_out = []
    servicer = PeerServicer(lambda chunks, sender=None: (False, "duplicate", 0), 1 << 20, "run1", limits=limits, on_shut_out=shut_out.append)
    replies = exchange(servicer, [c for m in flood for c in m], CertifiedContext("run1", 3))
    assert [r.reason for r in replies] == ["duplicate"] * 2 + ["rate_limited"] * 4
    assert shut_out == [3] and servicer.refused["disconnected"] == 1
    anonymous = PeerServicer(lambda chunks, sender=None: (False, "duplicate", 0), 1 << 20, limits=limits, on_shut_out=shut_out.append)
    exchange(anonymous, [c for m in flood for c in m])
    assert anonymous.refused["disconnected"] == 1 and shut_out == [3]


def test_the_bucket_refills_each_round_of_the_receiver():
    """An honest neighbour sends one message a round: it is never limited however many rounds."""
    limits = CallLimits(burst=4, per_round=2, per_second=0.0)
    state = {"round": 0}

    def deliver(chunks, sender=None):
        state["round"] += 1  # the receiver moves on a round per message
        return True, "", state["round"]

    servicer = PeerServicer(deliver, 1 << 20, limits=limits)
    replies, refusal = _flood(servicer, [encode(1, r, vec(), SPECS) for r in range(500)])
    assert refusal is None and all(r.accepted for r in replies) and len(replies) == 500
    assert servicer.refused == {}


@pytest.mark.parametrize("model", ["softmax_regression", "mlp"])
def test_a_receiver_buffers_no_more_than_the_models_size_per_call(small_scenario, tmp_path, model):
    from dfedrw.peer.wiring.build import grpc_transport_for, scenario_model_specs

    scenario = small_scenario(f"train.model={model}", "train.hidden=8", "network.tls=off")
    transport = grpc_transport_for(scenario, "127.0.0.1", 0)
    peer = Client(scenario, 0, tmp_path, transport=InprocTransport(InprocHub(), "inproc:0"))
    try:
        assert scenario_model_specs(scenario) == peer.specs
        assert transport.max_message_bytes == sum(s.nbytes for s in peer.specs) < scenario.network.max_message_bytes
    finally:
        peer.close()
