"""Graphs that change from round to round (peer/graph/schedule.py, topologies/schedules.py).

What each built-in schedule promises, checked over many rounds and seeds:

* every schedule: the graph of round t is a function of (seed, t) alone: the same in every
  client (each builds its own schedule object from the scenario), whatever order the rounds are
  asked in, and the Byzantine ids are the base topology's in every round;
* ``redraw`` (random-regular or Erdos-Renyi): every round's graph connected and its honest
  subgraph connected; random-regular gives every client exactly ``degree`` neighbours; the graph
  changes only every ``every`` rounds;
* ``epidemic`` (Epidemic Learning): every client sends to exactly ``fanout`` others; nothing is
  promised of connectivity, and rounds whose graph is not (strongly) connected do occur;
* ``edge_failures``: a subgraph of the base graph, the base graph itself when ``p = 0``.
"""

from __future__ import annotations

import networkx as nx
import pytest
import torch

from dfedrw.peer.config.scenario import ScenarioError, load_scenario, scenario_changes, scenario_to_dict
from dfedrw.peer.wiring.plan import scenario_graphs, scenario_topology, told_byzantine
from dfedrw.peer.graph.schedule import SCHEDULE_REGISTRY, RoundGraphs
from dfedrw.peer.transport.inbox import Inbox
from dfedrw.peer.transport.serde import ModelMessage
from dfedrw.topologies.schedules import edges_up, epidemic_push, random_regular_connected

ROUNDS = 60
REDRAW_RR = ("topology.schedule=redraw", "topology.schedule_params.redraw.degree=4")
REDRAW_ER = ("topology.schedule=redraw", "topology.schedule_params.redraw.graph=erdos_renyi", "topology.rho=0.3")
EPIDEMIC = ("topology.schedule=epidemic", "topology.schedule_params.epidemic.fanout=2")
FAILURES = ("topology.schedule=edge_failures", "topology.schedule_params.edge_failures.p=0.3")
ALL = {"redraw-regular": REDRAW_RR, "redraw-erdos-renyi": REDRAW_ER, "epidemic": EPIDEMIC, "edge-failures": FAILURES}


def scenario(*overrides: str, seed: int = 43):
    return load_scenario(None, ["topology.honest=10", "topology.byzantine=2", "attack.name=gaussian", f"seed={seed}", *overrides])


def edges(graphs: RoundGraphs, r: int) -> list[tuple[int, int]]:
    return sorted(graphs.graph(r).edges)


# -- the same graph everywhere -------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ALL))
def test_every_client_computes_the_same_graph_of_every_round(name):
    # Prepare: each client builds its own schedule from the scenario, as a client process does
    sc = scenario(*ALL[name])
    clients = [scenario_graphs(sc) for _ in range(4)]

    # Execute: one asks the rounds in order, another backwards, another at random
    forward = [edges(clients[0], r) for r in range(ROUNDS)]
    backward = [edges(clients[1], r) for r in reversed(range(ROUNDS))][::-1]
    order = torch.randperm(ROUNDS, generator=torch.Generator().manual_seed(0)).tolist()
    shuffled = dict(zip(order, [edges(clients[2], r) for r in order], strict=True))

    # Assert
    assert forward == backward == [shuffled[r] for r in range(ROUNDS)]
    assert all(clients[3].senders_to(k, r) == tuple(sorted(j for j, i in forward[r] if i == k)) for r in range(ROUNDS) for k in range(12))
    assert len({tuple(e) for e in forward}) > ROUNDS // 2, "the graph should change from round to round"


@pytest.mark.parametrize("name", sorted(ALL))
def test_the_graph_depends_on_the_seed_and_byzantine_placement_stays_fixed(name):
    one, other = scenario(*ALL[name], seed=43), scenario(*ALL[name], seed=44)
    a, b = scenario_graphs(one), scenario_graphs(other)
    assert [edges(a, r) for r in range(10)] != [edges(b, r) for r in range(10)]
    # The Byzantine ids are the base topology's (placed once by the seed), whatever the round.
    assert a.topology.byzantine == scenario_topology(one).byzantine
    assert scenario_graphs(one).topology.byzantine == a.topology.byzantine


