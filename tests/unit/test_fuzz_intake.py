"""Fuzzing the receive path of a real honest client: ``Client.deliver`` (join, decode, inbox).

Every generated message is bad by construction: either a random header whose tensor specs
differ from the client's model, or a valid encoding with at least one defect applied last.
On top of that, every slot a good message could fill (each neighbour, each round of the
window) already holds one, so a message that slipped through every check would still only
be a ``duplicate``, and the tests assert that no generated message ends as one: each defect is
caught by the check meant for it. Asserted: no exception escapes ``deliver``, nothing is
accepted, every message ends in exactly one counter, and the log stays small and traceback-free.
"""

from __future__ import annotations

import logging
import math
import random
import time
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dfedrw.peer.client.client import Client
from dfedrw.peer.transport.compression import Encoder
from dfedrw.peer.transport.inproc import InprocHub, InprocTransport
from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.serde import checksum_start, encode

ROUND = 100  # the client's current round; the window is ROUND .. ROUND + 2
U64 = 2**64 - 1
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # the client's own (launch/cli.py)

NAMES = ["0.weight", "0.bias", "", "w", "0.weight\n2026-01-01 00:00:00 ERROR peer.client.client: forged", "\x1b[31m\r\x00",
         "\u202eweight", "\U0001f600" * 30, "x" * 5000]
DTYPES = ["float32", "float64", "float16", "", "\x00", "float32 ", "FLOAT32", "\u00e9", "int8\nERROR"]
DIMS = [0, 1, 10, 64, 650, -1, -(2**63), 2**62, 2**63 - 1, 2**32, 3, 7]
SAMPLES = [0, 1, 100, 1437, 1438, 2**32, 2**63, U64]
LOSSES = [0.0, 0.5, -1.0, 1e6, 1e7, float("nan"), float("inf"), float("-inf"), 1e308]
ROUNDS = [0, 1, ROUND - 1, ROUND, ROUND + 1, ROUND + 2, ROUND + 3, 2**32, 2**63, U64]


class Counters:
    """Every message ends in exactly one of: accepted, stale, one rejection reason."""

    def __init__(self, peer: Client) -> None:
        self.inbox = peer.inbox

    def total(self) -> int:
        return self.inbox.accepted + self.inbox.stale + sum(self.inbox.rejected.values())


@pytest.fixture
def client(small_scenario, tmp_path):
    """Client 0 of a 4-ring (neighbours 1 and 3) at round ROUND, every window slot filled."""
    scenario = small_scenario("topology.kind=ring", "topology.honest=4", "topology.byzantine=0")
    peer = Client(scenario, 0, tmp_path, transport=InprocTransport(InprocHub(), "inproc:0"))
    peer.inbox.advance(ROUND)
    d = sum(s.numel for s in peer.specs)
    gen = torch.Generator().manual_seed(0)
    valid = {}
    for k in peer.neighbours:
        for r in range(ROUND - 2, ROUND + 6):
            valid[k, r] = encode(k, r, torch.randn(d, generator=gen), peer.specs, num_samples=300, train_loss=0.7, chunk_bytes=1024)
    for k in peer.neighbours:
        for r in range(ROUND, ROUND + 3):
            assert peer.deliver(iter(valid[k, r]), k) == (True, "", ROUND)
    assert peer.inbox.accepted == 6
    peer.valid = valid
    try:
        yield peer
    finally:
        peer.close()


def copy(chunks):
    out = []
    for c in chunks:
        n = pb.ModelChunk()
        n.CopyFrom(c)
        out.append(n)
    return out


def rechunk(header, payload, rng):
    size = rng.choice([1, 7, 64, 1000, 4096, len(payload) or 1])
    chunks = [pb.ModelChunk(header=header, data=payload[:size])]
    for start in range(size, len(payload), size):
        chunks.append(pb.ModelChunk(data=payload[start : start + size]))
    return chunks


# ------------------------------------------------------------------ generators


