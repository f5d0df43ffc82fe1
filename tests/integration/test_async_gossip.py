"""Asynchronous gossip on client threads: no round barrier, each client's every step recorded
with how stale each candidate was, a straggler that slows nobody down, Byzantine clients that
answer what they receive; and processes over mutual TLS (slow)."""

from __future__ import annotations

import json

import pytest

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.results.records import read_rounds
from dfedrw.peer.wiring.plan import scenario_topology
from tests.support.runs import quiet_console

BASE = (
    "data.name=digits", "topology.honest=5", "rounds=16", "eval.every=8", "network.protocol=async", "network.transport=inproc",
)


def _finals(out):
    return {int(p.stem): json.loads(p.read_text()) for p in (out / "peers").glob("*.json")}


def test_every_step_is_recorded_with_the_candidates_it_held_and_how_stale_they_were(tmp_path):
    sc = load_scenario(None, [*BASE, "topology.byzantine=0", "attack.name=none", "peers.0.speed=0.25"])
    out, summary = run_scenario(sc, tmp_path / "run", console=quiet_console())
    topo = scenario_topology(sc)
    finals = _finals(out)
    assert summary["honest_completed"] == 5 and all(not f["rejected_by_reason"] for f in finals.values())
    for k, final in finals.items():
        records = read_rounds(out, k)
        assert [r["round"] for r in records] == list(range(16))
        neighbours = set(topo.neighbours(k))
        for r in records:
            held = {int(j) for j in r["staleness"]}
            # Each neighbour is a candidate (with its staleness) or missing, never both; the
            # rule weighed exactly the candidates held.
            assert held | set(r["missing"]) == neighbours and not held & set(r["missing"])
            assert {int(j) for j in r["weights"]} == held | {k}
            assert all(s >= 0 for s in r["staleness"].values())
        assert final["gossip"]["protocol"] == "async" and final["gossip"]["steps_per_second"] > 0
        assert records[-1]["seconds"] > 0 and "accuracy" in records[7] and "accuracy" in records[-1]
    assert summary["honest_mean_accuracy"] > 20.0


def test_byzantine_clients_answer_each_model_they_receive_and_receivers_take_their_messages(tmp_path):
    sc = load_scenario(None, [*BASE, "topology.byzantine=1", "attack.name=gaussian", "aggregation.rule=trimmed_mean"])
    out, summary = run_scenario(sc, tmp_path / "run", console=quiet_console())
    topo = scenario_topology(sc)
    (b,) = topo.byzantine
    finals = _finals(out)
    assert summary["honest_completed"] == 5 and finals[b]["completed"]
    records = read_rounds(out, b)
    assert finals[b]["gossip"]["crafts"] == len(records) > 0
    honest_neighbours = {k for k in topo.neighbours(b)}
    answered = {int(k) for r in records for k in r["answered"]}
    assert answered == honest_neighbours
    # Each neighbour answered at most once per model of it the attacker held, labelled as that
    # model (a step's label, rising); the record's round is the newest it answered.
    for k in honest_neighbours:
        labels = [r["answered"][str(k)] for r in records if str(k) in r["answered"]]
        assert labels == sorted(set(labels)) and labels[-1] == 15
    assert all(r["round"] == max(r["answered"].values()) for r in records)
    # Its messages reached the receivers as candidates (nothing of it refused).
    for k in honest_neighbours:
        assert not finals[k]["rejected_by_reason"]
        assert any(str(b) in r["staleness"] for r in read_rounds(out, k))


def test_the_batched_engine_needs_compute_time_for_asynchronous_gossip(tmp_path):
    sc = load_scenario(None, [*BASE, "topology.byzantine=0", "attack.name=none", "engine.name=batched"])
    with pytest.raises(ValueError, match="set clock.step_seconds"):
        run_scenario(sc, tmp_path / "run", console=quiet_console())


@pytest.mark.slow
def test_processes_over_mutual_tls_gossip_asynchronously(tmp_path):
    # 600 steps: far past a sender's burst of messages (16), with a straggler and an attacker.
    sc = load_scenario(None, [
        "data.name=digits", "topology.honest=4", "topology.byzantine=1", "attack.name=gaussian", "rounds=600", "eval.every=600",
        "network.protocol=async", "network.transport=grpc", "network.tls=mutual", "peers.1.speed=0.5", "aggregation.rule=trimmed_mean",
    ])
    out, summary = run_scenario(sc, tmp_path / "run", console=quiet_console())
    finals = _finals(out)
    assert summary["honest_completed"] == 4 and all(f["tls"] == "mutual" for f in finals.values())
    assert summary["warnings"] == [] and summary["honest_mean_accuracy"] > 60.0
    for k, final in finals.items():
        # Nobody was rate limited or shut out: every model an honest sender sends is news.
        assert "rate_limited" not in final["refused_calls_by_reason"] and "disconnected" not in final["refused_calls_by_reason"]
        if final["role"] == "honest":
            records = read_rounds(out, k)
            assert len(records) == 600 and final["gossip"]["protocol"] == "async"
            assert not final["rejected_by_reason"]
            # Its neighbours' models were fresh: a held candidate's median staleness is a step or
            # two (the mean is not: a neighbour that finished first stays a candidate, ever older).
            held = sorted(s for r in records for s in r["staleness"].values())
            assert held[len(held) // 2] <= 2


@pytest.mark.slow
def test_torchrun_ranks_gossip_asynchronously_with_compressed_models(tmp_path):
    import os
    import sys
    from pathlib import Path

    from dfedrw.peer.config.scenario import dump_scenario
    from tests.support.runs import run_job

    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip(f"torchrun not found next to {sys.executable}")
    scenario_file = tmp_path / "scenario.toml"
    dump_scenario(load_scenario(None, [
        "data.name=digits", "topology.honest=3", "topology.byzantine=1", "attack.name=gaussian", "rounds=8", "eval.every=8",
        "network.protocol=async", "network.compression=int8", "aggregation.rule=trimmed_mean",
    ]), scenario_file)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "4", "-m", "dfedrw.launch.torchrun", "--scenario", str(scenario_file), "--out", str(tmp_path / "out")]
    rc, output = run_job(cmd, cwd=Path(__file__).resolve().parents[2], env=env, timeout=300)
    assert rc == 0, output[-4000:]
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["launcher"] == "torchrun" and summary["failed_peers"] == []
    for k, final in _finals(out).items():
        assert final["gossip"]["protocol"] == "async" and not final["rejected_by_reason"]
        if final["role"] == "honest":
            assert len(read_rounds(out, k)) == 8 and final["compression"]["name"] == "int8"
