"""What a client process builds once: the scenario is checked once per run (a client started by
a launcher reads the file the launcher validated without checking it again), and a client
draws its graph and builds its model once, for its transport and for itself."""

from __future__ import annotations

import collections

import pytest

from dfedrw.peer.learning import models
from dfedrw.peer.graph import topology as topology_module
from dfedrw.peer.cli import client_scenario
from dfedrw.peer.config.scenario import SCENARIO_DIGEST_ENV, Scenario, ScenarioError, dump_scenario, load_scenario, load_validated
from dfedrw.peer.client.process import grpc_client
from dfedrw.peer.wiring.plan import scenario_topology

SMALL = ["rounds=3", "topology.honest=4", "topology.byzantine=1", "network.tls=off"]


@pytest.fixture
def calls(monkeypatch):
    """How many times the scenario was checked, a graph drawn and a model built."""
    seen: collections.Counter = collections.Counter()

    def counting(name, f):
        def wrapper(*args, **kwargs):
            seen[name] += 1
            return f(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(Scenario, "validate", counting("validate", Scenario.validate))
    monkeypatch.setattr(topology_module, "build_topology", counting("topology", topology_module.build_topology))
    monkeypatch.setattr(models, "make_model", counting("model", models.make_model))
    return seen


def test_a_scenario_is_checked_when_loaded_and_not_when_read_back_as_validated(calls, tmp_path):
    scenario = load_scenario(None, SMALL)
    assert calls["validate"] == 1
    digest = dump_scenario(scenario, tmp_path / "scenario.toml")
    calls.clear()
    again = load_validated(tmp_path / "scenario.toml", digest)
    assert calls["validate"] == 0 and calls["model"] == 0
    assert again == scenario


def test_a_file_that_is_not_the_one_validated_is_refused(tmp_path):
    path = tmp_path / "scenario.toml"
    digest = dump_scenario(load_scenario(None, SMALL), path)
    path.write_text(path.read_text().replace("rounds = 3", "rounds = 4"))
    with pytest.raises(ScenarioError, match="not the scenario its launcher validated"):
        load_validated(path, digest)


def test_a_client_process_checks_its_scenario_only_without_its_launchers_digest(calls, tmp_path, monkeypatch):
    path = tmp_path / "scenario.toml"
    digest = dump_scenario(load_scenario(None, SMALL), path)
    calls.clear()
    monkeypatch.setenv(SCENARIO_DIGEST_ENV, digest)
    client_scenario(str(path), [])
    assert calls["validate"] == 0
    client_scenario(str(path), ["rounds=5"])  # overridden: no longer what was validated
    assert calls["validate"] == 1
    monkeypatch.delenv(SCENARIO_DIGEST_ENV)
    client_scenario(str(path), [])
    assert calls["validate"] == 2


@pytest.mark.parametrize("role", ["honest", "byzantine"])
def test_a_client_draws_its_graph_and_builds_its_model_once(calls, tmp_path, role):
    scenario = load_scenario(None, SMALL)
    topology = scenario_topology(scenario)
    client_id = min(topology.byzantine) if role == "byzantine" else min(set(range(topology.num_clients)) - set(topology.byzantine))
    calls.clear()
    client, _ = grpc_client(scenario, client_id, tmp_path, addresses={})
    try:
        client.prepare()
        assert client.role == role
        # Its transport's message bound and the client share one graph and one model (a
        # Byzantine client's on the meta device, for its layout).
        assert (calls["topology"], calls["model"]) == (1, 1)
    finally:
        client.close()
