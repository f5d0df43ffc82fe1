"""The batched engine's layouts for models without a layer plan (engine.layout): the same
results in each, the one it used in its records, and on a GPU a measured pick."""

from __future__ import annotations

import json

import pytest
import torch

from dfedrw.engines import layout as engine_layout
from dfedrw.engines.together import run_together
from dfedrw.engines.run import BatchedRun
from dfedrw.peer.results.records import read_rounds

# ResNet-20 on digits (8x8 images): a convolutional model small enough for a unit test.
CONV = ("topology.honest=4", "topology.byzantine=1", "attack.name=gaussian", "engine.name=batched", "train.model=resnet20", "rounds=3", "eval.every=3")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


def run(small_scenario, out, *overrides):
    summary = run_together([BatchedRun(small_scenario(*CONV, *overrides), out)])[0]
    return summary, [json.loads((out / "peers" / f"{k}.json").read_text()) for k in range(5)]


def close_rounds(a, b, k, tolerance):
    for x, y in zip(read_rounds(a, k), read_rounds(b, k), strict=True):
        assert x["weights"].keys() == y["weights"].keys()
        assert all(abs(x["weights"][s] - y["weights"][s]) <= tolerance for s in x["weights"]), (k, x["round"])
        assert (x["train_loss"] is None) == (y["train_loss"] is None)  # a Byzantine client trains nothing
        if x["train_loss"] is not None:
            assert x["train_loss"] == pytest.approx(y["train_loss"], rel=1e-4, abs=1e-5)


def test_the_loop_and_vmap_layouts_give_the_same_run_and_say_which_they_were(small_scenario, tmp_path):
    loop, loop_peers = run(small_scenario, tmp_path / "loop", "engine.layout=loop")
    vmap, vmap_peers = run(small_scenario, tmp_path / "vmap", "engine.layout=vmap")

    assert (loop["layout"], loop["layout_choice"]) == ("loop", "engine.layout")
    assert (vmap["layout"], vmap["layout_choice"]) == ("vmap", "engine.layout")
    assert {p["layout"] for p in loop_peers} == {"loop"} and {p["layout"] for p in vmap_peers} == {"vmap"}
    # Grouped convolutions sum in another order: the same run to float tolerance.
    for k in range(5):
        close_rounds(tmp_path / "loop", tmp_path / "vmap", k, 1e-5)
    assert loop["honest_mean_accuracy"] == pytest.approx(vmap["honest_mean_accuracy"], abs=1.0)


def test_auto_takes_the_loop_on_the_cpu_without_timing_and_a_layer_plan_needs_no_layout(small_scenario, tmp_path):
    auto, _ = run(small_scenario, tmp_path / "auto")
    plain, _ = run(small_scenario, tmp_path / "plain", "train.model=softmax_regression")

    assert auto["layout"] == "loop" and auto["layout_choice"] == "cpu rule" and "layout_seconds" not in auto
    assert (plain["layout"], plain["layout_choice"]) == ("products", "layer plan")


def test_a_measured_pick_times_both_keeps_the_faster_and_changes_nothing_of_the_run(small_scenario, tmp_path, monkeypatch):
    """Timed here on the CPU (the rule that spares the CPU the timing set aside): the pick is
    the layout of least seconds, and the rounds are those of a run in that layout set by hand
    (the measurement draws no minibatch and moves no model)."""
    monkeypatch.setattr(engine_layout, "CPU_RULE", None)
    timed = {"loop": 2.0, "vmap": 1.0}
    real = engine_layout.measure
    seen = []

    def measure(run_, layout, repeats=engine_layout.REPEATS):
        seen.append((layout, real(run_, layout, repeats=1)))  # it runs, on this run's data
        return timed[layout]

    monkeypatch.setattr(engine_layout, "measure", measure)
    auto, peers = run(small_scenario, tmp_path / "auto")
    by_hand, _ = run(small_scenario, tmp_path / "vmap", "engine.layout=vmap")

    assert [layout for layout, _ in seen] == ["loop", "vmap"] and all(seconds > 0 for _, seconds in seen)
    assert (auto["layout"], auto["layout_choice"], auto["layout_seconds"]) == ("vmap", "measured", timed)
    assert {p["layout"] for p in peers} == {"vmap"}
    for k in range(5):
        assert read_rounds(tmp_path / "auto", k) == read_rounds(tmp_path / "vmap", k)


def test_measuring_a_layout_leaves_the_models_and_the_minibatch_order_as_they_were(small_scenario, tmp_path):
    batched = BatchedRun(small_scenario(*CONV), tmp_path)
    models, positions = batched.models.clone(), [b._pos for b in batched.batches]

    seconds = engine_layout.measure(batched, "vmap", repeats=1)

    assert seconds > 0 and batched.model.layout == "loop"
    assert {e.model.layout for e in batched.aux.values()} == {"loop"}
    assert torch.equal(batched.models, models) and [b._pos for b in batched.batches] == positions


@CUDA
def test_on_cuda_auto_measures_both_layouts_and_its_run_is_the_cpus(small_scenario, tmp_path):
    """On a GPU the pick is timed; whichever it keeps, the weights are the CPU run's to 1e-3
    (cuDNN's convolutions sum in other orders than the CPU's)."""
    cpu, _ = run(small_scenario, tmp_path / "cpu")
    cuda, peers = run(small_scenario, tmp_path / "cuda", "engine.device=cuda")

    assert cuda["device"].startswith("cuda:") and cuda["layout_choice"] == "measured"
    assert set(cuda["layout_seconds"]) == {"loop", "vmap"} and cuda["layout"] == min(cuda["layout_seconds"], key=cuda["layout_seconds"].get)
    assert {p["layout"] for p in peers} == {cuda["layout"]} and cuda["cuda_max_allocated_mib"] > 0
    for k in range(5):
        close_rounds(tmp_path / "cpu", tmp_path / "cuda", k, 1e-3)


@CUDA
@pytest.mark.parametrize("layout", ["loop", "vmap"])
def test_on_cuda_each_layout_gives_the_cpus_run(small_scenario, tmp_path, layout):
    run(small_scenario, tmp_path / "cpu", f"engine.layout={layout}")
    cuda, _ = run(small_scenario, tmp_path / "cuda", "engine.device=cuda", f"engine.layout={layout}")

    assert cuda["layout"] == layout
    for k in range(5):
        close_rounds(tmp_path / "cpu", tmp_path / "cuda", k, 1e-3)
