"""Asynchronous gossip in the batched engine: each client's steps on the simulated clock, what
each holds when it aggregates and how stale (hand computed on a timeline with no ties), the
Byzantine clients' answers, compression, and the same records as the clients engine writes."""

from __future__ import annotations

import json

import pytest

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.results.records import read_rounds
from dfedrw.peer.wiring.plan import scenario_topology
from tests.support.runs import quiet_console

BASE = ("data.name=digits", "rounds=6", "eval.every=3", "network.protocol=async", "clock.step_seconds=1.0")


def _finals(out):
    return {int(p.stem): json.loads(p.read_text()) for p in (out / "peers").glob("*.json")}


def test_each_step_holds_the_newest_model_that_arrived_by_its_end_hand_computed(tmp_path):
    # Two clients: 0 steps every second, 1 (speed 0.5) every two; each message takes 0.1 s.
    sc = load_scenario(None, [
        *BASE, "engine.name=batched", "topology.honest=2", "topology.byzantine=0", "attack.name=none", "aggregation.rule=dfedavg",
        "peers.1.speed=0.5", "links.latency=0.1",
    ])
    out, summary = run_scenario(sc, tmp_path / "run", console=quiet_console())
    fast, slow = read_rounds(out, 0), read_rounds(out, 1)
    assert [r["seconds"] for r in fast] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert [r["seconds"] for r in slow] == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    # Client 1's models leave at 2, 4, 6, ... and arrive 0.1 s later, in client 0's steps
    # 2, 4, ...: nothing held before its step 2, then each held for two of its steps.
    assert [r["missing"] for r in fast] == [[1], [1], [], [], [], []]
    assert [r["staleness"] for r in fast] == [{}, {}, {"1": 0}, {"1": 1}, {"1": 0}, {"1": 1}]
    # Client 0's models leave every second: at each of client 1's ends (2, 4, ...) the one sent
    # a second before has arrived, in the same step of client 1; after 6 s client 0 is done and
    # its last model (sent at 6, arrived 6.1, in client 1's step 3) grows stale.
    assert [r["staleness"] for r in slow] == [{"0": 0}, {"0": 0}, {"0": 0}, {"0": 0}, {"0": 1}, {"0": 2}]
    finals = _finals(out)
    assert finals[0]["gossip"]["steps_per_second"] == 1.0 and finals[1]["gossip"]["steps_per_second"] == 0.5
    assert finals[1]["gossip"]["staleness_total"] == 3
    assert summary["honest_completed"] == 2 and finals[0]["bytes_to"]["1"] == 6 * fast[0]["bytes_sent"]


def test_max_staleness_leaves_the_older_models_out(tmp_path):
    sc = load_scenario(None, [
        *BASE, "engine.name=batched", "topology.honest=2", "topology.byzantine=0", "attack.name=none", "aggregation.rule=dfedavg",
        "peers.1.speed=0.5", "links.latency=0.1", "network.max_staleness=1",
    ])
    out, _ = run_scenario(sc, tmp_path / "run", console=quiet_console())
    slow = read_rounds(out, 1)
    assert [r["staleness"] for r in slow] == [{"0": 0}, {"0": 0}, {"0": 0}, {"0": 0}, {"0": 1}, {}]
    assert slow[-1]["missing"] == [0] and slow[-1]["weights"] == {"1": 1.0}


def test_byzantine_clients_answer_every_model_they_receive(tmp_path):
    sc = load_scenario(None, [
        *BASE, "engine.name=batched", "topology.honest=5", "topology.byzantine=1", "attack.name=gaussian", "aggregation.rule=trimmed_mean",
        "train.speed_spread=0.5", "links.latency=0.01",
    ])
    out, summary = run_scenario(sc, tmp_path / "run", console=quiet_console())
    topo = scenario_topology(sc)
    (b,) = topo.byzantine
    records = read_rounds(out, b)
    honest_neighbours = set(topo.neighbours(b))
    for k in honest_neighbours:
        labels = [r["answered"][str(k)] for r in records if str(k) in r["answered"]]
        assert labels == list(range(6))  # every model of each neighbour answered, once, in order
        assert any(str(b) in r["staleness"] for r in read_rounds(out, k))
    assert _finals(out)[b]["gossip"]["crafts"] == len(records) and summary["honest_completed"] == 5


