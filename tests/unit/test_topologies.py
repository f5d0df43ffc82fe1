"""Unit tests for topologies: Erdos-Renyi redraws, ring/complete, edge lists, placement."""

from __future__ import annotations

import networkx as nx
import pytest

from dfedrw.peer.graph.topology import TOPOLOGY_REGISTRY, build_topology
from dfedrw.topologies import (
    Topology,
    complete,
    erdos_renyi_connected,
    place_byzantine,
    read_edgelist,
    ring,
    write_edgelist,
)


def edges_of(graph: nx.Graph) -> list[tuple[int, int]]:
    return sorted(tuple(sorted(e)) for e in graph.edges)


# --------------------------------------------------------------------------------- Erdos-Renyi


@pytest.mark.parametrize("seed", [43, 44, 45, 46, 0, 1, 2])
def test_erdos_renyi_is_connected_and_honest_connected(seed):
    # Prepare
    byzantine = place_byzantine(12, 2, seed)
    # Execute
    graph = erdos_renyi_connected(12, 0.3, byzantine, seed)
    # Assert
    assert sorted(graph.nodes) == list(range(12))
    assert nx.is_connected(graph)
    assert nx.is_connected(graph.subgraph(set(range(12)) - byzantine))


def test_erdos_renyi_is_deterministic_and_seed_dependent():
    # Execute
    a = erdos_renyi_connected(12, 0.5, frozenset({1}), seed=43)
    b = erdos_renyi_connected(12, 0.5, frozenset({1}), seed=43)
    c = erdos_renyi_connected(12, 0.5, frozenset({1}), seed=44)
    # Assert
    assert edges_of(a) == edges_of(b)
    assert edges_of(a) != edges_of(c)


def test_erdos_renyi_gives_up_after_max_tries():
    # Prepare: a sparse large graph is almost never connected
    with pytest.raises(ValueError, match="3 draws"):
        erdos_renyi_connected(60, 0.01, frozenset(), seed=0, max_tries=3)


@pytest.mark.parametrize("rho", [0, -0.5, 1.5])
def test_erdos_renyi_rejects_bad_rho(rho):
    with pytest.raises(ValueError, match="rho"):
        erdos_renyi_connected(5, rho, frozenset(), seed=0)


def test_erdos_renyi_rejects_byzantine_out_of_range():
    with pytest.raises(ValueError, match=r"\[7\]"):
        erdos_renyi_connected(5, 0.5, frozenset({7}), seed=0)


# --------------------------------------------------------------------------------- ring / complete


def test_ring_degrees():
    graph = ring(6)
    assert [d for _, d in graph.degree] == [2] * 6
    assert nx.is_connected(graph)


def test_complete_degrees():
    graph = complete(5)
    assert [d for _, d in graph.degree] == [4] * 5


def test_ring_of_one_is_rejected():
    with pytest.raises(ValueError, match="n must be an integer >= 2"):
        ring(1)


# --------------------------------------------------------------------------------- placement


def test_place_byzantine_count_range_and_determinism():
    # Execute
    first = place_byzantine(12, 2, seed=43)
    again = place_byzantine(12, 2, seed=43)
    # Assert
    assert len(first) == 2 and all(0 <= b < 12 for b in first)
    assert first == again
    assert len({place_byzantine(12, 2, seed=s) for s in range(20)}) > 1


def test_place_byzantine_zero_and_too_many():
    assert place_byzantine(5, 0, seed=0) == frozenset()
    with pytest.raises(ValueError, match="num_byzantine=5"):
        place_byzantine(5, 5, seed=0)


# --------------------------------------------------------------------------------- edge lists


def test_edgelist_round_trip(tmp_path):
    # Prepare
    graph = erdos_renyi_connected(9, 0.4, frozenset(), seed=3)
    path = tmp_path / "g.txt"
    # Execute
    write_edgelist(graph, path)
    read_back = read_edgelist(path, 9)
    # Assert
    assert edges_of(read_back) == edges_of(graph)
    assert sorted(read_back.nodes) == list(range(9))


def test_edgelist_skips_comments_and_blank_lines_and_keeps_isolated_nodes(tmp_path):
    # Prepare
    path = tmp_path / "g.txt"
    path.write_text("# header\n\n0 1  # trailing\n1 2\n2 1\n")
    # Execute
    graph = read_edgelist(path, 4)
    # Assert
    assert edges_of(graph) == [(0, 1), (1, 2)]
    assert graph.degree(3) == 0


