"""Colluders' pool messages and the pool store: encoding, every rejection, the union, the store's
window and bound, the exchange's liveness over an in-memory hand-over, a client's intake of
pools (by the authenticated sender) and whom each launcher lets a colluder reach. No sockets."""

from __future__ import annotations

import math
import threading
import zlib

import pytest
import torch

from dfedrw.launch.compose_plan import peer_command, plan_services
from dfedrw.launch.torchrun import transport_edges
from dfedrw.peer.client.collusion import Collusion, PoolStore, pool_union
from dfedrw.peer.wiring.plan import colluding_group
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.wiring.build import grpc_transport_for
from dfedrw.peer.client.client import Client
from dfedrw.peer.wiring.plan import scenario_topology
from dfedrw.peer.transport.inbox import Inbox
from dfedrw.peer.transport.inproc import InprocHub, InprocTransport
from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.pools import PoolMessage, decode_pool, pool_bytes, pool_out
from dfedrw.peer.transport.serde import Plausible, TensorSpec, WireError, decode, encode, join_chunks

SPECS = (TensorSpec("0.weight", "float32", (2, 2)), TensorSpec("0.bias", "float32", (2,)))
D = 6  # 4 + 2 values, 24 bytes a model
NUM_CLIENTS = 7


def rows(*values: float) -> torch.Tensor:
    """One row of D equal values per argument."""
    return torch.tensor([[v] * D for v in values], dtype=torch.float32)


def encoded_pool(*args, **kwargs):
    """A pool message's chunks, as protobuf messages."""
    return list(pool_out(*args, **kwargs))


def parts(chunks):
    return join_chunks(iter(chunks), 1 << 20)


def decoded(chunks, plausible=Plausible(), num_clients=NUM_CLIENTS):
    header, payload, wire = parts(chunks)
    return decode_pool(header, payload, SPECS, wire, plausible, num_clients=num_clients)


def reason(fn) -> str:
    with pytest.raises(WireError) as err:
        fn()
    return err.value.reason


def edited(chunks, edit):
    """A copy of a one-chunk pool with ``edit(header, chunk)`` applied (the CRC not fixed)."""
    chunk = pb.ModelChunk()
    chunk.CopyFrom(chunks[0])
    edit(chunk.header, chunk)
    return [chunk]


# -- the wire ------------------------------------------------------------------------------------
def test_pool_round_trip_in_many_chunks():
    # Prepare: three models from clients 0, 2 and 4, rows 1, 2, 3 (72 bytes in 10-byte chunks).
    vectors = torch.randn(3, D, generator=torch.Generator().manual_seed(0))

    # Execute
    chunks = encoded_pool(5, 9, (0, 2, 4), vectors, SPECS, chunk_bytes=10)
    msg = decoded(chunks)

    # Assert
    assert len(chunks) == 8  # ceil(72 / 10)
    assert (msg.sender, msg.round, msg.origins) == (5, 9, (0, 2, 4))
    assert torch.equal(msg.vectors, vectors) and msg.vectors.dtype == torch.float32
    assert msg.nbytes == sum(c.ByteSize() for c in chunks)


def test_an_empty_pool_round_trips():
    msg = decoded(encoded_pool(5, 1, (), torch.empty(0, D), SPECS))
    assert msg.origins == () and tuple(msg.vectors.shape) == (0, D)


def test_pool_bytes_is_one_model_per_client():
    assert pool_bytes(SPECS, NUM_CLIENTS) == 7 * 24


