"""Emulated links on client threads: a lossy link loses messages that the receivers' records
name as missing, and the run completes."""

from __future__ import annotations

import json

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.results.records import read_rounds
from tests.support.runs import quiet_console

BASE = (
    "data.name=digits", "topology.honest=5", "topology.byzantine=0", "attack.name=none", "rounds=8", "eval.every=8",
    "network.transport=inproc", "aggregation.rule=dfedavg",
)


def _finals(out):
    return {int(p.stem): json.loads(p.read_text()) for p in (out / "peers").glob("*.json")}


def test_lost_messages_are_missed_by_their_receivers_and_the_run_completes(tmp_path):
    # No neighbour is ever given up on, so every lost model is one its receiver waited for
    # until the deadline and names as missing (a model late on a busy machine is missing too).
    sc = load_scenario(None, [*BASE, "links.loss=0.3", "network.round_timeout=0.5", "network.max_missed_rounds=1000"])
    out, summary = run_scenario(sc, tmp_path / "lossy", console=quiet_console())

    finals = _finals(out)
    lost = sum(f["links"]["lost"] for f in finals.values())
    missed = sum(len(r["missing"]) for k in finals for r in read_rounds(out, k))
    assert summary["honest_completed"] == 5
    assert lost > 0 and missed >= lost
    assert all(f["links"]["delayed"] == 0 for f in finals.values())  # no latency: nothing held back

