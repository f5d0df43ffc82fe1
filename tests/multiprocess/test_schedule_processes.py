"""A graph re-drawn every round, run as gRPC client processes (``dfedrw run``, mutual TLS) with
Byzantine clients sending Gaussian models and DFedReweighting at the honest ones: every
client aggregates exactly that round's neighbours, computed here from the schedule's own
drawing function, and connects to its peers on demand."""

from __future__ import annotations

import json
import signal

import pytest

from dfedrw.launch.local import LocalRun
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.results.records import read_rounds
from dfedrw.topologies import place_byzantine
from dfedrw.topologies.schedules import random_regular_connected, round_seed
from tests.support.runs import quiet_console

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


def test_a_client_killed_under_a_schedule_resumes_and_aggregates_its_round_neighbours_again(tmp_path):
    """Checkpoint and rejoin under a graph re-drawn every round: the restarted client asks the
    peers it sends to in its checkpoint round where they are, catches up, and from then on
    aggregates each round's neighbours again."""
    from tests.multiprocess.test_resume import Clients, N, _last_round

    from dfedrw.peer.config.scenario import dump_scenario
    from dfedrw.peer.transport.identity import make_certificates
    from dfedrw.peer.wiring.plan import scenario_graphs
    from dfedrw.peer.results.records import read_final

    # Prepare: 5 clients, a connected 2-regular graph (a cycle) drawn anew every round; as
    # many rounds as tests/multiprocess/test_resume.py runs, so that the others are still
    # running when the killed client is back (they go on at full speed without it)
    victim, kill_at = 2, 60
    scenario = load_scenario(
        None,
        [
            "topology.honest=5", "topology.byzantine=0", "attack.name=none", "rounds=1500", "train.lr=0.2", "network.round_timeout=2",
            "checkpoint.every=20", "eval.every=50", "topology.schedule=redraw", "topology.schedule_params.redraw.degree=2",
        ],
    )
    assert scenario.num_clients == N
    graphs = scenario_graphs(scenario)
    certs = tmp_path / "certs"
    make_certificates(N, certs)
    out = tmp_path / "run"
    out.mkdir()
    dump_scenario(scenario, out / "scenario.toml")
    clients = Clients(out, certs, out / "scenario.toml")
    ckpt = out / "peers" / f"{victim}.ckpt.npz"

    # Execute: kill it past round kill_at, start it again once the others went on without it
    try:
        for k in range(N):
            clients.start(k)
        clients.wait_for(lambda: _last_round(out, victim) >= kill_at and ckpt.exists(), 120, f"client {victim} past round {kill_at}", step=0.05)
        clients.procs[victim].send_signal(signal.SIGKILL)
        clients.procs[victim].wait(timeout=10)
        others = [k for k in range(N) if k != victim]
        gone = lambda: all(f"neighbour {victim} " in (out / "logs" / f"{j}.log").read_text(errors="replace") for j in others)  # noqa: E731
        clients.wait_for(gone, 60, f"the others to stop waiting for client {victim}")
        clients.start(victim)  # its log: logs/{victim}.2.log
        codes = clients.wait_exit(600)
    finally:
        clients.kill_all()

    # Assert: every client finished; the victim resumed once, logged each round once
    assert codes == {k: 0 for k in range(N)}, clients.tails()
    final = read_final(out, victim)
    assert final["restarts"] == 1 and final["schedule"] == "redraw"
    resume = final["resumed_from"][0]
    records = read_rounds(out, victim)
    rounds = [r["round"] for r in records]
    assert rounds == sorted(set(rounds)) and rounds[-1] == scenario.rounds - 1
    # After it resumed: each round's record names that round's graph, and in most rounds it
    # aggregated exactly its two neighbours of the round (a round or two right after its
    # return may miss one that had not yet taken it back).
    after = [r for r in records if r["round"] >= resume["resumed_at"]]
    assert all(r["neighbours"] == list(graphs.senders_to(victim, r["round"])) for r in after)
    exact = sum(sorted(map(int, r["weights"])) == sorted({victim, *r["neighbours"]}) for r in after)
    assert resume["neighbour_rounds"] and resume["resumed_at"] > kill_at, resume  # it found where the others were
    assert exact >= 0.9 * len(after), (exact, len(after))
    assert all(read_final(out, k)["rejected_by_reason"].get("not_neighbour", 0) == 0 for k in range(N))