def test_encoding_refuses_a_pool_that_cannot_be_one():
    with pytest.raises(ValueError, match="distinct"):
        encoded_pool(5, 0, (1, 1), rows(1.0, 2.0), SPECS)
    with pytest.raises(ValueError, match="bytes"):
        encoded_pool(5, 0, (1, 2), torch.zeros(2, D + 1), SPECS)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda h, c: setattr(h, "crc32", h.crc32 ^ 1), "bad_checksum"),
        (lambda h, c: setattr(h, "total_bytes", h.total_bytes - 4), "size_mismatch"),  # header says 1 model less 4 bytes
        (lambda h, c: h.origins.append(6), "size_mismatch"),  # 3 origins, 2 models of bytes
        (lambda h, c: h.origins.__setitem__(1, 1), "duplicate_origin"),
        (lambda h, c: h.origins.__setitem__(0, NUM_CLIENTS), "unknown_origin"),
        (lambda h, c: h.origins.extend(range(2, 8)), "too_many_origins"),  # 8 origins > 7 clients
        (lambda h, c: h.ClearField("sender"), "no_sender"),
        (lambda h, c: setattr(h.tensors[0], "dtype", "float64"), "dtype_mismatch"),
        (lambda h, c: h.tensors[1].shape.__setitem__(0, 3), "shape_mismatch"),
        (lambda h, c: h.tensors.pop(), "shape_mismatch"),
    ],
    ids=["crc", "total-bytes", "origins-vs-bytes", "duplicate", "out-of-range", "too-many", "no-sender", "dtype", "shape", "tensor-count"],
)
def test_every_malformed_pool_is_rejected(edit, expected):
    good = encoded_pool(5, 3, (1, 2), rows(1.0, 2.0), SPECS)
    bad = edited(good, edit)
    header, payload = bad[0].header, bad[0].data
    assert reason(lambda: decode_pool(header, payload, SPECS, 0, Plausible(), num_clients=NUM_CLIENTS)) == expected


def test_a_payload_shorter_than_declared_is_a_size_mismatch():
    header, payload, _ = parts(encoded_pool(5, 3, (1, 2), rows(1.0, 2.0), SPECS))
    assert reason(lambda: decode_pool(header, payload[:-4], SPECS, 0, num_clients=NUM_CLIENTS)) == "size_mismatch"


@pytest.mark.parametrize(
    ("bad_value", "expected"), [(math.nan, "non_finite"), (math.inf, "non_finite"), (2e6, "implausible")], ids=["nan", "inf", "huge"]
)
def test_a_pool_with_one_bad_value_in_any_model_is_rejected(bad_value, expected):
    vectors = rows(1.0, 2.0, 3.0)
    vectors[2, 5] = bad_value  # the last value of the last model
    chunks = encoded_pool(5, 3, (0, 1, 2), vectors, SPECS)
    assert reason(lambda: decoded(chunks, Plausible(max_abs_value=1e6))) == expected


def test_a_model_decoder_rejects_a_pool():
    # Prepare: a one-model pool is the size of a model message; only its origins tell them apart.
    header, payload, wire = parts(encoded_pool(5, 3, (1,), rows(1.0), SPECS))
    header.num_samples = 10

    # Execute / Assert
    assert reason(lambda: decode(header, payload, SPECS, wire)) == "pool_message"
    ordinary = parts(encode(1, 3, rows(1.0)[0], SPECS, num_samples=10))
    assert torch.equal(decode(ordinary[0], ordinary[1], SPECS).vector, rows(1.0)[0])


def test_a_model_message_is_no_pool_of_one():
    # A model message has no origins: read as a pool it holds no model, yet carries bytes.
    header, payload, _ = parts(encode(1, 3, rows(1.0)[0], SPECS, num_samples=10))
    assert reason(lambda: decode_pool(header, payload, SPECS, num_clients=NUM_CLIENTS)) == "size_mismatch"


# -- the union -----------------------------------------------------------------------------------
def test_union_by_origin_prefers_its_own_copy_and_sorts():
    # Prepare: client 5 received 3 and 0; colluder 6 pooled 0 (another copy) and 2; colluder 4 pooled 1.
    mine = rows(30.0, 0.0)
    six = PoolMessage(sender=6, round=0, origins=(2, 0), vectors=rows(2.0, 99.0))
    four = PoolMessage(sender=4, round=0, origins=(1,), vectors=rows(1.0))

    # Execute
    pooled = pool_union(5, (3, 0), mine, {6: six, 4: four})

    # Assert: senders 0..3 sorted; 0 is its own copy (0.0, not 99.0).
    assert pooled.senders == (0, 1, 2, 3)
    assert torch.equal(pooled.vectors, rows(0.0, 1.0, 2.0, 30.0))
    assert pooled.used == (4, 5, 6)


def test_union_of_nothing_is_empty_with_the_model_width():
    pooled = pool_union(5, (), torch.empty(0, D), {6: PoolMessage(6, 0, (), torch.empty(0, D))})
    assert pooled.senders == () and tuple(pooled.vectors.shape) == (0, D) and pooled.used == (5, 6)


