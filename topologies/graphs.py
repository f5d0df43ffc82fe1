"""Seeded communication graphs, Byzantine placement and edge-list files.

The paper ("Experimental Settings") uses an Erdos-Renyi graph G(N, rho), N = benign +
Byzantine clients, rho = 0.7, re-drawn until the graph and its honest subgraph are both
connected. Ring, complete and user-supplied edge lists are offered for other experiments.
Byzantine clients are placed uniformly at random before the graph is drawn
(:func:`place_byzantine`) or, on a drawn graph, at its most or least central nodes
(:func:`place_by_centrality`). All of these are deterministic for the same arguments and
never touch global RNG state.
Which of them a scenario can name (``topology.kind``) is the registry of
:mod:`dfedrw.peer.graph.topology`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import networkx as nx
import numpy as np

__all__ = [
    "CENTRAL_PLACEMENTS",
    "PLACEMENTS",
    "Topology",
    "centrality_of",
    "check_usable",
    "draw_connected",
    "complete",
    "erdos_renyi_connected",
    "place_by_centrality",
    "place_byzantine",
    "read_edgelist",
    "ring",
    "write_edgelist",
]

def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _honest_nodes(n: int, byzantine: Iterable[int]) -> list[int]:
    bad = set(byzantine)
    return [k for k in range(n) if k not in bad]


def _check_byzantine(n: int, byzantine: Iterable[int]) -> frozenset[int]:
    ids = frozenset(int(b) for b in byzantine)
    outside = sorted(b for b in ids if not 0 <= b < n)
    if outside:
        raise ValueError(f"Byzantine ids {outside} are outside the node range 0..{n - 1}")
    return ids


@dataclass(frozen=True)
class Topology:
    """An undirected communication graph on nodes ``0 .. n-1`` and the Byzantine node ids.

    ``centrality``: for Byzantine clients placed by :func:`place_by_centrality`, each one's
    centrality under the placement's measure, most central first (least central first for
    ``"leaf"``); empty when they were placed at random. Derived from the graph, so left out of
    equality.
    """

    graph: nx.Graph
    byzantine: frozenset[int]
    centrality: Mapping[int, float] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        n = self.graph.number_of_nodes()
        if set(self.graph.nodes) != set(range(n)):
            raise ValueError(f"graph nodes must be exactly 0..{n - 1}, got {sorted(self.graph.nodes)}")
        _check_byzantine(n, self.byzantine)
        if self.centrality and set(self.centrality) != set(self.byzantine):
            raise ValueError(
                f"centrality is given for nodes {sorted(self.centrality)}, not for the Byzantine nodes {sorted(self.byzantine)}"
            )

    @property
    def num_clients(self) -> int:
        """Number of nodes, honest and Byzantine."""
        return self.graph.number_of_nodes()

    def neighbours(self, k: int) -> tuple[int, ...]:
        """Sorted neighbour ids of node ``k``."""
        if k not in self.graph:
            raise ValueError(f"node {k!r} is not in the topology; valid ids: 0..{self.num_clients - 1}")
        return tuple(sorted(int(j) for j in self.graph.neighbors(k)))

    def honest(self) -> tuple[int, ...]:
        """Sorted ids of the honest (non-Byzantine) nodes."""
        return tuple(_honest_nodes(self.num_clients, self.byzantine))

    def is_byzantine(self, k: int) -> bool:
        """Whether node ``k`` is Byzantine."""
        return k in self.byzantine


def place_byzantine(num_clients: int, num_byzantine: int, seed: int) -> frozenset[int]:
    """Choose ``num_byzantine`` of ``range(num_clients)`` uniformly without replacement.

    At least one client must stay honest. Deterministic for the same arguments.
    """
    num_clients = _check_count("num_clients", num_clients, 1)
    num_byzantine = _check_count("num_byzantine", num_byzantine, 0)
    if num_byzantine >= num_clients:
        raise ValueError(
            f"num_byzantine={num_byzantine} leaves no honest client among num_clients={num_clients}; "
            f"valid range: 0..{num_clients - 1}"
        )
    rng = np.random.default_rng(seed)
    return frozenset(int(b) for b in rng.choice(num_clients, size=num_byzantine, replace=False))


PLACEMENTS = ("random", "degree", "betweenness", "eigenvector", "leaf")
"""Where Byzantine clients sit (``topology.placement``): ``"random"`` (:func:`place_byzantine`,
before the graph is drawn) or one of :data:`CENTRAL_PLACEMENTS`."""

CENTRAL_PLACEMENTS = PLACEMENTS[1:]
"""The placements :func:`place_by_centrality` makes on a drawn graph."""

# Exact betweenness costs O(nodes * edges) and a dense eigendecomposition O(nodes ** 3): on
# larger graphs betweenness is estimated from this many seeded source nodes, and eigenvector
# centrality found by power iteration.
EXACT_CENTRALITY_NODES = 2048

# Centralities are sums of floats, whose last bits differ between nodes that a symmetry of the
# graph makes equal (and between machines): values closer than this count as tied.
_TIE = 1e-9


def _measure_of(placement: str) -> str:
    return "degree" if placement == "leaf" else placement


def _eigenvector_centrality(graph: nx.Graph) -> dict[int, float]:
    nodes = sorted(graph.nodes)
    if len(nodes) > EXACT_CENTRALITY_NODES:
        try:
            return nx.eigenvector_centrality(graph, max_iter=100_000, tol=1e-10)
        except nx.PowerIterationFailedConvergence:
            raise ValueError(
                f"eigenvector centrality did not converge on this graph of {len(nodes)} nodes; use another topology.placement"
            ) from None
    adjacency = nx.to_numpy_array(graph, nodelist=nodes)
    # eigh sorts eigenvalues ascending: the last vector is the Perron vector (one sign, which
    # numerics may flip as a whole) of a connected graph.
    vector = np.abs(np.linalg.eigh(adjacency)[1][:, -1])
    return {k: float(v) for k, v in zip(nodes, vector / np.linalg.norm(vector))}


def centrality_of(graph: nx.Graph, measure: str, seed: int) -> dict[int, float]:
    """Every node's ``measure`` centrality, as networkx defines it.

    ``"degree"``: degree / (n - 1). ``"betweenness"``: the normalised share of shortest paths
    through the node (Brandes; above :data:`EXACT_CENTRALITY_NODES` nodes estimated from that
    many source nodes drawn with ``seed``). ``"eigenvector"``: the node's entry in the leading
    eigenvector of the adjacency matrix, of unit Euclidean norm (dense eigendecomposition,
    above :data:`EXACT_CENTRALITY_NODES` nodes power iteration). ``graph`` must be connected.
    """
    if measure == "degree":
        return {int(k): float(v) for k, v in nx.degree_centrality(graph).items()}
    if measure == "betweenness":
        sampled = graph.number_of_nodes() > EXACT_CENTRALITY_NODES
        values = nx.betweenness_centrality(graph, k=EXACT_CENTRALITY_NODES if sampled else None, seed=seed if sampled else None)
        return {int(k): float(v) for k, v in values.items()}
    if measure == "eigenvector":
        return _eigenvector_centrality(graph)
    raise ValueError(f"unknown centrality {measure!r}; valid choices: degree, betweenness, eigenvector")


def _tie_ranks(values: Mapping[int, float]) -> dict[int, int]:
    """Each node's rank by value, 0 the smallest; a value within :data:`_TIE` of the next
    smaller one shares its rank."""
    ranks: dict[int, int] = {}
    rank, last = -1, None
    for node, value in sorted(values.items(), key=lambda item: item[1]):
        if last is None or value - last > _TIE:
            rank += 1
        ranks[node] = rank
        last = value
    return ranks


def place_by_centrality(graph: nx.Graph, num_byzantine: int, placement: str, seed: int) -> tuple[tuple[int, ...], dict[int, float]]:
    """The ``num_byzantine`` Byzantine ids that ``placement`` picks on ``graph`` (connected,
    nodes ``0 .. n-1``), in the order picked, and each one's centrality.

    ``"degree"``, ``"betweenness"``, ``"eigenvector"``: the most central nodes by that
    centrality (:func:`centrality_of`), most central first. ``"leaf"``: the least central by
    degree, ties broken by the lower betweenness; its centralities are the degree ones. Nodes
    still tied (values within 1e-9) are taken by id, lowest first, so the choice is
    deterministic; ``seed`` only draws the source nodes of an estimated betweenness. At least
    one node stays honest. Whether the honest nodes stay connected is the caller's to check.
    """
    if placement not in CENTRAL_PLACEMENTS:
        raise ValueError(
            f"placement {placement!r} is not a centrality placement; valid choices: {', '.join(CENTRAL_PLACEMENTS)} "
            "('random' is place_byzantine's, made before the graph is drawn)"
        )
    n = graph.number_of_nodes()
    num_byzantine = _check_count("num_byzantine", num_byzantine, 0)
    if num_byzantine >= n:
        raise ValueError(f"num_byzantine={num_byzantine} leaves no honest node among {n}; valid range: 0..{n - 1}")
    if num_byzantine == 0:
        return (), {}
    if not nx.is_connected(graph):
        raise ValueError(f"placement {placement!r}: the graph is not connected, so its centralities say little")
    values = centrality_of(graph, _measure_of(placement), seed)
    if placement == "leaf":
        between = _tie_ranks(centrality_of(graph, "betweenness", seed))
        order = sorted(values, key=lambda k: (graph.degree(k), between[k], k))
    else:
        ranks = _tie_ranks(values)
        order = sorted(values, key=lambda k: (-ranks[k], k))
    chosen = tuple(order[:num_byzantine])
    return chosen, {k: values[k] for k in chosen}


def _honest_connected(graph: nx.Graph, byzantine: Iterable[int]) -> bool:
    honest = _honest_nodes(graph.number_of_nodes(), byzantine)
    return bool(honest) and nx.is_connected(graph.subgraph(honest))


def erdos_renyi_connected(
    n: int, rho: float, byzantine: frozenset[int], seed: int, max_tries: int = 10000
) -> nx.Graph:
    """Draw G(n, rho) until it is connected and its honest subgraph is connected.

    Each try uses ``networkx.gnp_random_graph`` with a seed taken from a generator seeded by
    ``seed``, so the result depends only on the arguments. Raises ValueError after
    ``max_tries`` failed draws.
    """
    n = _check_count("n", n, 1)
    max_tries = _check_count("max_tries", max_tries, 1)
    if not 0 < rho <= 1:
        raise ValueError(f"rho must lie in (0, 1], got {rho!r}")
    byzantine = _check_byzantine(n, byzantine)
    if len(byzantine) == n:
        raise ValueError(f"all {n} nodes are Byzantine; an honest subgraph needs at least one honest node")
    graph = draw_connected(lambda s: nx.gnp_random_graph(n, rho, seed=s), byzantine, seed, max_tries)
    if graph is None:
        raise ValueError(
            f"no connected Erdos-Renyi graph with a connected honest subgraph in {max_tries} draws "
            f"(n={n}, rho={rho}, {len(byzantine)} Byzantine); raise rho or max_tries"
        )
    return graph


def draw_connected(draw: Callable[[int], nx.Graph], byzantine: Iterable[int], seed: int, max_tries: int) -> nx.Graph | None:
    """``draw(s)`` with seeds ``s`` taken in turn from a generator seeded by ``seed``, until a
    graph and its honest subgraph (without ``byzantine``) are connected; None after ``max_tries``."""
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        graph = draw(int(rng.integers(2**32)))
        if nx.is_connected(graph) and _honest_connected(graph, byzantine):
            return graph
    return None


def ring(n: int) -> nx.Graph:
    """Cycle on ``n >= 2`` nodes (for n = 2 a single edge)."""
    # cycle_graph(1) would give a self loop, which is no neighbour.
    return nx.cycle_graph(_check_count("n", n, 2))


def complete(n: int) -> nx.Graph:
    """Complete graph on ``n >= 1`` nodes."""
    return nx.complete_graph(_check_count("n", n, 1))


def read_edgelist(path: str | os.PathLike, n: int) -> nx.Graph:
    """Read an undirected graph on nodes ``0 .. n-1`` from lines ``"u v"``.

    ``#`` starts a comment; blank lines are skipped; repeated edges collapse. Node ids out
    of range, self loops and malformed lines raise ValueError naming ``path:line``; so does
    a file that cannot be opened (one line naming the path). Nodes
    that appear in no edge are still in the graph.
    """
    n = _check_count("n", n, 1)
    path = Path(path)
    try:
        handle = open(path, encoding="utf-8")
    except OSError as exc:
        # The scenario only names the file; a missing one is bad input, not a crash.
        raise ValueError(f"topology.file: cannot read edge list {str(path)!r}: {exc.strerror}") from None
    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    with handle:
        for lineno, line in enumerate(handle, start=1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            where = f"{path}:{lineno}"
            fields = text.split()
            if len(fields) != 2:
                raise ValueError(f"{where}: expected two node ids 'u v', got {text!r}")
            try:
                u, v = int(fields[0]), int(fields[1])
            except ValueError:
                raise ValueError(f"{where}: node ids must be integers, got {text!r}") from None
            for node in (u, v):
                if not 0 <= node < n:
                    raise ValueError(f"{where}: node id {node} is outside 0..{n - 1}")
            if u == v:
                raise ValueError(f"{where}: self loop on node {u} is not allowed")
            graph.add_edge(u, v)
    return graph


def write_edgelist(graph: nx.Graph, path: str | os.PathLike) -> None:
    """Write ``graph`` as sorted ``"u v"`` lines (u < v) readable by :func:`read_edgelist`."""
    edges = sorted(tuple(sorted((int(u), int(v)))) for u, v in graph.edges)
    lines = [f"# {graph.number_of_nodes()} nodes, {len(edges)} edges"]
    lines += [f"{u} {v}" for u, v in edges]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def check_usable(graph: nx.Graph, byzantine: frozenset[int], kind: str, *, require_honest_connected: bool) -> None:
    """Raise ValueError (naming ``kind``) unless ``graph`` is connected, every honest node has a
    neighbour and, when required, the honest subgraph is connected."""
    if not nx.is_connected(graph):
        raise ValueError(f"{kind} topology: the graph is not connected")
    if require_honest_connected and not _honest_connected(graph, byzantine):
        raise ValueError(
            f"{kind} topology: the honest subgraph (without Byzantine nodes {sorted(byzantine)}) is not connected"
        )
    lonely = [k for k in _honest_nodes(graph.number_of_nodes(), byzantine) if graph.degree(k) == 0]
    if lonely:
        raise ValueError(f"{kind} topology: honest clients {lonely} have no neighbour")
