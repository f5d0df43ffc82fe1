"""Every example scenario runs as it is written (its data set, transport, topology, attack and
rules), for a few rounds only: each client completes them, and the honest ones report
accuracies that the summary's means are made of."""

from pathlib import Path

import pytest

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.learning.data import DatasetUnavailable
from dfedrw.peer.learning.datasets import check_dataset
from dfedrw.peer.results.records import read_rounds
from tests.support.runs import quiet_console

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))
ROUNDS = 2


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_briefly(path, tmp_path):
    # Prepare: the example as written, but for the number of rounds
    scenario = load_scenario(path, [f"rounds={ROUNDS}"])
    try:
        check_dataset(scenario.data.name, scenario.data.dir)
    except DatasetUnavailable as exc:
        pytest.skip(f"{path.name} needs {scenario.data.name}, not on this machine: {exc}")
    honest, byzantine = scenario.topology.honest, scenario.topology.byzantine

    # Execute
    out, summary = run_scenario(scenario, tmp_path / "run", console=quiet_console())

    # Assert: every client of the example ran every round on the example's transport
    assert summary["transport"] == scenario.network.transport
    assert summary["rounds"] == ROUNDS and not summary["interrupted"]
    assert summary["failed_peers"] == [] and summary["honest_completed"] == honest
    peers = summary["peers"]
    assert len(peers) == honest + byzantine
    roles = [p["role"] for p in peers.values()]
    assert roles.count("honest") == honest and roles.count("byzantine") == byzantine
    accuracies = []
    for k, peer in peers.items():
        assert peer["completed"] and peer["rounds_done"] == ROUNDS, (k, peer)
        if peer["role"] == "honest":
            assert [r["round"] for r in read_rounds(out, int(k))] == list(range(ROUNDS))
            assert 0.0 <= peer["accuracy"] <= 100.0 and 0.0 <= peer["global_accuracy"] <= 100.0, (k, peer)
            accuracies.append(peer["accuracy"])
    assert summary["honest_mean_accuracy"] == pytest.approx(sum(accuracies) / honest)
    assert (summary["byzantine_weight_share"] is None) == (byzantine == 0)