def test_colluding_group_is_every_byzantine_client_sorted_or_none():
    assert colluding_group({6, 2, 4}, True) == (2, 4, 6)
    assert colluding_group({6, 2, 4}, False) == ()


# -- the store -----------------------------------------------------------------------------------
def pool(sender: int, round_: int, *origins: int) -> PoolMessage:
    return PoolMessage(sender=sender, round=round_, origins=origins, vectors=rows(*map(float, origins)), nbytes=100)


@pytest.fixture
def counters():
    return Inbox(5, (0, 1), NUM_CLIENTS, 2)


def test_store_keeps_the_window_and_drops_stale_rounds(counters):
    store = PoolStore(5, (4, 6), 2, counters)
    store.advance(10)

    verdicts = [store.offer(pool(6, r, 0)) for r in (9, 10, 12, 13)]

    assert verdicts == [(False, "stale_round"), (True, ""), (True, ""), (False, "future_round")]
    assert counters.stale == 1 and counters.rejected == {"future_round": 1}
    assert counters.accepted == 2 and counters.bytes_received == 200
    store.advance(11)  # round 10's pool goes
    assert len(store) == 1 and store.wait(12, (6,), 0.0).keys() == {6}


def test_store_rejects_a_second_pool_and_a_stranger(counters):
    store = PoolStore(5, (4, 6), 2, counters)
    assert store.offer(pool(6, 0, 1)) == (True, "")
    assert store.offer(pool(6, 0, 2)) == (False, "duplicate")
    assert store.offer(pool(3, 0, 1)) == (False, "not_colluder")
    assert torch.equal(store.wait(0, (6,), 0.0)[6].vectors, rows(1.0))  # the first one stands


def test_store_is_bounded(counters):
    # The bound defaults to one pool per colluder and round of the window: (2 + 1) * 2 = 6.
    assert PoolStore(5, (4, 6), 2, counters).max_entries == 6
    store = PoolStore(5, (4, 6), 2, counters, max_entries=3)

    verdicts = [store.offer(pool(k, r, 0)) for r in (0, 1) for k in (4, 6)]

    assert verdicts[:3] == [(True, "")] * 3 and verdicts[3] == (False, "pool_full")
    store.advance(1)  # round 0's two pools go: room again
    assert store.offer(pool(6, 2, 0)) == (True, "")


def test_store_wait_returns_when_complete_or_at_the_deadline(counters):
    store = PoolStore(5, (4, 6), 2, counters)
    store.offer(pool(4, 0, 1))
    assert store.wait(0, (4, 6), 0.05).keys() == {4}  # 6 never sent: the deadline
    store.set_gone(6)
    assert store.wait(0, (4, 6), 30.0).keys() == {4}  # 6 is gone: complete at once

    late = threading.Timer(0.05, lambda: store.offer(pool(4, 1, 2)))
    late.start()
    got = store.wait(1, (4,), 30.0)  # woken by its arrival, not the deadline
    late.join()
    assert got.keys() == {4}
    assert store.offer(pool(6, 1, 2)) == (True, "") and 6 not in store.gone()  # a pool from a gone colluder brings it back


def test_store_refuses_bad_settings(counters):
    with pytest.raises(ValueError, match="window"):
        PoolStore(5, (4,), -1, counters)
    with pytest.raises(ValueError, match="max_entries"):
        PoolStore(5, (4,), 2, counters, max_entries=0)


# -- the exchange, over an in-memory hand-over ---------------------------------------------------
class Wire:
    """Hands each pool to the receiving colluder's ``accept`` at once (as the in-process
    transport does), unless that colluder is ``down``."""

    def __init__(self) -> None:
        self.members: dict[int, Collusion] = {}
        self.down: set[int] = set()
        self.sent: list[tuple[int, int, int]] = []  # (from, to, round)

    def transport(self, own: int):
        wire = self

        class Hand:
            def send(self, to: int, chunks) -> None:
                header = chunks[0].header
                wire.sent.append((own, to, header.round))
                if to not in wire.down:
                    h, payload, size = join_chunks(iter(chunks), 1 << 20)
                    wire.members[to].accept(h, payload, size)

        return Hand()