@pytest.mark.parametrize(
    "text, message",
    [
        ("0 1\n1 5\n", r"g.txt:2: node id 5 is outside 0..3"),
        ("0 1\n2 2\n", r"g.txt:2: self loop"),
        ("0 1 2\n", r"g.txt:1: expected two node ids"),
        ("0 a\n", r"g.txt:1: node ids must be integers"),
        ("-1 0\n", r"g.txt:1: node id -1"),
    ],
)
def test_edgelist_errors_name_the_line(tmp_path, text, message):
    # Prepare
    path = tmp_path / "g.txt"
    path.write_text(text)
    # Execute / Assert
    with pytest.raises(ValueError, match=message):
        read_edgelist(path, 4)


# --------------------------------------------------------------------------------- build_topology


@pytest.mark.parametrize("seed", [43, 44, 45, 46])
def test_build_topology_erdos_renyi_paper_setting(seed):
    # Execute
    topo = build_topology("erdos_renyi", num_honest=10, num_byzantine=2, seed=seed)
    again = build_topology("erdos_renyi", num_honest=10, num_byzantine=2, seed=seed)
    # Assert
    assert topo.num_clients == 12
    assert len(topo.byzantine) == 2 and topo.byzantine == place_byzantine(12, 2, seed)
    assert len(topo.honest()) == 10 and set(topo.honest()).isdisjoint(topo.byzantine)
    assert edges_of(topo.graph) == edges_of(again.graph) and topo.byzantine == again.byzantine
    for k in topo.honest():
        assert len(topo.neighbours(k)) >= 1
        assert list(topo.neighbours(k)) == sorted(topo.neighbours(k))


def test_build_topology_ring_and_complete():
    # Execute
    ring_topo = build_topology("ring", 5, 0, seed=0)
    full_topo = build_topology("complete", 4, 1, seed=0)
    # Assert
    assert ring_topo.neighbours(0) == (1, 4)
    assert full_topo.neighbours(2) == (0, 1, 3, 4)
    assert full_topo.is_byzantine(next(iter(full_topo.byzantine)))


def test_build_topology_edgelist_checks_connectivity(tmp_path):
    # Prepare: a path 0-1-2-3; which node is Byzantine is seeded, so find seeds for both cases
    path = tmp_path / "path.txt"
    path.write_text("0 1\n1 2\n2 3\n")
    inner_seed = next(s for s in range(100) if place_byzantine(4, 1, s) & {1, 2})
    outer_seed = next(s for s in range(100) if place_byzantine(4, 1, s) & {0, 3})
    # Execute
    topo = build_topology("edgelist", 3, 1, seed=outer_seed, file=path)
    # Assert
    assert topo.num_clients == 4
    with pytest.raises(ValueError, match="honest subgraph"):
        build_topology("edgelist", 3, 1, seed=inner_seed, file=path)


def test_build_topology_edgelist_disconnected_graph_is_rejected(tmp_path):
    # Prepare
    path = tmp_path / "two.txt"
    path.write_text("0 1\n2 3\n")
    # Execute / Assert
    with pytest.raises(ValueError, match="graph is not connected"):
        build_topology("edgelist", 4, 0, seed=0, file=str(path))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kind="torus", num_honest=4, num_byzantine=0), r"unknown topology 'torus'; valid choices: \[" + ", ".join(repr(k) for k in sorted(TOPOLOGY_REGISTRY)) + r"\]"),
        (dict(kind="edgelist", num_honest=4, num_byzantine=0), "needs a file"),
        (dict(kind="ring", num_honest=4, num_byzantine=0, file="x.txt"), "only used by"),
        (dict(kind="complete", num_honest=1, num_byzantine=0), "at least 2 clients"),
        (dict(kind="complete", num_honest=0, num_byzantine=2), "num_honest"),
    ],
)
def test_build_topology_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_topology(seed=0, **kwargs)


def test_topology_rejects_unknown_neighbour_query():
    topo = Topology(graph=complete(3), byzantine=frozenset())
    with pytest.raises(ValueError, match="0..2"):
        topo.neighbours(3)


@pytest.mark.parametrize("name", ["missing.txt", "."])
def test_unreadable_edge_list_is_a_one_line_value_error(tmp_path, name):
    with pytest.raises(ValueError, match=r"^topology.file: cannot read edge list '.*': [A-Z]") as err:
        build_topology("edgelist", 3, 0, seed=1, file=tmp_path / name)
    assert "\n" not in str(err.value)