def random_message(rng: random.Random, peer: Client):
    """A random header with random tensor specs that never equal the model's, random data."""
    header = pb.ModelHeader()
    if rng.random() < 0.9:
        header.sender = rng.choice([0, 1, 2, 3, 4, 2**32 - 1, *peer.neighbours])
    header.round = rng.choice(ROUNDS)
    want = [(s.name, s.dtype, list(s.shape)) for s in peer.specs]
    specs = []
    for _ in range(rng.choice([0, 1, 2, 2, 2, 3, 50])):
        if rng.random() < 0.5 and want:
            name, dtype, shape = list(rng.choice(want))
            shape = list(shape)
        else:
            name, dtype, shape = rng.choice(NAMES), rng.choice(DTYPES), [rng.choice(DIMS) for _ in range(rng.randint(0, 4))]
        specs.append((name, dtype, shape))
    if specs == want:
        specs[rng.randrange(len(specs))] = ("0.weight", "float32", [64, 10])
    header.tensors.extend(pb.TensorSpec(name=n, dtype=t, shape=s) for n, t, s in specs)
    nbytes = rng.choice([0, 1, 100, 2600, 2601, rng.randrange(5000)])
    payload = rng.randbytes(nbytes)
    header.total_bytes = rng.choice([nbytes, nbytes, 0, 2600, U64, rng.randrange(2**20)])
    header.crc32 = zlib.crc32(payload, checksum_start(header)) if rng.random() < 0.7 else rng.randrange(2**32)
    header.num_samples = rng.choice(SAMPLES)
    header.train_loss = rng.choice(LOSSES)
    chunks = rechunk(header, payload, rng)
    if rng.random() < 0.1:
        rng.shuffle(chunks)
    if rng.random() < 0.05:
        chunks = []
    return chunks, auth(rng, header)


def auth(rng, header):
    """The sender the transport authenticated: mostly who the header names (TLS), sometimes none."""
    if rng.random() < 0.2 or not header.HasField("sender"):
        return None if rng.random() < 0.8 else rng.choice([1, 3])
    return header.sender


def flip_header_byte(rng, chunks):
    raw = bytearray(chunks[0].SerializeToString())
    if not raw:
        return
    raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
    try:
        chunks[0] = pb.ModelChunk.FromString(bytes(raw))
    except Exception:  # unparsable: gRPC itself would refuse it; keep the chunk as it was
        pass


def with_values(chunks, values, peer):
    """A message whose payload is ``values`` (CRC recomputed, so only the value check can catch it)."""
    header = pb.ModelHeader()
    header.CopyFrom(chunks[0].header)
    payload = np.asarray(values, dtype="<f4").tobytes()
    header.crc32 = zlib.crc32(payload, checksum_start(header))
    return rechunk(header, payload, random.Random(len(payload)))


def payload_of(chunks):
    return b"".join(c.data for c in chunks)


def relabel(h, chunks, round_: int) -> None:
    """Label the message with ``round_`` as its sender would (the checksum covers the round),
    and no more: CRC-32 is affine in the value it starts from, so the checksum moves by the
    change of round alone, and one that did not match the payload before still does not."""
    zeros = bytes(len(payload_of(chunks)))
    before = checksum_start(h)
    h.round = round_
    h.crc32 ^= zlib.crc32(zeros, before ^ checksum_start(h)) ^ zlib.crc32(zeros)