def colluders(wire: Wire, ids=(4, 6), max_missed=2, probe_every=5) -> dict[int, Collusion]:
    for k in ids:
        wire.members[k] = Collusion(
            k, ids, specs=SPECS, num_clients=NUM_CLIENTS, transport=wire.transport(k), counters=Inbox(k, (), NUM_CLIENTS, 2),
            window=2, max_missed=max_missed, probe_every=probe_every,
        )
    return wire.members


def test_two_colluders_each_see_the_union():
    wire = Wire()
    c = colluders(wire)

    # Execute: 6 sends first (its pool waits in 4's store), then 4 sends and finds 6's in.
    c[6].store.advance(0)
    c[6].transport.send(4, encoded_pool(6, 0, (0, 2), rows(0.0, 2.0), SPECS))
    four = c[4].exchange(0, (1, 2), rows(1.0, 2.0), timeout=5.0)
    six = c[6].exchange(0, (0, 2), rows(0.0, 2.0), timeout=5.0)

    # Assert
    assert four.senders == six.senders == (0, 1, 2)
    assert torch.equal(four.vectors, rows(0.0, 1.0, 2.0)) and torch.equal(six.vectors, four.vectors)
    assert four.used == six.used == (4, 6)


def test_a_silent_colluder_is_given_up_then_only_probed_and_taken_back():
    # Prepare: colluder 6 is down; 4 gives up after 2 missed pools and probes every 3 rounds.
    wire = Wire()
    c = colluders(wire, max_missed=2, probe_every=3)
    wire.down.add(6)

    # Execute: rounds 0..4 alone.
    used = [c[4].exchange(r, (1,), rows(1.0), timeout=0.02).used for r in range(5)]

    # Assert: pooled with itself only; sent to 6 in rounds 0, 1 (waited for), then 3 (a probe).
    assert used == [(4,)] * 5
    assert [r for (a, b, r) in wire.sent if (a, b) == (4, 6)] == [0, 1, 3]
    assert 6 in c[4].store.gone()

    # Execute: 6 comes back with its round-4 pool; 4 sent its round-4 pool to nobody, so it
    # sends it again, and waits for 6 from round 5 on.
    wire.down.clear()
    c[6].store.advance(4)
    c[6].transport.send(4, encoded_pool(6, 4, (2,), rows(2.0), SPECS))
    assert (4, 6, 4) in wire.sent and 6 not in c[4].store.gone()
    c[6].transport.send(4, encoded_pool(6, 5, (2,), rows(2.0), SPECS))
    assert c[4].exchange(5, (1,), rows(1.0), timeout=5.0).used == (4, 6)


def test_a_pool_naming_a_colluder_as_its_origin_is_rejected():
    wire = Wire()
    c = colluders(wire)
    header, payload, size = parts(encoded_pool(6, 0, (4,), rows(4.0), SPECS))
    assert reason(lambda: c[4].accept(header, payload, size)) == "colluder_origin"


def test_an_unreachable_colluder_is_not_waited_for():
    wire = Wire()
    c = colluders(wire)
    c[4].on_reachability(6, "unreachable")
    assert c[4].exchange(0, (), torch.empty(0, D), timeout=30.0).used == (4,)  # no 30 s wait


def test_collusion_refuses_bad_settings():
    with pytest.raises(ValueError, match="must include"):
        Collusion(3, (4, 6), specs=SPECS, num_clients=NUM_CLIENTS, transport=None, counters=None, window=2, max_missed=2)
    with pytest.raises(ValueError, match="max_missed"):
        Collusion(4, (4, 6), specs=SPECS, num_clients=NUM_CLIENTS, transport=None, counters=None, window=2, max_missed=0)


def test_crc_is_over_the_round_and_the_whole_pool():
    chunks = encoded_pool(5, 3, (1, 2), rows(1.0, 2.0), SPECS)
    header, payload, _ = parts(chunks)
    assert header.crc32 == zlib.crc32((3).to_bytes(8, "little") + payload) and len(payload) == 2 * 24


# -- a client's intake, and whom it reaches ----------------------------------------------------
COLLUDING = ("data.name=digits", "topology.honest=5", "topology.byzantine=2", "attack.name=alie", "attack.colluding=true")


