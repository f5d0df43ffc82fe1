"""Unit tests for Byzantine placement by centrality (``topology.placement``)."""

from __future__ import annotations

import networkx as nx
import pytest

from dfedrw.peer.config.scenario import ScenarioError, load_scenario, scenario_changes, scenario_from_dict, scenario_to_dict
from dfedrw.peer.graph.topology import build_topology
from dfedrw.peer.results.collect import placement_summary
from dfedrw.peer.wiring.plan import scenario_graphs, scenario_topology
from dfedrw.topologies import PLACEMENTS, Topology, graphs, place_by_centrality, place_byzantine, write_edgelist


def clique_with_hub() -> nx.Graph:
    """K5 on 0..4, and node 5 joined to 0 and to the leaves 6..10: node 5 has the highest degree
    (6), node 0 the highest eigenvector centrality (it sits in the dense clique)."""
    graph = nx.complete_graph(5)
    graph.add_edge(0, 5)
    graph.add_edges_from((5, k) for k in range(6, 11))
    return graph


def edges_of(graph: nx.Graph) -> list[tuple[int, int]]:
    return sorted(tuple(sorted(e)) for e in graph.edges)


# ------------------------------------------------------------------------ place_by_centrality


@pytest.mark.parametrize("placement", ["degree", "betweenness", "eigenvector"])
def test_every_central_placement_picks_the_hub_of_a_star(placement):
    # Execute
    chosen, centrality = place_by_centrality(nx.star_graph(5), 1, placement, seed=0)
    # Assert
    assert chosen == (0,)
    assert list(centrality) == [0] and centrality[0] > 0


def test_degree_centrality_is_degree_over_n_minus_one():
    chosen, centrality = place_by_centrality(nx.star_graph(5), 1, "degree", seed=0)
    assert centrality == {0: 1.0}


def test_betweenness_picks_the_middle_of_a_path_and_the_bridge_of_a_barbell():
    # Execute
    middle, _ = place_by_centrality(nx.path_graph(5), 1, "betweenness", seed=0)
    # barbell_graph(4, 1): cliques 0..3 and 5..8 joined through node 4.
    bridge, centrality = place_by_centrality(nx.barbell_graph(4, 1), 1, "betweenness", seed=0)
    # Assert
    assert middle == (2,)
    assert bridge == (4,)
    assert centrality[4] == pytest.approx(nx.betweenness_centrality(nx.barbell_graph(4, 1))[4])


def test_eigenvector_and_degree_pick_different_nodes_where_they_differ():
    # Execute
    by_degree, _ = place_by_centrality(clique_with_hub(), 1, "degree", seed=0)
    by_eigenvector, centrality = place_by_centrality(clique_with_hub(), 1, "eigenvector", seed=0)
    # Assert
    assert by_degree == (5,)
    assert by_eigenvector == (0,)
    assert centrality[0] == pytest.approx(nx.eigenvector_centrality(clique_with_hub(), tol=1e-12)[0], abs=1e-9)


def test_central_placements_are_most_central_first():
    chosen, centrality = place_by_centrality(clique_with_hub(), 3, "degree", seed=0)
    # 5 has degree 6, 0 has 5; 1..4 tie at 4 and are taken by id.
    assert chosen == (5, 0, 1)
    assert list(centrality.values()) == sorted(centrality.values(), reverse=True)


def test_leaf_picks_degree_one_nodes_lowest_id_first():
    # Execute
    chosen, centrality = place_by_centrality(clique_with_hub(), 3, "leaf", seed=0)
    # Assert
    assert chosen == (6, 7, 8)
    assert all(clique_with_hub().degree(k) == 1 for k in chosen)
    assert centrality == {k: pytest.approx(0.1) for k in chosen}  # degree 1 over n - 1 = 10


def test_leaf_breaks_degree_ties_by_lower_betweenness_then_by_id():
    # Prepare: on the path 0..6 the ends have degree 1; of the degree-2 nodes 1 and 5 carry the
    # fewest shortest paths (tied), 3 the most.
    path = nx.path_graph(7)
    # Execute
    chosen, _ = place_by_centrality(path, 4, "leaf", seed=0)
    # Assert
    assert chosen == (0, 6, 1, 5)