def defect(rng: random.Random, chunks, peer: Client, sender, kind: int):
    """Apply defect ``kind``, which no check may let through; returns (chunks, authenticated sender).

    A message gets distinct kinds, and a kind that cannot apply falls back to one that sets a
    field (never to one that toggles or swaps): two toggles or two swaps could undo each other."""
    h = chunks[0].header
    if kind in (12, 13, 14) and not h.tensors:  # a flipped header byte may have dropped them
        kind = 0
    d = sum(s.numel for s in peer.specs)
    if kind == 5 and len(payload_of(chunks)) != 4 * d:  # an earlier defect cut the payload
        kind = 6
    if kind == 0:  # stale round
        relabel(h, chunks, rng.choice([0, ROUND - 1, ROUND - 2]))
    elif kind == 1:  # far-future round
        relabel(h, chunks, rng.choice([ROUND + 3, 2**63, U64]))
    elif kind == 2:  # a sender that is no neighbour, or no client at all
        h.sender = rng.choice([0, 2, 4, 2**31, 2**32 - 1])
        sender = rng.choice([None, h.sender])
    elif kind == 3:  # impersonation: the certificate names another client
        sender = rng.choice([k for k in (0, 1, 2, 3) if k != h.sender])
    elif kind == 4:  # no sender field
        h.ClearField("sender")
    elif kind == 5:  # extreme or non-finite values
        values = np.frombuffer(payload_of(chunks), dtype="<f4").copy()
        values[rng.randrange(d)] = rng.choice([3.4e38, -3.4e38, 1.5e6, np.nan, np.inf, -np.inf])
        chunks = with_values(chunks, values, peer)
    elif kind == 6:  # implausible declared size
        h.num_samples = rng.choice([0, 1438, 2**32, U64])
    elif kind == 7:  # payload byte flipped (CRC-32 catches every single-byte error)
        i = rng.randrange(len(chunks))
        if chunks[i].data:
            data = bytearray(chunks[i].data)
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            chunks[i].data = bytes(data)
        else:
            h.num_samples = 0
    elif kind == 8:  # wrong checksum
        h.crc32 ^= 1 << rng.randrange(32)
    elif kind == 9:  # truncated
        if len(chunks) > 1 and rng.random() < 0.5:
            chunks = chunks[:-1]
        else:
            chunks[-1].data = chunks[-1].data[:-1]
    elif kind == 10:  # a header after the data, or a second header
        if len(chunks) < 2:
            chunks = [*chunks, pb.ModelChunk(data=b"\0")]
        if rng.random() < 0.5:
            chunks[0], chunks[1] = chunks[1], chunks[0]
        else:
            chunks[1].header.CopyFrom(h)
    elif kind == 11:  # two data chunks out of order (only chunks whose bytes differ)
        pairs = [(i, j) for i in range(len(chunks)) for j in range(i + 1, len(chunks)) if chunks[i].data != chunks[j].data]
        if pairs:
            i, j = rng.choice(pairs)
            header = pb.ModelHeader()
            header.CopyFrom(h)
            datas = [c.data for c in chunks]
            datas[i], datas[j] = datas[j], datas[i]
            chunks = [pb.ModelChunk(header=header, data=datas[0]), *(pb.ModelChunk(data=x) for x in datas[1:])]
        else:
            h.num_samples = 0
    elif kind == 12:  # a wrong dtype
        h.tensors[rng.randrange(len(h.tensors))].dtype = rng.choice(DTYPES[1:])
    elif kind == 13:  # a wrong, unicode or control-character tensor name
        h.tensors[rng.randrange(len(h.tensors))].name = rng.choice(NAMES[2:])
    elif kind == 14:  # huge, negative or overflowing dims
        t = h.tensors[rng.randrange(len(h.tensors))]
        del t.shape[:]
        t.shape.extend(rng.choice([[2**62, 4], [2**32, 2**32], [-1, -650], [2**63 - 1, 2**63 - 1], [0], [650, 1, 1, -1]]))
    else:  # a wrong declared size
        h.total_bytes = rng.choice([0, 2599, 2601, 1 << 40, U64])
    return chunks, sender


def mutated_message(rng: random.Random, peer: Client):
    """A valid encoding for a window slot (already filled), randomly flipped, then given a defect."""
    k = rng.choice(peer.neighbours)
    chunks = copy(peer.valid[k, rng.randrange(ROUND, ROUND + 3)])
    sender = k if rng.random() < 0.8 else None
    if rng.random() < 0.3:
        flip_header_byte(rng, chunks)
    for kind in rng.sample(range(16), rng.choice([1, 1, 1, 2, 3])):
        chunks, sender = defect(rng, chunks, peer, sender, kind)
    return chunks, sender


def generate(rng: random.Random, peer: Client):
    return random_message(rng, peer) if rng.random() < 0.4 else mutated_message(rng, peer)


