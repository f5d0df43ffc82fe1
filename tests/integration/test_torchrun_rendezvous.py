"""The torchrun launcher's parts that need the network, in one process: the address exchange
through a TCPStore on 127.0.0.1 (ranks as threads), the route and interface lookups (UDP
sockets, nothing sent), and the torch transport refused outside torchrun. No process group,
no torchrun."""

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from dfedrw.launch import torchrun as tr
from dfedrw.launch.runner import run_scenario
from dfedrw.peer.client.process import run_grpc_client
from dfedrw.peer.transport import torchdist


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))


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


def test_a_rank_whose_heartbeat_stops_is_given_up_long_before_the_timeout_and_one_that_beats_is_waited_for(store):
    import time

    def connection():
        return dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))

    alive, gone = tr.Heartbeat(connection(), 1, every=0.05), tr.Heartbeat(connection(), 2, every=0.05)
    time.sleep(0.2)
    gone.stop()  # rank 2 killed outright: no more beats, no done mark

    def finish_later():
        time.sleep(1.5)  # past missed x beat: only its beats keep rank 0 waiting
        alive.stop()
        tr.mark_done(connection(), 1, True)

    threading.Thread(target=finish_later).start()
    tr.mark_done(store, 0, True)
    start = time.monotonic()
    status = tr.wait_done(store, range(3), timeout=30, beat=0.05, missed=6)
    assert status == {0: "ok", 1: "ok", 2: None}
    assert time.monotonic() - start < 10  # not the 30 s timeout


def test_route_to_a_loopback_master_is_loopback():
    assert tr.route_address("127.0.0.1", 29500) == "127.0.0.1"


def test_torch_transport_outside_torchrun_is_a_clear_error(small_scenario, tmp_path):
    scenario = small_scenario("network.transport=torch")

    with pytest.raises(ValueError, match="only under torchrun"):
        run_scenario(scenario, tmp_path / "run")
    with pytest.raises(ValueError, match="only under torchrun"):
        run_grpc_client(scenario, 0, tmp_path / "peer", addresses={})
    with pytest.raises(RuntimeError, match="torchrun"):
        torchdist.TorchDistTransport(0, [(0, 1)])


def test_gloo_interface_is_found_for_an_address_and_left_alone_on_one_node():
    from dfedrw.launch.torchrun import RankEnv, gloo_interface, interface_of

    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.123") is None  # TEST-NET-1: held by no interface here
    env = RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    assert gloo_interface(env, {}) is None
    env2 = RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert gloo_interface(env2, {"GLOO_SOCKET_IFNAME": "eth7"}) is None
