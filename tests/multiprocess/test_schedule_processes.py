"""A graph re-drawn every round, run as gRPC client processes (``dfedrw run``, mutual TLS) with
Byzantine clients sending Gaussian models and DFedReweighting at the honest ones: every
client aggregates exactly that round's neighbours, computed here from the schedule's own
drawing function, and connects to its peers on demand."""

from __future__ import annotations

import json

import pytest

from dfedrw.launch.local import LocalRun
from dfedrw.peer.config import load_scenario
from dfedrw.peer.results import read_rounds
from dfedrw.topologies import place_byzantine
from dfedrw.topologies.schedules import random_regular_connected, round_seed
from tests.helpers import quiet_console

pytestmark = pytest.mark.slow

HONEST, BYZANTINE, DEGREE, ROUNDS, SEED = 4, 2, 3, 8, 43


def round_neighbours(r: int) -> dict[int, set[int]]:
    """Round ``r``'s graph as the redraw schedule draws it: a connected 3-regular graph with a
    connected honest subgraph, from (seed, round) alone."""
    n = HONEST + BYZANTINE
    graph = random_regular_connected(n, DEGREE, place_byzantine(n, BYZANTINE, SEED), round_seed(SEED, "redraw-random_regular", r))
    return {k: set(graph.neighbors(k)) for k in range(n)}


def test_a_graph_redrawn_every_round_over_grpc_processes(tmp_path):
    # Prepare
    scenario = load_scenario(
        None,
        [
            "data.name=digits", f"topology.honest={HONEST}", f"topology.byzantine={BYZANTINE}", f"rounds={ROUNDS}", "eval.every=0",
            f"seed={SEED}", "train.lr=0.1", "network.round_timeout=60", "attack.name=gaussian", "aggregation.rule=dfedreweighting",
            "topology.schedule=redraw", f"topology.schedule_params.redraw.degree={DEGREE}", "topology.schedule_params.redraw.every=1",
        ],
    )
    graphs = [round_neighbours(r) for r in range(ROUNDS)]
    assert len({tuple(sorted((k, tuple(sorted(v))) for k, v in g.items())) for g in graphs}) > 1, "the graph should change"

    # Execute
    summary = LocalRun(scenario, tmp_path, console=quiet_console()).run()

    # Assert: processes over mutual TLS, nobody failed
    assert summary["failed_peers"] == [] and summary["tls"] == "mutual" and summary["schedule"] == "redraw"
    assert summary["mean_degree"] == DEGREE
    roles = {int(k): p["role"] for k, p in summary["peers"].items()}
    byzantine = {k for k, role in roles.items() if role == "byzantine"}
    assert byzantine == set(place_byzantine(HONEST + BYZANTINE, BYZANTINE, SEED))
    assert len({p["pid"] for p in summary["peers"].values()}) == HONEST + BYZANTINE

    for k in (k for k, role in roles.items() if role == "honest"):
        records = read_rounds(tmp_path, k)
        assert [rec["round"] for rec in records] == list(range(ROUNDS))
        for rec in records:
            r, neighbours = rec["round"], graphs[rec["round"]][k]
            # Each client aggregated its own model and exactly that round's neighbours.
            assert sorted(map(int, rec["weights"])) == sorted({k, *neighbours}), f"client {k}, round {r}"
            assert rec["missing"] == [] and rec["neighbours"] == sorted(neighbours)
            assert rec["told_byzantine"] == len(neighbours & byzantine)
        final = json.loads((tmp_path / "peers" / f"{k}.json").read_text())
        # Nothing it received came from a client that was not its neighbour in the message's round.
        assert final["rejected_by_reason"].get("not_neighbour", 0) == 0 and final["tls"] == "mutual"
        met = set().union(*(graphs[r][k] for r in range(ROUNDS)))
        assert 1 <= final["channels"]["opened"] <= len(met)

    # The Byzantine clients heard from their honest neighbours of each round, and their Gaussian
    # models reached the honest clients they were scheduled to reach (scored, weighted).
    for b in byzantine:
        for rec in read_rounds(tmp_path, b):
            assert set(rec["received_from"]) == graphs[rec["round"]][b] - byzantine
    reached = {(int(s), rec["round"]) for k in roles if k not in byzantine for rec in read_rounds(tmp_path, k) for s in rec["weights"] if int(s) in byzantine}
    assert reached == {(b, r) for r in range(ROUNDS) for b in byzantine for k in graphs[r][b] - byzantine}