# -- what each schedule promises -----------------------------------------------------------------
@pytest.mark.parametrize("seed", [43, 44, 45, 46])
@pytest.mark.parametrize("name", ["redraw-regular", "redraw-erdos-renyi"])
def test_redraw_is_connected_with_a_connected_honest_subgraph_every_round(name, seed):
    graphs = scenario_graphs(scenario(*ALL[name], seed=seed))
    honest = graphs.topology.honest()
    for r in range(ROUNDS):
        g = graphs.graph(r).to_undirected(reciprocal=True)
        assert g.number_of_edges() * 2 == graphs.graph(r).number_of_edges()  # undirected: both ways
        assert nx.is_connected(g) and nx.is_connected(g.subgraph(honest)), f"round {r}"
        if name == "redraw-regular":
            assert {d for _, d in g.degree} == {4}, f"round {r}"


def test_redraw_every_k_rounds_keeps_the_graph_between_draws():
    graphs = scenario_graphs(scenario(*REDRAW_RR, "topology.schedule_params.redraw.every=5"))
    drawn = [edges(graphs, r) for r in range(20)]
    assert all(drawn[r] == drawn[r - r % 5] for r in range(20))
    assert len({tuple(drawn[r]) for r in (0, 5, 10, 15)}) == 4


@pytest.mark.parametrize("seed", [43, 44, 45, 46])
def test_epidemic_sends_to_exactly_fanout_peers_and_promises_no_connectivity(seed):
    graphs = scenario_graphs(scenario(*EPIDEMIC, seed=seed))
    in_degrees = set()
    disconnected = 0
    for r in range(ROUNDS):
        g = graphs.graph(r)
        assert all(len(graphs.receivers_of(k, r)) == 2 for k in range(12)), f"round {r}"
        assert all(k not in graphs.receivers_of(k, r) for k in range(12))
        in_degrees |= {d for _, d in g.in_degree}
        disconnected += not nx.is_strongly_connected(g)
    assert graphs.directed and graphs.mean_degree(ROUNDS) == 2.0
    assert 0 in in_degrees and max(in_degrees) > 2  # in-degrees vary: some rounds a client hears nothing
    assert disconnected > 0


def test_edge_failures_is_a_subgraph_of_the_base_graph():
    sc = scenario(*FAILURES)
    graphs, base = scenario_graphs(sc), scenario_topology(sc).graph
    base_edges = {tuple(sorted(e)) for e in base.edges}
    down = 0
    for r in range(ROUNDS):
        up = {tuple(sorted(e)) for e in graphs.graph(r).to_undirected(reciprocal=True).edges}
        assert up <= base_edges
        down += len(base_edges - up)
    assert 0.2 < down / (ROUNDS * len(base_edges)) < 0.4  # p = 0.3
    assert all(set(graphs.possible(k)) == set(base.neighbors(k)) for k in range(12))
    assert edges_up(base, 0.0, 7).edges == base.edges


def test_pure_drawing_functions_are_reproducible():
    byzantine = frozenset({3})
    assert sorted(random_regular_connected(10, 3, byzantine, 5).edges) == sorted(random_regular_connected(10, 3, byzantine, 5).edges)
    assert sorted(epidemic_push(10, 3, 5).edges) == sorted(epidemic_push(10, 3, 5).edges)
    with pytest.raises(ValueError, match="regular graph"):
        random_regular_connected(9, 3, byzantine, 5)


# -- a fixed graph is what it was ----------------------------------------------------------------
def test_without_a_schedule_every_round_is_the_base_graph_and_the_identity_is_unchanged():
    sc = scenario()
    graphs, topology = scenario_graphs(sc), scenario_topology(sc)
    assert not graphs.dynamic and not graphs.directed
    assert all(graphs.senders_to(k, r) == graphs.receivers_of(k, r) == topology.neighbours(k) for k in range(12) for r in (0, 7, 999))
    assert graphs.mean_degree(100) == 2 * topology.graph.number_of_edges() / 12
    assert "schedule" not in scenario_changes(sc).get("topology", {})
    assert not {"schedule", "schedule_params"} & set(scenario_to_dict(sc)["topology"])


