"""Clients under a topology schedule: what a Byzantine client that sends to everyone gets
accepted, the round records of a run, and gRPC connections opened on demand and closed idle."""

from __future__ import annotations

import json
import threading

import torch

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.client.client import Client
from dfedrw.peer.wiring.plan import scenario_graphs
from dfedrw.peer.results.records import read_rounds
from dfedrw.peer.transport.grpc.transport import GrpcTransport
from dfedrw.peer.transport.inproc import InprocHub, InprocTransport
from dfedrw.peer.transport.serde import encode
from tests.support.runs import quiet_console
from tests.support.wire import SPECS, vec

EPIDEMIC = ("topology.schedule=epidemic", "topology.schedule_params.epidemic.fanout=2")


def small(*overrides: str):
    return load_scenario(
        None, ["data.name=digits", "topology.honest=8", "topology.byzantine=2", "attack.name=gaussian", "eval.every=0", "rounds=12", *overrides]
    )


def test_a_byzantine_client_sending_to_everyone_is_accepted_only_where_the_schedule_gives_it_an_edge(tmp_path):
    # Prepare: every honest client's intake (the one its transport hands messages to), in
    # round 0 with the round window 0..2 open
    sc = small(*EPIDEMIC)
    graphs = scenario_graphs(sc)
    hub = InprocHub()
    honest = graphs.topology.honest()
    clients = {k: Client(sc, k, tmp_path, transport=InprocTransport(hub, f"inproc:{k}")) for k in honest}
    d = sum(s.numel for s in clients[honest[0]].specs)
    window = sc.network.round_window
    try:
        for b in sorted(graphs.topology.byzantine):
            for r in range(window + 1):
                # Execute: b sends its round-r model to every honest client (twice)
                chunks = encode(b, r, torch.zeros(d), clients[honest[0]].specs, num_samples=100, train_loss=1.0)
                verdicts = {k: clients[k].deliver(iter(chunks), b)[:2] for k in honest}
                again = {k: clients[k].deliver(iter(chunks), b)[:2] for k in honest}

                # Assert: accepted exactly by the round's receivers of b, once each
                allowed = {k for k in graphs.receivers_of(b, r) if k in honest}
                assert {k for k, v in verdicts.items() if v[0]} == allowed
                assert len(allowed) <= 2  # the fanout
                assert all(v == (False, "not_neighbour") for k, v in verdicts.items() if k not in allowed)
                assert all(again[k] == (False, "duplicate") for k in allowed)
        accepted = sum(c.inbox.accepted for c in clients.values())
        assert accepted == sum(len([k for k in graphs.receivers_of(b, r) if k in honest]) for b in graphs.topology.byzantine for r in range(window + 1))
    finally:
        for c in clients.values():
            c.close()


def test_every_honest_client_aggregates_exactly_its_senders_of_the_round(tmp_path):
    # Prepare
    sc = small(*EPIDEMIC, "network.transport=inproc", "aggregation.rule=trimmed_mean", "network.round_timeout=30")
    graphs = scenario_graphs(sc)

    # Execute
    _, summary = run_scenario(sc, tmp_path, console=quiet_console())

    # Assert: weights name the client and its round's senders (none missing: every client ran)
    assert summary["failed_peers"] == [] and summary["mean_degree"] == 2.0 and summary["schedule"] == "epidemic"
    byzantine = graphs.topology.byzantine
    for k in graphs.topology.honest():
        for record in read_rounds(tmp_path, k):
            r = record["round"]
            senders = graphs.senders_to(k, r)
            assert record["neighbours"] == list(senders) and record["sent_to"] == list(graphs.receivers_of(k, r))
            assert sorted(map(int, record["weights"])) == sorted({k, *senders}) and record["missing"] == []
            assert record["told_byzantine"] == len(set(senders) & byzantine)
        final = json.loads((tmp_path / "peers" / f"{k}.json").read_text())
        assert final["schedule"] == "epidemic" and final["rejected_messages"] == 0
    for b in byzantine:
        for record in read_rounds(tmp_path, b):
            assert set(record["received_from"]) == {j for j in graphs.senders_to(b, record["round"]) if j not in byzantine}


def test_grpc_on_demand_opens_a_channel_when_first_sent_to_and_closes_it_when_idle():
    # Prepare: two receivers, and a sender that knows both addresses but opened nothing
    got, lock = [], threading.Lock()

    def deliver(chunks, sender=None):
        with lock:
            got.append(sender)
        return True, "", 0

    receivers = [GrpcTransport("127.0.0.1", 0, chunk_bytes=16) for _ in range(2)]
    addresses = {k + 1: t.start(deliver) for k, t in enumerate(receivers)}
    sender = GrpcTransport("127.0.0.1", 0, chunk_bytes=16, on_demand=True, idle_channel_timeout=3600.0)
    sender.start(lambda m, sender=None: (True, "", 0))
    try:
        sender.connect(addresses, lambda peer, state: None)
        assert sender.channels_opened == 0 and sender.wait_ready(10.0) == []

        # Execute: send to peer 1 only, then let every channel count as idle
        sender.send(1, encode(0, 0, vec(0), SPECS, chunk_bytes=16))
        sender.flush(10.0)
        opened_after_one = sender.channels_opened
        not_yet = sender.close_idle()
        closed = sender.close_idle(now=float("inf"))
        sender.send(1, encode(0, 1, vec(1), SPECS, chunk_bytes=16))
        sender.flush(10.0)

        # Assert
        assert opened_after_one == 1 and not_yet == [] and closed == [1]
        assert sender.channels_opened == 2 and sender.channels_closed == 1
        assert len(got) == 2
    finally:
        sender.close()
        for t in receivers:
            t.close()
