"""A thousand clients in the batched engine, from the command line: the memory check counts
what its one process holds (a client-process estimate refused this run, asking 160 GB), and
the run writes every client's records."""

from __future__ import annotations

import json
import signal

import pytest

from dfedrw.experiments.cli import main as dfedrw_main
from dfedrw.peer.wiring.plan import scenario_graphs, scenario_topology

CLIENTS = 1000
ROUNDS = 3
SETS = (
    f"topology.honest={CLIENTS}", "topology.byzantine=0", "attack.name=none", "topology.rho=0.01", f"rounds={ROUNDS}",
    "data.name=digits", "train.model=softmax_regression",
)


@pytest.fixture(autouse=True)
def _signals_restored():
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in handlers.items():
        signal.signal(s, h)


def test_a_thousand_clients_on_a_sparse_graph_run_and_record_every_round(tmp_path, capsys):
    from dfedrw.peer.config.scenario import load_scenario

    # Execute
    out = tmp_path / "run"
    code = dfedrw_main(["run", "--engine", "batched", *(a for s in SETS for a in ("--set", s)), "--out", str(out)])

    # Assert
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"] == "batched" and summary["failed_peers"] == [] and not summary["interrupted"]
    assert len(summary["peers"]) == CLIENTS and all(p["completed"] and p["rounds_done"] == ROUNDS for p in summary["peers"].values())
    assert 8 < summary["mean_degree"] < 12  # rho = 0.01 of 999 others
    assert 10 < summary["honest_mean_accuracy"] <= 100
    graphs = scenario_graphs(load_scenario(out / "scenario.toml"))
    for k in (0, 499, 999):
        records = [json.loads(line) for line in (out / "peers" / f"{k}.jsonl").read_text().splitlines()]
        assert [r["round"] for r in records] == list(range(ROUNDS))
        # Each client weighed itself and its neighbours, no one else.
        assert all({int(j) for j in r["weights"]} == {k, *graphs.possible(k)} for r in records)
        assert abs(sum(records[-1]["weights"].values()) - 1) < 1e-3 and "accuracy" in records[-1]
    assert scenario_topology(load_scenario(out / "scenario.toml")).num_clients == CLIENTS