def test_symmetric_nodes_tie_and_are_taken_by_id():
    # Every node of a ring is alike: whatever the float sums, the choice is by id.
    for placement in ("degree", "betweenness", "eigenvector", "leaf"):
        assert place_by_centrality(nx.cycle_graph(9), 3, placement, seed=5)[0] == (0, 1, 2)


@pytest.mark.parametrize("placement", ["degree", "betweenness", "eigenvector", "leaf"])
def test_placement_is_deterministic_for_the_same_seed(placement):
    graph = nx.gnp_random_graph(30, 0.2, seed=3)
    graph = graph.subgraph(max(nx.connected_components(graph), key=len)).copy()
    graph = nx.convert_node_labels_to_integers(graph)
    assert place_by_centrality(graph, 4, placement, seed=7) == place_by_centrality(graph, 4, placement, seed=7)


def test_large_graphs_estimate_betweenness_from_seeded_sources_and_iterate_for_eigenvector(monkeypatch):
    # Prepare: pretend 20 nodes is large, so betweenness samples 20 sources of a 40-node graph
    graph = nx.connected_watts_strogatz_graph(40, 4, 0.3, seed=2)
    exact = place_by_centrality(graph, 3, "eigenvector", seed=0)
    monkeypatch.setattr(graphs, "EXACT_CENTRALITY_NODES", 20)
    # Execute
    first = place_by_centrality(graph, 3, "betweenness", seed=11)
    again = place_by_centrality(graph, 3, "betweenness", seed=11)
    iterated = place_by_centrality(graph, 3, "eigenvector", seed=0)
    # Assert
    assert first == again
    assert iterated[0] == exact[0]
    assert all(iterated[1][k] == pytest.approx(exact[1][k], abs=1e-7) for k in exact[0])


def test_no_byzantine_is_an_empty_placement():
    assert place_by_centrality(nx.path_graph(3), 0, "betweenness", seed=0) == ((), {})


@pytest.mark.parametrize(
    "args, message",
    [
        ((nx.path_graph(4), 1, "random", 0), "not a centrality placement; valid choices: degree, betweenness, eigenvector, leaf"),
        ((nx.path_graph(4), 1, "hub", 0), "'hub' is not a centrality placement"),
        ((nx.path_graph(4), 4, "degree", 0), "leaves no honest node"),
        ((nx.path_graph(4), -1, "degree", 0), "num_byzantine must be an integer >= 0"),
        ((nx.Graph([(0, 1), (2, 3)]), 1, "degree", 0), "the graph is not connected"),
    ],
)
def test_place_by_centrality_rejects_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        place_by_centrality(*args)


# ------------------------------------------------------------------------------ build_topology


def test_random_placement_keeps_todays_ids_and_graph():
    # Execute
    default = build_topology("erdos_renyi", 10, 3, seed=43)
    random = build_topology("erdos_renyi", 10, 3, seed=43, placement="random")
    # Assert
    assert random.byzantine == default.byzantine == place_byzantine(13, 3, 43)
    assert edges_of(random.graph) == edges_of(default.graph)
    assert random.centrality == {}


def test_a_central_placement_draws_a_connected_graph_then_places_on_it():
    # Execute
    topo = build_topology("erdos_renyi", 12, 3, seed=1, rho=0.4, placement="betweenness")
    # Assert: the graph is the builder's with no Byzantine ids known
    unplaced = build_topology("erdos_renyi", 15, 0, seed=1, rho=0.4)
    assert edges_of(topo.graph) == edges_of(unplaced.graph)
    chosen, centrality = place_by_centrality(unplaced.graph, 3, "betweenness", seed=1)
    assert topo.byzantine == frozenset(chosen) and dict(topo.centrality) == centrality
    assert nx.is_connected(topo.graph.subgraph(topo.honest()))


