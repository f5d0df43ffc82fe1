"""Compression on client threads: every model goes out encoded, every receiver rebuilds and
takes it (nothing refused), each link carries what the encoding says, and the run learns."""

from __future__ import annotations

import json
import math

import pytest

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.results.records import read_rounds
from tests.support.runs import quiet_console

BASE = (
    "data.name=digits", "topology.honest=5", "topology.byzantine=0", "attack.name=none", "rounds=12", "eval.every=12",
    "network.transport=inproc", "aggregation.rule=dfedavg", "network.max_missed_rounds=1000",
)


def _finals(out):
    return {int(p.stem): json.loads(p.read_text()) for p in (out / "peers").glob("*.json")}


@pytest.mark.parametrize("compression, settings", [("int8", ()), ("topk", ("network.compression_params.topk.refresh=5",))])
def test_compressed_models_are_taken_and_each_link_counts_its_bytes(tmp_path, compression, settings):
    raw_out, raw = run_scenario(load_scenario(None, list(BASE)), tmp_path / "raw", console=quiet_console())
    sc = load_scenario(None, [*BASE, f"network.compression={compression}", *settings])
    out, summary = run_scenario(sc, tmp_path / compression, console=quiet_console())

    finals, raw_finals = _finals(out), _finals(raw_out)
    assert summary["honest_completed"] == 5
    # Every model was rebuilt and taken: no refusal of any kind, nobody missed.
    assert all(not f["rejected_by_reason"] for f in finals.values())
    assert sum(len(r["missing"]) for k in finals for r in read_rounds(out, k)) == 0
    for k, f in finals.items():
        links = f["bytes_to"]
        # Every round's model to every neighbour, at the encoding's size (headers aside).
        raw_bytes = sum(r["bytes_sent"] for r in read_rounds(raw_out, k))
        sent = sum(r["bytes_sent"] for r in read_rounds(out, k))
        assert sum(links.values()) == sent
        assert sent < (0.45 if compression == "int8" else 0.75) * raw_bytes
        if compression == "topk":
            # A whole model on each link first and every 5 messages after: rounds 0, 5, 10.
            assert set(f["compression"]["dense_to"].values()) == {math.ceil(12 / 5)}
        assert f["compression"]["name"] == compression
        assert sum(raw_finals[k]["bytes_to"].values()) == raw_bytes  # counted without compression too
    assert summary["honest_mean_accuracy"] > 0.8 * raw["honest_mean_accuracy"]
    # What it cost, in the summary and, round by round, in the run's record.
    assert summary["honest_mean_bytes_sent"] == pytest.approx(
        sum(sum(r["bytes_sent"] for r in read_rounds(out, k)) for k in finals) / len(finals)
    )
    assert summary["honest_mean_bytes_sent"] < raw["honest_mean_bytes_sent"] and summary["honest_mean_seconds"] > 0
    curves = json.loads((out / "record.json").read_text())["curves"]
    assert [r for r, _ in curves["seconds"]] == [r for r, _ in curves["accuracy"]] == [11]


@pytest.mark.parametrize("compression", ["int8", "topk"])
def test_the_batched_engine_compresses_as_clients_do(tmp_path, compression):
    # Both engines with the compression and a clock (so the batched one counts bytes): the same
    # bytes on the wire to a few header bytes a message, and about the same accuracy (the two
    # engines' local steps differ in float rounding, which the rounding draws then follow).
    sets = [*BASE, f"network.compression={compression}", "links.latency=0.001"]
    out, clients = run_scenario(load_scenario(None, [*sets, "engine.name=clients"]), tmp_path / "clients", console=quiet_console())
    sim_out, batched = run_scenario(load_scenario(None, [*sets, "engine.name=batched"]), tmp_path / "batched", console=quiet_console())

    assert batched["honest_completed"] == 5
    assert batched["honest_mean_bytes_sent"] == pytest.approx(clients["honest_mean_bytes_sent"], rel=0.01)
    assert abs(batched["honest_mean_accuracy"] - clients["honest_mean_accuracy"]) < 2.0
    assert all(r["missing"] == [] for k in range(5) for r in read_rounds(sim_out, k))