@pytest.fixture
def net(tmp_path):
    """A colluding scenario whose two Byzantine clients are not neighbours; make(k) builds client k."""
    sc = load_scenario(None, list(COLLUDING))
    topology = scenario_topology(sc)
    b, c = sorted(topology.byzantine)
    assert c not in topology.neighbours(b)

    def make(k, scenario=sc):
        return Client(scenario, k, tmp_path / str(k), transport=InprocTransport(InprocHub(), f"inproc:{k}"))

    honest = next(k for k in topology.neighbours(b) if k not in topology.byzantine)
    return sc, topology, b, c, honest, make


def model_pool(client: Client, sender: int, origins, round_=0):
    d = sum(s.numel for s in client.specs)
    return encoded_pool(sender, round_, origins, torch.ones(len(origins), d), client.specs)


def test_a_colluder_takes_a_pool_from_the_other_colluder_only(net):
    sc, topology, b, c, honest, make = net
    colluder = make(b)
    try:
        # Execute / Assert: from the other colluder (authenticated), though not a neighbour.
        assert colluder.deliver(iter(model_pool(colluder, c, (honest,))), c) == (True, "", 0)
        assert colluder.collusion.store.wait(0, (c,), 0.0)[c].origins == (honest,)
        # Unauthenticated (in-process): by the id the message gives.
        assert colluder.deliver(iter(model_pool(colluder, c, (honest,), round_=1)), None) == (True, "", 0)
        # From an honest neighbour, a pool is no model.
        assert colluder.deliver(iter(model_pool(colluder, honest, (honest,))), honest)[:2] == (False, "pool_message")
        # In the other colluder's name.
        assert colluder.deliver(iter(model_pool(colluder, c, (honest,))), honest)[:2] == (False, "impersonation")
        # Naming a colluder as an origin.
        assert colluder.deliver(iter(model_pool(colluder, c, (b,), round_=2)), c)[:2] == (False, "colluder_origin")
        # Its honest neighbours' models still go to the inbox.
        d = sum(s.numel for s in colluder.specs)
        assert colluder.deliver(iter(encode(honest, 0, torch.ones(d), colluder.specs, num_samples=10)), honest) == (True, "", 0)
        assert colluder.inbox.rejected == {"pool_message": 1, "impersonation": 1, "colluder_origin": 1}
    finally:
        colluder.close()


def test_an_honest_client_and_a_lone_byzantine_one_reject_pools(net):
    sc, topology, b, c, honest, make = net
    receiver = make(honest)
    alone = make(b, load_scenario(None, [*COLLUDING[:-1]]))  # the same run without collusion
    try:
        assert receiver.collusion is None and receiver.contacts == receiver.neighbours
        assert receiver.deliver(iter(model_pool(receiver, b, (honest,))), b)[:2] == (False, "pool_message")
        assert alone.collusion is None and alone.contacts == alone.neighbours
        assert alone.deliver(iter(model_pool(alone, c, (honest,))), c)[:2] == (False, "not_neighbour")
    finally:
        receiver.close()
        alone.close()


def test_a_colluder_reaches_the_other_and_may_receive_a_pool(net):
    sc, topology, b, c, honest, make = net
    colluder, other = make(b), make(honest)
    try:
        assert colluder.contacts == (*topology.neighbours(b), c)
        assert colluder.max_bytes >= pool_bytes(colluder.specs, 7) > other.max_bytes
        plain = load_scenario(None, [*COLLUDING, "network.tls=off"])
        model = sum(s.nbytes for s in colluder.specs)
        assert grpc_transport_for(plain, "127.0.0.1", 0, client=b).max_message_bytes == 7 * model
        assert grpc_transport_for(plain, "127.0.0.1", 0, client=honest).max_message_bytes == model
    finally:
        colluder.close()
        other.close()


def test_compose_and_torchrun_give_colluders_each_other(net):
    sc, topology, b, c, honest, make = net
    services = {s.id: s for s in plan_services(sc)}
    assert f"{c}=client-{c}:50051" in peer_command(services[b], 50051)
    assert f"{b}=client-{b}:50051" in peer_command(services[c], 50051)
    assert services[honest].contacts == topology.neighbours(honest)
    edges = transport_edges(sc)
    assert (b, c) in edges and len(edges) == len(topology.graph.edges) + 1
    assert transport_edges(load_scenario(None, list(COLLUDING[:-1]))) == sorted(
        (min(u, v), max(u, v)) for u, v in topology.graph.edges
    )
