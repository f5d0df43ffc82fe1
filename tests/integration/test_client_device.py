"""Clients (threads and processes) on the device ``engine.device`` names: refused in one line
where it is not, and on a GPU the CPU's run to float tolerance, with what each held there."""

from __future__ import annotations

import json

import pytest
import torch

from dfedrw.launch.preflight import preflight
from dfedrw.launch.runner import run_scenario
from dfedrw.peer.learning.device import device_memory, engine_device
from dfedrw.peer.results.records import read_rounds
from tests.support.runs import quiet_console

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
THREADS = ("engine.name=clients", "network.transport=inproc", "topology.honest=4", "topology.byzantine=1", "attack.name=gaussian")


def test_clients_on_a_gpu_this_machine_lacks_are_refused_in_one_line_before_any_starts(small_scenario):
    scenario = small_scenario(*THREADS, "engine.device=cuda:7")
    if torch.cuda.device_count() > 7:
        pytest.skip("this machine has a GPU cuda:7")
    with pytest.raises(ValueError, match=r"^engine.device='cuda:7': (this machine has no CUDA device|only \d+ CUDA device)") as refused:
        preflight(scenario)
    assert "\n" not in str(refused.value)


def test_on_the_cpu_a_client_records_no_gpu_memory_and_its_device(small_scenario, tmp_path):
    _, summary = run_scenario(small_scenario(*THREADS, "rounds=2"), tmp_path / "out", console=quiet_console())

    final = json.loads((tmp_path / "out" / "peers" / "0.json").read_text())
    assert summary["failed_peers"] == [] and final["device"] == "cpu"
    assert "cuda_max_allocated_mib" not in final and device_memory("cpu") == {}


@CUDA
def test_plain_cuda_names_the_current_gpu_once_resolved():
    assert engine_device("cuda") == torch.device("cuda", torch.cuda.current_device())
    assert engine_device("cuda", resolve=False) == torch.device("cuda")


@CUDA
def test_client_threads_on_cuda_give_the_cpu_run_and_record_their_gpu_memory(small_scenario, tmp_path):
    """Each client's model, shard and test sets on the GPU (what is sent and aggregated stays on
    the CPU): the CPU run's weights to 1e-4 over 20 rounds."""
    runs = {}
    for device in ("cpu", "cuda"):
        _, runs[device] = run_scenario(small_scenario(*THREADS, f"engine.device={device}"), tmp_path / device, console=quiet_console())
    for k, peer in runs["cpu"]["peers"].items():
        final = json.loads((tmp_path / "cuda" / "peers" / f"{k}.json").read_text())
        if peer["role"] != "honest":
            continue
        assert final["device"].startswith("cuda:") and final["cuda_max_allocated_mib"] > 0
        assert abs(peer["accuracy"] - runs["cuda"]["peers"][k]["accuracy"]) <= 2.0
        for a, b in zip(read_rounds(tmp_path / "cpu", int(k)), read_rounds(tmp_path / "cuda", int(k)), strict=True):
            assert a["weights"].keys() == b["weights"].keys()
            assert all(abs(a["weights"][s] - b["weights"][s]) <= 1e-4 for s in a["weights"]), (k, a["round"])


@CUDA
def test_a_convolutional_client_trains_on_cuda(small_scenario, tmp_path):
    """ResNet-20 with momentum: the model itself moves to the GPU, not only its data (a model
    left on the CPU fails at its first step on GPU inputs)."""
    base = (*THREADS, "train.model=resnet20", "train.momentum=0.9", "rounds=3", "eval.every=3")
    _, cpu = run_scenario(small_scenario(*base), tmp_path / "cpu", console=quiet_console())
    _, cuda = run_scenario(small_scenario(*base, "engine.device=cuda"), tmp_path / "cuda", console=quiet_console())

    assert cuda["failed_peers"] == []
    assert cuda["honest_mean_accuracy"] == pytest.approx(cpu["honest_mean_accuracy"], abs=3.0)