def corpus(peer: Client):
    """The cases found by hand, each with the reason it must be rejected for."""
    v = peer.valid
    cases = []

    def case(reason, chunks, sender=1):
        cases.append((reason, chunks, sender))

    def edited(edit, k=1, r=ROUND):
        chunks = copy(v[k, r])
        edit(chunks[0].header)
        return chunks

    d = sum(s.numel for s in peer.specs)
    case("dtype_mismatch", edited(lambda h: setattr(h.tensors[0], "dtype", "float64")))
    case("shape_mismatch", edited(lambda h: h.tensors[0].shape.__setitem__(0, 2**62)))
    case("shape_mismatch", edited(lambda h: h.tensors[0].shape.__setitem__(1, -64)))
    case("shape_mismatch", edited(lambda h: (h.tensors[0].shape.__delitem__(slice(None)), h.tensors[0].shape.extend([2**32, 2**32]))))
    case("bad_checksum", edited(lambda h: setattr(h, "crc32", h.crc32 ^ 1)))
    truncated = copy(v[1, ROUND])
    truncated[-1].data = truncated[-1].data[:-4]
    case("size_mismatch", truncated)
    case("size_mismatch", copy(v[1, ROUND])[:-1])
    case("no_header", copy(v[1, ROUND])[1:] + copy(v[1, ROUND])[:1])
    late_header = copy(v[1, ROUND])
    late_header[1].header.CopyFrom(late_header[0].header)
    case("bad_chunk", late_header)
    case("future_round", encode(1, U64, torch.zeros(d), peer.specs, num_samples=300))
    # The round is inside the checksum: one changed on the way is a changed payload.
    case("bad_checksum", edited(lambda h: setattr(h, "round", U64)))
    case("bad_checksum", edited(lambda h: setattr(h, "round", ROUND - 1)))
    case("no_sender", edited(lambda h: h.ClearField("sender")), None)
    case("no_sender", edited(lambda h: h.ClearField("sender")), 1)
    case("shape_mismatch", edited(lambda h: setattr(h.tensors[0], "name", "0.weight\n2026-01-01 ERROR peer.client.client: forged")))
    case("shape_mismatch", edited(lambda h: setattr(h.tensors[1], "name", "\u202e\x1b[31m\U0001f600" * 20)))
    big = np.frombuffer(payload_of(v[1, ROUND]), dtype="<f4").copy()
    big[5] = 3.4e38
    case("implausible", with_values(v[1, ROUND], big, peer))
    case("implausible_samples", edited(lambda h: setattr(h, "num_samples", U64)))
    case("implausible_samples", edited(lambda h: setattr(h, "num_samples", 0)))
    for bad in (np.nan, np.inf, -np.inf):
        values = np.zeros(d, dtype=np.float32)
        values[0] = bad
        case("non_finite", with_values(v[1, ROUND], values, peer))
    # Scores (network.share_scores) that do not pair up, name a stranger, or are not finite;
    # one changed on the way fails the checksum.
    case("implausible_scores", edited(lambda h: (h.scored.extend([0, 1]), h.scores.append(0.5))))
    case("implausible_scores", edited(lambda h: (h.scored.extend([0, 5]), h.scores.extend([0.5, 0.5]))))
    case("implausible_scores", edited(lambda h: (h.scored.extend([0, 1, 2, 3]), h.scores.extend([0.5] * 4))))
    case("implausible_scores", edited(lambda h: (h.scored.append(0), h.scores.append(math.nan))))
    rescored = encode(1, ROUND, torch.zeros(d), peer.specs, num_samples=300, scores={0: 0.5, 1: 0.25}, chunk_bytes=1024)
    rescored[0].header.scores[1] = 0.75
    case("bad_checksum", rescored)
    case("impersonation", copy(v[1, ROUND]), 3)
    case("not_neighbour", edited(lambda h: setattr(h, "sender", 2)), None)
    case("unknown_sender", edited(lambda h: setattr(h, "sender", 2**32 - 1)), None)
    case("stale_round", copy(v[1, ROUND - 1]))
    case("duplicate", copy(v[1, ROUND]))
    case("empty", [], None)
    return cases


# ------------------------------------------------------------------ the tests


def deliver_all(peer: Client, messages):
    """Deliver every message; returns (verdicts, exceptions that escaped, seconds)."""
    verdicts, escaped = [], []
    t0 = time.perf_counter()
    for chunks, sender in messages:
        try:
            verdicts.append(peer.deliver(iter(chunks), sender))
        except Exception as exc:  # what must never happen
            escaped.append(exc)
    return verdicts, escaped, time.perf_counter() - t0


def test_the_corpus_of_cases_found_is_rejected_each_for_its_reason(client):
    counters = Counters(client)
    before = counters.total()
    cases = corpus(client)
    verdicts, escaped, _ = deliver_all(client, [(c, s) for _, c, s in cases])
    assert escaped == []
    assert [(ok, reason) for ok, reason, _ in verdicts] == [(False, reason) for reason, _, _ in cases]
    assert counters.total() - before == len(cases) and client.inbox.accepted == 6


def test_declared_losses_out_of_range_read_as_absent(client):
    for loss in (float("nan"), float("inf"), float("-inf"), -1.0, 1e300):
        chunks = encode(1, ROUND + 3, torch.zeros(650), client.specs, num_samples=5, train_loss=loss)
        client.inbox.advance(ROUND + 1)  # frees a slot for it
        assert client.deliver(iter(chunks), 1)[:2] == (True, "")
        assert math.isnan(client.inbox.wait(ROUND + 3, [], 0.0)[1].train_loss)
        client.inbox.advance(ROUND)
        client.inbox._buffer.pop(ROUND + 3)