@pytest.mark.parametrize("compression", ["int8", "topk"])
def test_compressed_models_cross_asynchronous_links(tmp_path, compression):
    common = [*BASE, "engine.name=batched", "topology.honest=4", "topology.byzantine=0", "attack.name=none", "rounds=10", "eval.every=10", "links.latency=0.01"]
    raw_out, raw = run_scenario(load_scenario(None, common), tmp_path / "raw", console=quiet_console())
    out, summary = run_scenario(load_scenario(None, [*common, f"network.compression={compression}"]), tmp_path / compression, console=quiet_console())
    assert summary["honest_mean_bytes_sent"] < 0.75 * raw["honest_mean_bytes_sent"]
    assert summary["honest_mean_accuracy"] > 0.8 * raw["honest_mean_accuracy"]


def test_both_engines_write_the_same_records_and_finals_under_asynchronous_gossip(tmp_path):
    common = [*BASE, "topology.honest=4", "topology.byzantine=1", "attack.name=gaussian", "aggregation.rule=trimmed_mean"]
    outs = {}
    for engine, extra in (("batched", ["engine.name=batched"]), ("clients", ["network.transport=inproc"])):
        outs[engine], summary = run_scenario(load_scenario(None, [*common, *extra]), tmp_path / engine, console=quiet_console())
        assert summary["honest_completed"] == 4
    finals = {e: _finals(o) for e, o in outs.items()}
    for k, final in finals["batched"].items():
        clients = finals["clients"][k]
        assert set(final["gossip"]) == set(clients["gossip"])
        records = {e: read_rounds(o, k) for e, o in outs.items()}
        if final["role"] == "honest":
            assert [sorted(r) for r in records["batched"]] == [sorted(r) for r in records["clients"]]
            assert [r["round"] for r in records["batched"]] == list(range(6))
        else:
            assert sorted(records["batched"][0]) == sorted(records["clients"][0])


@pytest.mark.parametrize("engine", ["batched", "clients"])
def test_under_a_schedule_each_step_goes_to_its_graphs_receivers(tmp_path, engine):
    from dfedrw.peer.client.asynchronous import last_labels
    from dfedrw.peer.wiring.plan import scenario_graphs

    sc = load_scenario(None, [
        *BASE, "topology.honest=5", "topology.byzantine=1", "attack.name=gaussian", "aggregation.rule=trimmed_mean",
        "topology.schedule=epidemic", "topology.schedule_params.epidemic.fanout=2",
        *(["engine.name=batched"] if engine == "batched" else ["network.transport=inproc"]),
    ])
    out, summary = run_scenario(sc, tmp_path / engine, console=quiet_console())
    topo = scenario_topology(sc)
    graphs = scenario_graphs(sc, topo)
    assert summary["honest_completed"] == 5
    for k in topo.honest():
        for r in read_rounds(out, k):
            assert r["sent_to"] == list(graphs.receivers_of(k, r["round"]))
            assert r["neighbours"] == list(graphs.senders_to(k, r["round"]))
            assert r["told_byzantine"] == sum(int(j) in topo.byzantine for j in r["staleness"])
    (b,) = topo.byzantine
    last = last_labels(graphs, b, [k for k in topo.honest()], sc.rounds)
    answered = {}
    for r in read_rounds(out, b):
        for k, label in r["answered"].items():
            answered[int(k)] = label
    # It answered each honest client's last model sent to it, and nobody else's.
    assert answered == {k: t for k, t in last.items() if t >= 0}
