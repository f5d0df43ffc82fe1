"""examples/plugins/kinds.toml as real client processes: a data set, a model and a topology of
one's own (mylab_plugins.Blobs, TwoLayer, small_world), named by import path, reach every
client process through PYTHONPATH; the records show each was the one used. `dfedrw list`
describes them with --plugin."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.support.runs import run_job

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "examples" / "plugins"
SCENARIO = PLUGINS / "kinds.toml"
ROUNDS = 20
TIMEOUT = 300


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(PLUGINS)]), "OMP_NUM_THREADS": "1"}


def _run(cmd: list[str]) -> tuple[int, str]:
    return run_job(cmd, cwd=ROOT, timeout=TIMEOUT, env=_env())


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    import mylab_plugins

    return mylab_plugins


def test_a_users_data_set_model_and_topology_run_as_processes(tmp_path, plugins):
    from dfedrw.peer.config.scenario import load_scenario
    from dfedrw.peer.learning.data import partition
    from dfedrw.peer.wiring.plan import scenario_topology
    from dfedrw.peer.transport.serde import model_specs

    out = tmp_path / "run"
    started = time.monotonic()
    rc, output = _run([sys.executable, "-m", "dfedrw.launch.cli", "run", str(SCENARIO), "--set", f"rounds={ROUNDS}", "--out", str(out)])
    assert rc == 0, output[-3000:]
    print(f"dfedrw run: 10 client processes, {ROUNDS} rounds in {time.monotonic() - started:.1f} s")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_peers"] == [] and summary["tls"] == "mutual", output[-3000:]
    pids = {p["pid"] for p in summary["peers"].values()}
    assert len(pids) == 10 and os.getpid() not in pids  # one process per client

    # What the clients must have used, computed here from the plugin module itself.
    scenario = load_scenario(SCENARIO, [f"rounds={ROUNDS}"])
    blobs = plugins.Blobs(features=16, classes=4, spread=1.5)
    (train_x, train_y), _ = blobs.load()
    topology = scenario_topology(scenario)
    graph = plugins.small_world(10, scenario.seed, neighbours=4, rewire=0.2)
    assert sorted(map(sorted, topology.graph.edges)) == sorted(map(sorted, graph.edges))
    honest = sorted(topology.honest())
    shards = partition(train_y.numpy(), len(honest), "dirichlet:1.0", scenario.seed)
    message = sum(s.nbytes for s in model_specs(plugins.TwoLayer(16, 4, width=24)))
    assert message != sum(s.nbytes for s in model_specs(plugins.TwoLayer(16, 4, width=32)))

    for k in honest:
        record = json.loads((out / "peers" / f"{k}.json").read_text())
        rounds = [json.loads(line) for line in (out / "peers" / f"{k}.jsonl").read_text().splitlines()]
        assert record["completed"] and len(rounds) == ROUNDS
        neighbours = {str(j) for j in topology.neighbours(k)}
        for r in rounds:
            # Each round weighs exactly this client and its small-world neighbours.
            assert set(r["weights"]) == neighbours | {str(k)}, (k, r["round"], r["weights"])
            # Every message carries the TwoLayer(width=24) model (plus a small header).
            sent = r["bytes_sent"] / len(neighbours)
            assert message <= sent <= message + 512, (k, r["round"], sent, message)
        assert record["num_samples"] in {len(s) for s in shards}
    assert sorted(json.loads((out / "peers" / f"{k}.json").read_text())["num_samples"] for k in honest) == sorted(len(s) for s in shards)
    assert summary["honest_mean_accuracy"] > 50.0  # four blobs: chance is 25 %


@pytest.mark.parametrize(
    "kind, plugin, shown",
    [
        ("datasets", "mylab_plugins:Blobs", ["spread: float = 1.0", "Gaussian blobs"]),
        ("models", "mylab_plugins:TwoLayer", ["width: int = 32", "in_features, num_classes"]),
        ("topologies", "mylab_plugins:small_world", ["neighbours: int = 4", "num_clients, seed"]),
        ("transports", "mylab_plugins:LossyInproc", ["drop: float = 0.1"]),
    ],
)
def test_dfedrw_list_describes_a_users_class_of_each_kind(kind, plugin, shown):
    rc, output = _run([sys.executable, "-m", "dfedrw.launch.cli", "list", kind, "--plugin", plugin])
    assert rc == 0, output
    assert plugin in output and all(text in output for text in shown), output
