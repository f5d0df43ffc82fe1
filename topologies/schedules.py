"""Graphs that change from round to round: the pure drawing functions of the built-in schedules.

Each function draws the graph of one round from a seed and the round alone (no state carried
from round to round), so every client computes the same graph of any round without asking
anyone, in any order. Which of them a scenario can name (``topology.schedule``) is the registry
of :mod:`dfedrw.peer.graph.schedule`.

The graph of a round is directed where messages go one way (an edge ``u -> v``: ``u`` sends its
model to ``v`` in that round) and undirected where every edge carries a model both ways.
"""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx
import numpy as np

from dfedrw.topologies.graphs import draw_connected

__all__ = ["edges_up", "epidemic_push", "random_regular_connected", "round_seed"]


def round_seed(seed: int, tag: str, index: int) -> int:
    """An independent seed for draw number ``index`` of the schedule ``tag`` of run ``seed``."""
    word = int.from_bytes(tag.encode()[:8].ljust(8, b"\0"), "little")
    return int(np.random.SeedSequence([int(seed), word, int(index)]).generate_state(1, dtype=np.uint32)[0])


def random_regular_connected(n: int, degree: int, byzantine: frozenset[int], seed: int, max_tries: int = 10000) -> nx.Graph:
    """A random ``degree``-regular graph on ``n`` nodes, re-drawn until it and its honest
    subgraph (without ``byzantine``) are connected. Each try is
    ``networkx.random_regular_graph`` with a seed taken from a generator seeded by ``seed``.
    Raises ValueError when ``n * degree`` is odd, ``degree >= n``, or after ``max_tries``."""
    if not 1 <= degree < n or (n * degree) % 2:
        raise ValueError(f"no {degree}-regular graph on {n} nodes: need 1 <= degree < n and n * degree even")
    graph = draw_connected(lambda s: nx.random_regular_graph(degree, n, seed=s), byzantine, seed, max_tries)
    if graph is not None:
        return graph
    raise ValueError(
        f"no connected {degree}-regular graph on {n} nodes with a connected honest subgraph in {max_tries} draws "
        f"({len(byzantine)} Byzantine); raise the degree"
    )


def epidemic_push(n: int, fanout: int, seed: int) -> nx.DiGraph:
    """Epidemic Learning's round graph (de Vos et al., NeurIPS 2023, EL-Oracle): every node
    sends to ``fanout`` other nodes drawn uniformly without replacement, independently of the
    others; an edge ``u -> v`` is ``u`` sending to ``v``. Out-degree ``fanout`` everywhere;
    in-degrees vary (mean ``fanout``), and a round's graph need not be connected."""
    if not 1 <= fanout < n:
        raise ValueError(f"fanout must lie in 1..{n - 1} (the other nodes), got {fanout}")
    rng = np.random.default_rng(seed)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    for u in range(n):
        others = np.array([v for v in range(n) if v != u])
        for v in rng.choice(others, size=fanout, replace=False).tolist():
            graph.add_edge(u, int(v))
    return graph


def edges_up(base: nx.Graph, p: float, seed: int) -> nx.Graph:
    """``base`` with each of its edges down independently with probability ``p`` (both
    directions together): the same nodes, a subset of the edges. Edges are visited in sorted
    order, so the result depends only on the arguments."""
    if not 0 <= p < 1:
        raise ValueError(f"a failure probability lies in [0, 1), got {p!r}")
    edges: Iterable[tuple[int, int]] = sorted(tuple(sorted((int(u), int(v)))) for u, v in base.edges)
    edges = list(edges)
    up = np.random.default_rng(seed).random(len(edges)) >= p
    graph = nx.Graph()
    graph.add_nodes_from(range(base.number_of_nodes()))
    graph.add_edges_from(e for e, keep in zip(edges, up.tolist(), strict=True) if keep)
    return graph