def run_fuzz(peer: Client, count: int, seed: int, log_file=None):
    rng = random.Random(seed)
    counters = Counters(peer)
    before, accepted0 = counters.total(), peer.inbox.accepted
    handler = None
    peer_log = logging.getLogger("dfedrw.peer")
    level = peer_log.level
    if log_file is not None:
        handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        peer_log.addHandler(handler)
        peer_log.setLevel(logging.INFO)
    verdicts, escaped, seconds = [], [], 0.0
    try:
        for start in range(0, count, 5_000):  # generated in batches: 100,000 at once would take GBs
            messages = [generate(rng, peer) for _ in range(min(5_000, count - start))]
            v, e, t = deliver_all(peer, messages)
            verdicts += v
            escaped += e
            seconds += t
    finally:
        if handler is not None:
            peer_log.removeHandler(handler)
            peer_log.setLevel(level)
            handler.close()
    reasons = {}
    for _, reason, _ in verdicts:
        reasons[reason] = reasons.get(reason, 0) + 1
    return {
        "count": count,
        "escaped": len(escaped),
        "accepted": sum(1 for ok, _, _ in verdicts if ok),
        "inbox_accepted": peer.inbox.accepted - accepted0,
        "accounted": counters.total() - before,
        "duplicates": reasons.get("duplicate", 0),
        "reasons": reasons,
        "per_second": count / seconds,
        "first_escaped": escaped[:1],
    }


def check(result):
    print(
        f"\nfuzz: {result['count']} messages, {result['escaped']} exceptions escaped, {result['accepted']} accepted, "
        f"{result['accounted']} counted, {result['per_second']:.0f} messages/s; by reason {sorted(result['reasons'].items())}"
    )
    assert result["escaped"] == 0, result["first_escaped"]
    assert result["accepted"] == 0 and result["inbox_accepted"] == 0
    assert result["accounted"] == result["count"]
    # A defect caught by no check would reach the (full) window slot and end as a duplicate.
    assert result["duplicates"] == 0
    assert "" not in result["reasons"]


def test_fuzz_2000_generated_bad_messages(client, tmp_path):
    log_file = tmp_path / "client.log"
    result = run_fuzz(client, 2_000, seed=1, log_file=log_file)
    check(result)
    text = log_file.read_text()
    assert "Traceback" not in text and len(text.encode()) < 100_000
    assert "forged" not in text or "\\n" in text


@pytest.mark.slow
def test_fuzz_100000_generated_bad_messages_and_the_log_stays_under_1_mb(client, tmp_path):
    log_file = tmp_path / "client.log"
    result = run_fuzz(client, 100_000, seed=2, log_file=log_file)
    check(result)
    size = log_file.stat().st_size
    text = log_file.read_text()
    print(f"log: {size} bytes, {len(text.splitlines())} lines for {result['count']} bad messages")
    assert size < 1_000_000
    assert "Traceback" not in text
    # Every line is one the client wrote: nothing from a message started a line of its own.
    assert all(" dfedrw.peer." in line for line in text.splitlines())


# Hypothesis: arbitrary protobuf chunk lists built field by field.
specs_st = st.lists(
    st.builds(
        lambda n, t, s: pb.TensorSpec(name=n, dtype=t, shape=s),
        st.text(max_size=50),
        st.sampled_from(DTYPES) | st.text(max_size=10),
        st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
    ),
    max_size=4,
)


@st.composite
def chunk_lists(draw):
    header = pb.ModelHeader(
        round=draw(st.integers(0, U64)),
        tensors=draw(specs_st),
        total_bytes=draw(st.integers(0, U64) | st.integers(0, 3000)),
        crc32=draw(st.integers(0, 2**32 - 1)),
        num_samples=draw(st.integers(0, U64)),
        train_loss=draw(st.floats(allow_nan=True, allow_infinity=True)),
    )
    if draw(st.booleans()):
        header.sender = draw(st.integers(0, 2**32 - 1))
    datas = draw(st.lists(st.binary(max_size=3000), max_size=4))
    chunks = [pb.ModelChunk(data=x) for x in datas]
    for i in draw(st.lists(st.integers(0, 4), max_size=2)):
        if i < len(chunks):
            chunks[i].header.CopyFrom(header)
    sender = draw(st.none() | st.integers(0, 5))
    return chunks, sender


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(message=chunk_lists())
def test_hypothesis_chunk_lists_never_escape_and_never_get_in(client, message):
    chunks, sender = message
    counters = Counters(client)
    before = counters.total()
    accepted, reason, _ = client.deliver(iter(chunks), sender)
    # Tensor specs drawn at random never match the model (names are 0.weight/0.bias with
    # shapes (10, 64)/(10,) and a float32 dtype); if one ever does it is caught by the slot check.
    assert not accepted and reason not in ("", "duplicate") or _matches_model(chunks, client)
    assert counters.total() - before == 1


