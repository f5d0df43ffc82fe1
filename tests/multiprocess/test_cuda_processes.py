"""Client processes sharing one GPU (``engine.device = "cuda"``), over gRPC with mutual TLS:
each its own CUDA context, model and data on the GPU; the in-process threads' run on the same
GPU, result for result (the same kernels on the same values)."""

import json

import pytest
import torch

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.results.records import read_rounds
from tests.support.runs import quiet_console

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")]


def test_client_processes_share_one_gpu_over_grpc_with_mutual_tls(small_scenario, tmp_path):
    overrides = (
        "topology.honest=4", "topology.byzantine=1", "attack.name=gaussian", "rounds=10", "eval.every=5", "network.round_timeout=60",
        "engine.device=cuda",
    )
    quiet = quiet_console()
    _, grpc = run_scenario(small_scenario(*overrides, "network.transport=grpc"), tmp_path / "grpc", console=quiet)
    _, threads = run_scenario(small_scenario(*overrides, "network.transport=inproc"), tmp_path / "threads", console=quiet)

    assert grpc["failed_peers"] == [] and grpc["tls"] == "mutual"
    finals = {k: json.loads((tmp_path / "grpc" / "peers" / f"{k}.json").read_text()) for k in grpc["peers"]}
    assert len({f["pid"] for f in finals.values()}) == 5
    honest = [f for f in finals.values() if f["role"] == "honest"]
    assert {f["device"] for f in honest} == {"cuda:0"} and all(f["cuda_max_allocated_mib"] > 0 for f in honest)
    for k, p in grpc["peers"].items():
        if p["role"] != "honest":
            continue
        assert abs(p["accuracy"] - threads["peers"][k]["accuracy"]) <= 1.0
        for x, y in zip(read_rounds(tmp_path / "grpc", int(k)), read_rounds(tmp_path / "threads", int(k)), strict=True):
            assert all(abs(x["weights"][s] - y["weights"][s]) <= 1e-5 for s in x["weights"]), (k, x["round"])