def test_a_schedule_is_part_of_the_run_identity():
    changes = scenario_changes(scenario(*EPIDEMIC))["topology"]
    assert changes["schedule"] == "epidemic" and changes["schedule_params"] == {"epidemic": {"fanout": 2}}


def test_what_a_robust_rule_is_told_follows_the_round_graph():
    sc = scenario(*REDRAW_RR, "aggregation.rule=trimmed_mean")
    graphs = scenario_graphs(sc)
    cfg = sc.aggregation_for(0)
    told = {told_byzantine(cfg, graphs.topology, k, graphs.senders_to(k, r)) for r in range(ROUNDS) for k in graphs.topology.honest()}
    assert told >= {0, 1}  # changes with the round's graph
    assert all(
        told_byzantine(cfg, graphs.topology, k, graphs.senders_to(k, r)) == len(set(graphs.senders_to(k, r)) & graphs.topology.byzantine)
        for r in range(10) for k in range(12)
    )


# -- a schedule of one's own, and the checks on every graph ----------------------------------------
def test_a_schedule_by_import_path():
    sc = scenario("topology.schedule=tests.support.schedules:Rotating", 'topology.schedule_params."tests.support.schedules:Rotating".step=2')
    graphs = scenario_graphs(sc)
    assert graphs.directed and graphs.receivers_of(0, 0) == (1,) and graphs.receivers_of(0, 1) == (3,)
    assert graphs.senders_to(3, 1) == (0,)


def test_a_schedule_that_breaks_its_promise_or_its_peers_stops_with_one_line():
    broken = scenario_graphs(scenario("topology.schedule=tests.support.schedules:BrokenPromise"))
    assert broken.senders_to(0, 0)
    with pytest.raises(ValueError, match="round 1: the graph is not connected"):
        broken.senders_to(0, 1)
    outside = scenario_graphs(scenario("topology.schedule=tests.support.schedules:OutsideItsPeers"))
    with pytest.raises(ValueError, match="not among its possible_peers"):
        outside.senders_to(0, 0)


def test_bad_schedule_settings_fail_at_load():
    with pytest.raises(ScenarioError, match="unknown schedule"):
        scenario("topology.schedule=nope")
    with pytest.raises(ScenarioError, match="has no setting 'fan'"):
        scenario("topology.schedule=epidemic", "topology.schedule_params.epidemic.fan=2")
    with pytest.raises(ScenarioError, match="degree=3 on 11 clients"):
        scenario("topology.schedule=redraw", "topology.honest=9")
    with pytest.raises(ScenarioError, match="fanout=12"):
        scenario("topology.schedule=epidemic", "topology.schedule_params.epidemic.fanout=12")
    assert set(SCHEDULE_REGISTRY.builtin_names()) == {"redraw", "epidemic", "edge_failures"}


# -- the intake checks the round's graph -----------------------------------------------------------
def message(sender: int, round_: int) -> ModelMessage:
    return ModelMessage(sender=sender, round=round_, vector=torch.zeros(3), num_samples=1, train_loss=0.0, nbytes=12)


def test_the_intake_takes_a_sender_only_in_the_rounds_it_is_an_in_neighbour():
    # Prepare: client 0 hears from 1 in even rounds, from 2 in odd rounds
    inbox = Inbox(0, [1, 2], 3, 2, senders_at=lambda r: (1,) if r % 2 == 0 else (2,))

    # Execute
    verdicts = {(s, r): inbox.offer(message(s, r)) for s in (1, 2) for r in (0, 1, 2)}
    again = inbox.offer(message(1, 0))
    inbox.advance(2)
    late = inbox.offer(message(2, 1))

    # Assert
    assert verdicts == {
        (1, 0): (True, ""), (1, 1): (False, "not_neighbour"), (1, 2): (True, ""),
        (2, 0): (False, "not_neighbour"), (2, 1): (True, ""), (2, 2): (False, "not_neighbour"),
    }
    assert again == (False, "duplicate") and late == (False, "stale_round")
    assert inbox.rejected == {"not_neighbour": 3, "duplicate": 1}
    assert inbox.screen(2, 2) == (False, "not_neighbour") and inbox.screen(1, 2) is None
    assert inbox.screen(2, 99) is None  # a far round is refused by offer, as future_round