def _matches_model(chunks, peer):
    first = chunks[0].header if chunks and chunks[0].HasField("header") else None
    return first is not None and [(t.name, t.dtype, tuple(t.shape)) for t in first.tensors] == [
        (s.name, s.dtype, s.shape) for s in peer.specs
    ]


def test_a_message_no_check_foresaw_is_rejected_not_raised(client, caplog):
    def broken():
        yield copy(client.valid[1, ROUND])[0]
        raise RuntimeError("the stream broke\nERROR forged")

    with caplog.at_level(logging.WARNING, logger="dfedrw.peer"):
        assert client.deliver(iter([object()]), 1) == (False, "malformed", ROUND)
        assert client.deliver(broken(), 1) == (False, "malformed", ROUND)
    assert client.inbox.rejected["malformed"] == 2
    assert all(r.exc_info is None and "forged" not in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------ the compressed intake


@pytest.fixture
def topk_client(small_scenario, tmp_path):
    """Client 0 of a 4-ring under top-k (no refresh: every message after the first a difference)."""
    scenario = small_scenario(
        "topology.kind=ring", "topology.honest=4", "topology.byzantine=0", "network.compression=topk",
        "network.compression_params.topk.refresh=0",
    )
    peer = Client(scenario, 0, tmp_path, transport=InprocTransport(InprocHub(), "inproc:0"))
    try:
        yield peer
    finally:
        peer.close()


def label_defect(rng: random.Random, chunks, r: int):
    """A copy of a top-k message whose labels or payload changed on the way (the checksum as sent)."""
    chunks = copy(chunks)
    h = chunks[0].header
    kind = rng.randrange(5)
    if kind == 0:
        h.round = rng.choice([r - 1, r + 1, r + 2, r + 3, 2**32, 2**63, U64])
    elif kind == 1 and h.HasField("base_round"):
        h.base_round = rng.choice([h.base_round + 1, h.base_round + 2, h.base_round ^ 1, U64])
    elif kind == 2:
        h.encoding = rng.choice(["int8", "", "topk\x00"])
    elif kind == 3:
        h.block = rng.choice([0, 1, 256])
    else:
        i = rng.randrange(len(chunks))
        data = bytearray(chunks[i].data)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        chunks[i].data = bytes(data)
    return chunks


def test_fuzz_top_k_labels_changed_on_the_way_are_refused_and_the_link_stays_in_step(topk_client):
    # Each round the sender's message comes twice: a copy changed on the way first, then as
    # sent. The copy is refused, whatever changed, and leaves what the receiver holds of the
    # sender as it was: the message itself is taken, and the two copies of the link agree.
    peer, rng = topk_client, random.Random(3)
    d = sum(s.numel for s in peer.specs)
    sender = Encoder(peer.encoder.compression, 1, peer.specs, seed=0, chunk_bytes=512)
    gen = torch.Generator().manual_seed(0)
    model = torch.randn(d, generator=gen)
    refused = {}
    for r in range(300):
        peer.inbox.advance(r)
        model = model + 0.01 * torch.randn(d, generator=gen)
        message = sender.round(r, model, num_samples=300, train_loss=0.5).to(0)
        if r:
            accepted, reason, _ = peer.deliver(iter(label_defect(rng, message, r)), 1)
            assert not accepted and reason not in ("", "duplicate")
            refused[reason] = refused.get(reason, 0) + 1
        assert peer.deliver(iter(message), 1) == (True, "", r)
        held_round, held_model = peer.intake.decoder.bases[1]
        assert held_round == r and torch.equal(held_model, sender.bases[0][1])
    assert "base_mismatch" not in peer.inbox.rejected and {"bad_checksum", "bad_encoding"} <= refused.keys()
