"""The flooding attack against the intake, in both engines: every stale copy is dropped (by the
receiver, or by the sender's own queue once the receiver's round is known), every far-future
copy refused as ``future_round``, and none is aggregated."""

from __future__ import annotations

import json

import pytest

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.wiring.plan import scenario_topology
from dfedrw.peer.results.records import read_rounds
from tests.support.runs import quiet_console

ROUNDS = 10
SETTINGS = [
    "data.name=digits", "topology.honest=4", "topology.byzantine=1", f"rounds={ROUNDS}", "eval.every=0", "train.lr=0.1",
    "attack.name=flood", "attack.flood.kind=both", "attack.flood.copies=1", "network.round_timeout=30",
]


@pytest.mark.parametrize("engine", [("engine.name=batched",), ("engine.name=clients", "network.transport=inproc")], ids=["batched", "threads"])
def test_flooded_copies_are_dropped_or_refused_never_used(engine, tmp_path):
    scenario = load_scenario(None, [*SETTINGS, *engine])
    _, summary = run_scenario(scenario, tmp_path, console=quiet_console())
    topology = scenario_topology(scenario)
    (b,) = topology.byzantine
    receivers = [k for k in topology.neighbours(b) if k not in topology.byzantine]
    finals = {int(k): json.loads((tmp_path / "peers" / f"{k}.json").read_text()) for k in summary["peers"]}

    # One future copy a round to each receiver, refused every time; ROUNDS - 1 stale ones (none
    # in round 0), each dropped by the receiver or, once it knew the receiver's round, by the
    # sender's own queue. The copies go before the round's own message, so a receiver is still
    # running (it waits for that message) when they arrive, in either engine.
    refused = [finals[k]["rejected_by_reason"].get("future_round") for k in receivers]
    assert refused == [ROUNDS] * len(receivers)
    dropped_by_receivers = sum(finals[k]["stale_messages"] for k in receivers)
    assert dropped_by_receivers + finals[b]["unsent_messages"]["stale"] == (ROUNDS - 1) * len(receivers)
    assert all(r["attack"] == {"stale": int(r["round"] >= 1), "future": 1} for r in read_rounds(tmp_path, b))
    # The round's own copy is the one aggregated: the attacker is weighed every round.
    assert all(str(b) in r["weights"] for k in receivers for r in read_rounds(tmp_path, k))
    assert summary["failed_peers"] == []