def test_a_placement_that_cuts_the_honest_clients_apart_is_refused_clearly(tmp_path):
    # Prepare: two cliques joined through node 4, the most central by betweenness
    path = tmp_path / "barbell.txt"
    write_edgelist(nx.barbell_graph(4, 1), path)
    # Execute / Assert
    with pytest.raises(ValueError) as err:
        build_topology("edgelist", 8, 1, seed=0, file=path, placement="betweenness")
    message = str(err.value)
    for words in ("topology.placement='betweenness'", "most central clients by betweenness centrality", "[4]",
                  "disconnect the honest clients", "another placement", "fewer Byzantine clients", "a denser graph"):
        assert words in message
    # The bridge has the lowest degree (2) too, so leaf refuses it as well, saying so.
    with pytest.raises(ValueError, match=r"the 1 least central clients by degree, \[4\], disconnect the honest clients"):
        build_topology("edgelist", 8, 1, seed=0, file=path, placement="leaf")


def test_an_unknown_placement_is_refused_by_build_topology():
    with pytest.raises(ValueError, match="unknown placement 'hub'; valid choices: random, degree, betweenness, eigenvector, leaf"):
        build_topology("ring", 4, 1, seed=0, placement="hub")


def test_topology_centrality_must_be_of_the_byzantine_nodes():
    with pytest.raises(ValueError, match="not for the Byzantine nodes"):
        Topology(graph=nx.path_graph(3), byzantine=frozenset({1}), centrality={0: 0.5})
    assert Topology(graph=nx.path_graph(3), byzantine=frozenset({1})).centrality == {}


# ------------------------------------------------------------------- scenario, summary, engines


def test_the_config_refuses_an_unknown_placement_naming_the_choices():
    with pytest.raises(ScenarioError, match="topology.placement='hub' is not valid; choose one of: " + ", ".join(PLACEMENTS)):
        load_scenario(None, ["topology.placement=hub"])


def test_a_placement_is_written_and_part_of_the_identity_only_when_not_random():
    # Execute
    default = load_scenario(None)
    placed = load_scenario(None, ["topology.placement=eigenvector"])
    # Assert
    assert "placement" not in scenario_to_dict(default)["topology"]
    assert "placement" not in scenario_changes(default).get("topology", {})
    assert scenario_to_dict(placed)["topology"]["placement"] == "eigenvector"
    assert scenario_changes(placed)["topology"] == {**scenario_changes(default)["topology"], "placement": "eigenvector"}
    assert scenario_from_dict(scenario_to_dict(placed)).topology.placement == "eigenvector"


def test_scenario_topology_places_as_build_topology_does():
    # Prepare: what every engine and launcher builds its clients from
    scenario = load_scenario(None, ["topology.placement=degree", "topology.honest=10", "topology.byzantine=2"])
    # Execute
    topo = scenario_topology(scenario)
    # Assert
    direct = build_topology("erdos_renyi", 10, 2, seed=scenario.seed, rho=scenario.topology.rho, placement="degree")
    assert topo.byzantine == direct.byzantine and dict(topo.centrality) == dict(direct.centrality)
    assert edges_of(topo.graph) == edges_of(direct.graph)


def test_under_a_schedule_the_placement_is_on_the_base_graph():
    scenario = load_scenario(None, ["topology.placement=betweenness", "topology.schedule=edge_failures"])
    graphs_ = scenario_graphs(scenario)
    assert graphs_.dynamic and graphs_.topology.byzantine == scenario_topology(scenario).byzantine


def test_the_summary_records_the_placement_and_each_byzantine_centrality():
    # Prepare
    placed = load_scenario(None, ["topology.placement=degree"])
    topo = scenario_topology(placed)
    # Execute
    summary = placement_summary(placed, topo)
    random = placement_summary(load_scenario(None), scenario_topology(load_scenario(None)))
    # Assert
    assert summary["kind"] == "degree"
    assert set(summary["centrality"]) == {str(k) for k in topo.byzantine}
    assert summary["centrality"] == {str(k): round(topo.graph.degree(k) / (topo.num_clients - 1), 9) for k in topo.centrality}
    assert random == {"kind": "random", "centrality": {}}


def test_collect_summary_writes_the_placement(tmp_path):
    import json

    from dfedrw.peer.results.collect import collect_summary

    scenario = load_scenario(None, ["rounds=2", "topology.placement=leaf"])
    summary = collect_summary(tmp_path, scenario)
    assert summary["placement"]["kind"] == "leaf"
    assert json.loads((tmp_path / "summary.json").read_text())["placement"] == summary["placement"]
