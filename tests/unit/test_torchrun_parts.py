"""The torchrun launcher's parts and the torch transport's framing, in one process: a store on
127.0.0.1, no process group, no torchrun."""

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from launch import torchrun as tr
from launch.runner import run_scenario
from peer.node import run_grpc_client
from peer.transport import torchdist
from peer.transport.serde import decode, encode, join_chunks, TensorSpec

SPECS = (TensorSpec("0.weight", "float32", (3, 4)), TensorSpec("0.bias", "float32", (3,)))


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))


def rank_env(**changes):
    base = dict(rank=0, world_size=4, local_rank=0, local_world_size=4, master_addr="127.0.0.1", master_port=29500)
    return tr.RankEnv(**{**base, **changes})


# -- address exchange through the store ------------------------------------------------------
def test_every_rank_reads_its_neighbours_addresses(store):
    neighbours = {0: [1, 2], 1: [0], 2: [0]}
    books = {}

    def client(rank):
        # Each rank has its own connection to the store, as torchrun workers do.
        own = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))
        books[rank] = tr.exchange_addresses(own, rank, f"127.0.0.1:{7000 + rank}", neighbours[rank], timeout=10)

    threads = [threading.Thread(target=client, args=(r,)) for r in neighbours]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)

    assert books == {
        0: {1: "127.0.0.1:7001", 2: "127.0.0.1:7002"},
        1: {0: "127.0.0.1:7000"},
        2: {0: "127.0.0.1:7000"},
    }
    assert store.get("dfedrw/addr/2") == b"127.0.0.1:7002"


def test_a_peer_that_never_publishes_is_left_out_within_the_timeout(store):
    store.set("dfedrw/addr/1", "127.0.0.1:7001")

    book = tr.exchange_addresses(store, 0, "127.0.0.1:7000", [1, 2], timeout=0.5)

    assert book == {1: "127.0.0.1:7001"}


def test_done_marks_are_read_and_a_missing_rank_is_none(store):
    tr.mark_done(store, 0, True)
    tr.mark_done(store, 2, False)

    status = tr.wait_done(store, range(3), timeout=0.5)

    assert status == {0: "ok", 1: None, 2: "failed"}


# -- where a gRPC client listens and what it advertises ---------------------------------------
def test_one_node_keeps_the_scenario_host():
    assert tr.listen_and_advertise("127.0.0.1", rank_env(master_addr="localhost")) == ("127.0.0.1", None)
    assert tr.listen_and_advertise("127.0.0.1", rank_env(), override="10.1.2.3") == ("127.0.0.1", "10.1.2.3")


def test_a_remote_master_makes_a_loopback_host_listen_everywhere(monkeypatch):
    # Only the route lookup is replaced: the test sends nothing anywhere.
    monkeypatch.setattr(tr, "is_loopback", lambda host: host.startswith("127.") or host == "localhost")
    monkeypatch.setattr(tr, "route_address", lambda addr, port: "10.0.0.7")
    remote = rank_env(master_addr="10.0.0.1")

    assert tr.listen_and_advertise("127.0.0.1", remote) == ("0.0.0.0", "10.0.0.7")
    assert tr.listen_and_advertise("0.0.0.0", remote, override="node3.lan") == ("0.0.0.0", "node3.lan")
    assert tr.listen_and_advertise("10.0.0.9", remote) == ("10.0.0.9", None)


def test_route_to_a_loopback_master_is_loopback():
    assert tr.route_address("127.0.0.1", 29500) == "127.0.0.1"


def test_rank_env_reads_torchrun_variables():
    env = tr.RankEnv.from_environ(
        {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "1234"}
    )

    assert env == tr.RankEnv(3, 8, 1, 2, "localhost", 1234)
    with pytest.raises(ValueError, match="not under torchrun"):
        tr.RankEnv.from_environ({"RANK": "0"})


# -- errors a user can make --------------------------------------------------------------------
def test_world_size_must_match_the_scenario(small_scenario, tmp_path):
    scenario = small_scenario("topology.honest=4", "topology.byzantine=1")

    with pytest.raises(ValueError, match=r"WORLD_SIZE=3 .* 5 clients"):
        tr.run_torchrun(scenario, tmp_path, environ={"RANK": "0", "WORLD_SIZE": "3"})


def test_the_inproc_transport_cannot_run_under_torchrun(small_scenario, tmp_path):
    scenario = small_scenario("topology.honest=4", "topology.byzantine=1", "network.transport=inproc")

    with pytest.raises(ValueError, match="cannot run under torchrun"):
        tr.run_torchrun(scenario, tmp_path, environ={"RANK": "0", "WORLD_SIZE": "5"})


def test_torch_transport_outside_torchrun_is_a_clear_error(small_scenario, tmp_path):
    scenario = small_scenario("network.transport=torch")

    with pytest.raises(ValueError, match="only under torchrun"):
        run_scenario(scenario, tmp_path / "run")
    with pytest.raises(ValueError, match="only under torchrun"):
        run_grpc_client(scenario, 0, tmp_path / "peer", addresses={})
    with pytest.raises(RuntimeError, match="torchrun"):
        torchdist.TorchDistTransport(0, [(0, 1)])


# -- torch transport framing -------------------------------------------------------------------
def test_a_message_survives_the_tensor_framing_in_one_chunk():
    v = torch.randn(15, generator=torch.Generator().manual_seed(1))
    chunks = encode(2, 7, v, SPECS, num_samples=50, train_loss=0.5, chunk_bytes=8)
    cpu = torch.device("cpu")

    data = torchdist.frame(chunks)
    length = torchdist.length_tensor(len(data), cpu)
    received = torchdist.payload_bytes(torchdist.payload_tensor(data, cpu))
    chunk = torchdist.unframe(received)
    header, payload, wire = join_chunks(iter((chunk,)), 1 << 20)
    msg = decode(header, payload, SPECS, wire)

    assert length.dtype == torch.int64 and length.tolist() == [len(data)]
    assert received == data
    assert (msg.sender, msg.round, msg.num_samples, msg.train_loss) == (2, 7, 50, 0.5)
    assert torch.equal(msg.vector, v)


def test_one_chunk_is_sent_as_its_own_protobuf_bytes():
    chunks = encode(0, 0, torch.zeros(15), SPECS)

    assert torchdist.frame(chunks) == chunks[0].SerializeToString()


def test_announced_lengths_outside_the_limit_are_refused():
    assert torchdist.checked_length(0, 10) == 0
    assert torchdist.checked_length(10, 10) == 10
    with pytest.raises(torchdist.FrameError):
        torchdist.checked_length(11, 10)
    with pytest.raises(torchdist.FrameError):
        torchdist.checked_length(-1, 10)


def test_groups_are_created_in_one_order_whatever_the_edge_order():
    a = torchdist.directed_groups([(2, 0), (0, 1), (1, 2)])
    b = torchdist.directed_groups([(1, 0), (2, 1), (0, 2)])

    assert a == b == [(0, 1), (1, 0), (0, 2), (2, 0), (1, 2), (2, 1)]


def test_gloo_interface_is_found_for_an_address_and_left_alone_on_one_node():
    from launch.torchrun import RankEnv, gloo_interface, interface_of

    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.123") is None  # TEST-NET-1: held by no interface here
    env = RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    assert gloo_interface(env, {}) is None
    env2 = RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert gloo_interface(env2, {"GLOO_SOCKET_IFNAME": "eth7"}) is None
