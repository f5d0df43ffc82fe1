"""examples/plugins/kinds.toml in one process: the user's data set, model and topology, here
over the user's own transport kind (mylab_plugins.LossyInproc: clients as threads, each
message lost with a seeded probability); what was lost is what the receivers missed."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.wiring.plan import scenario_topology

PLUGINS = Path(__file__).resolve().parents[2] / "examples" / "plugins"
LOSSY = ['network.transport="mylab_plugins:LossyInproc"', "network.round_timeout=1.0", "rounds=6", "eval.every=0"]


@pytest.mark.parametrize("drop", [0.0, 0.3])
def test_a_users_transport_kind_places_clients_as_threads_and_loses_what_it_drops(tmp_path, monkeypatch, drop):
    monkeypatch.syspath_prepend(str(PLUGINS))
    scenario = load_scenario(PLUGINS / "kinds.toml", [*LOSSY, f'network."mylab_plugins:LossyInproc".drop={drop}'])

    _, summary = run_scenario(scenario, tmp_path, console=Console(file=io.StringIO()))

    assert summary["failed_peers"] == [] and summary["transport"] == "mylab_plugins:LossyInproc"
    assert summary["tls"] == "n/a (mylab_plugins:LossyInproc transport)"
    topology = scenario_topology(scenario)
    records = {int(k): json.loads((tmp_path / "peers" / f"{k}.json").read_text()) for k in summary["peers"]}
    dropped = sum(r["unsent_messages"]["dropped"] for r in records.values())
    missed = 0
    for k, record in records.items():
        if record["role"] != "honest":
            continue
        for line in (tmp_path / "peers" / f"{k}.jsonl").read_text().splitlines():
            missing = json.loads(line)["missing"]
            assert set(missing) <= set(topology.neighbours(k))
            missed += len(missing)
    # A model is missing from a round because the transport dropped it, or because it came
    # after the receiver's deadline (counted there as stale, or refused as of a past round).
    late = sum(r["stale_messages"] + r["rejected_by_reason"].get("stale_round", 0) for r in records.values())
    if drop == 0.0:
        assert dropped == 0 and missed <= late
    else:
        assert dropped > 0 and 0 < missed <= dropped + late
