"""Models of several MB between real client processes over gRPC and mutual TLS, each message in
many chunks decoded into place (loopback only)."""

import pytest

from dfedrw.launch.local import LocalRun
from dfedrw.peer.results.records import read_final, read_rounds
from dfedrw.peer.wiring.build import scenario_model_specs
from tests.support.runs import quiet_console


@pytest.mark.slow
def test_models_of_many_chunks_reach_every_neighbour_whole(small_scenario, tmp_path):
    # Prepare: a 1.2 M-parameter MLP (5 MB) in chunks of 64 KiB: 76 chunks a message
    scenario = small_scenario(
        "topology.kind=ring", "topology.honest=4", "topology.byzantine=0", "attack.name=none", "aggregation.rule=dfedavg",
        "train.model=mlp", "train.hidden=16384", "network.chunk_bytes=65536", "rounds=4", "eval.every=2",
        "network.round_timeout=120", "network.tls=mutual",
    )
    size = sum(s.nbytes for s in scenario_model_specs(scenario))
    assert size > 75 * 65536

    # Execute
    summary = LocalRun(scenario, tmp_path, console=quiet_console()).run()

    # Assert: every client ran every round with both neighbours' models, and nothing was refused
    assert summary["failed_peers"] == [] and summary["honest_completed"] == 4
    for k in range(4):
        final = read_final(tmp_path, k)
        assert final["completed"] and final["rejected_messages"] == 0 and final["stale_messages"] == 0
        assert final["unsent_messages"] == {"dropped": 0, "stale": 0}
        rounds = read_rounds(tmp_path, k)
        assert [r["round"] for r in rounds] == [0, 1, 2, 3]
        neighbours = {str((k - 1) % 4), str((k + 1) % 4)}
        for record in rounds:
            assert record["missing"] == [] and set(record["weights"]) == {str(k), *neighbours}
            assert all(w > 0 for w in record["weights"].values())
        assert isinstance(rounds[-1]["accuracy"], float)
