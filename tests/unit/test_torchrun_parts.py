"""The torchrun launcher's parts and the torch transport's framing, with no socket, no process
group and no torchrun (the address exchange through a store is in
tests/integration/test_torchrun_rendezvous.py)."""

import pytest
import torch

from dfedrw.launch import torchrun as tr
from dfedrw.peer.transport import torchdist
from dfedrw.peer.transport.serde import decode, encode, join_chunks, TensorSpec

SPECS = (TensorSpec("0.weight", "float32", (3, 4)), TensorSpec("0.bias", "float32", (3,)))


def rank_env(**changes):
    base = dict(rank=0, world_size=4, local_rank=0, local_world_size=4, master_addr="127.0.0.1", master_port=29500)
    return tr.RankEnv(**{**base, **changes})


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
