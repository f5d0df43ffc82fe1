"""The same scenario and seed give the same per-client results in-process and over gRPC
processes.

Both transports carry identical bytes through identical validation, every client runs torch
single-threaded, candidates are aggregated in sender-id order, and every random draw comes from
a per-client seeded generator, so nothing depends on timing as long as no deadline is missed
(the timeout here is far above a round's duration). The results are therefore expected to be
bit-identical; the comparison allows 1e-9 only because weights are logged rounded.
"""


import pytest


from dfedrw.launch.runner import run_scenario
from dfedrw.peer.results.records import read_rounds
from tests.support.runs import quiet_console


@pytest.mark.slow
def test_inproc_and_grpc_processes_agree(small_scenario, tmp_path):
    overrides = ("topology.honest=5", "topology.byzantine=1", "attack.name=gaussian", "rounds=30", "eval.every=10", "network.round_timeout=30")
    quiet = quiet_console()
    _, a = run_scenario(small_scenario(*overrides, "network.transport=inproc"), tmp_path / "inproc", console=quiet)
    _, b = run_scenario(small_scenario(*overrides, "network.transport=grpc"), tmp_path / "grpc", console=quiet)
    assert a["failed_peers"] == b["failed_peers"] == []
    for k, pa in a["peers"].items():
        pb = b["peers"][k]
        assert pa["accuracy"] == pb["accuracy"] and pa["global_accuracy"] == pb["global_accuracy"]
        ra, rb = read_rounds(tmp_path / "inproc", int(k)), read_rounds(tmp_path / "grpc", int(k))
        assert len(ra) == len(rb) == 30
        for x, y in zip(ra, rb):
            assert x["train_loss"] == y["train_loss"]
            assert x["weights"].keys() == y["weights"].keys()
            assert all(abs(x["weights"][s] - y["weights"][s]) <= 1e-9 for s in x["weights"])
    assert a["honest_mean_accuracy"] == b["honest_mean_accuracy"]
    assert a["byzantine_weight_share"] == b["byzantine_weight_share"]
