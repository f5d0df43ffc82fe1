"""The communication graphs a scenario can name (``topology.kind``): one registry of builders.

A topology is a builder registered in :data:`TOPOLOGY_REGISTRY` (or named by import path
``"module:function"``, or a plugin of the ``dfedrw.topologies`` entry-point group): a function that
returns a ``networkx.Graph`` on the nodes ``0 .. num_clients - 1``. Its settings
(``[topology.NAME]`` in a scenario) are its keyword parameters; the running system supplies, to a
builder that takes them, ``num_clients``, ``byzantine`` (the Byzantine ids, a frozenset, placed
before the graph is drawn; empty when ``topology.placement`` places them by centrality on the drawn
graph), the scenario's ``seed``, ``rho`` (``topology.rho``) and ``file`` (``topology.file``).

Every graph must be connected and give every honest client a neighbour; a builder with the attribute
``honest_connected = True`` is held to a connected honest subgraph as well. The graph is a pure
function of these arguments, so every client computes the same one."""

from __future__ import annotations

import os
from typing import Any

import networkx as nx

from dfedrw.peer.quote import shown
from dfedrw.peer.registry import Registry
from dfedrw.topologies import (
    PLACEMENTS, Topology, check_usable, complete, erdos_renyi_connected, place_by_centrality, place_byzantine, read_edgelist, ring,
)

__all__ = ["TOPOLOGY_REGISTRY", "build_topology", "complete_graph", "edgelist", "erdos_renyi", "ring_graph"]

TOPOLOGY_REGISTRY = Registry(
    "topology", "dfedrw.topologies", required=(), supplied=("num_clients", "byzantine", "seed", "rho", "file"), functions=True
)
"""The topologies by name; settings in a scenario's ``[topology.NAME]``."""


@TOPOLOGY_REGISTRY.register("erdos_renyi")
def erdos_renyi(num_clients: int, byzantine: frozenset[int], seed: int, rho: float) -> nx.Graph:
    """Erdos-Renyi G(N, rho), re-drawn until it and its honest subgraph are connected.

    ``rho`` is ``topology.rho`` (the paper's setting: 0.7)."""
    return erdos_renyi_connected(num_clients, rho, byzantine, seed)


erdos_renyi.honest_connected = True  # type: ignore[attr-defined]


@TOPOLOGY_REGISTRY.register("ring")
def ring_graph(num_clients: int) -> nx.Graph:
    """A cycle. Byzantine nodes on it may cut the honest clients apart (a legitimate experiment)."""
    return ring(num_clients)


@TOPOLOGY_REGISTRY.register("complete")
def complete_graph(num_clients: int) -> nx.Graph:
    """Every client a neighbour of every other."""
    return complete(num_clients)


@TOPOLOGY_REGISTRY.register("edgelist")
def edgelist(num_clients: int, file: str) -> nx.Graph:
    """The graph of an edge-list file (``topology.file``: lines ``u v``, ``#`` comments)."""
    if not file:
        raise ValueError("topology kind 'edgelist' needs a file; set topology.file to an edge-list path")
    return read_edgelist(file, num_clients)


edgelist.honest_connected = True  # type: ignore[attr-defined]


def build_topology(
    kind: str,
    num_honest: int,
    num_byzantine: int,
    seed: int,
    rho: float = 0.7,
    file: str | os.PathLike | None = None,
    params: dict[str, Any] | None = None,
    placement: str = "random",
) -> Topology:
    """The topology ``kind`` on ``num_honest + num_byzantine`` nodes.

    ``placement="random"``: Byzantine ids come from :func:`~dfedrw.topologies.place_byzantine` with
    ``seed``; then the builder draws the graph. Any other of :data:`~dfedrw.topologies.PLACEMENTS`:
    the builder draws a graph with no Byzantine ids known, then
    :func:`~dfedrw.topologies.place_by_centrality` picks them on it. Raises ``ValueError`` for an
    unknown kind or placement, a bad setting, a ``file`` given to a kind that reads none, a
    placement that cuts the honest clients apart, or a graph that is not usable (see the module)."""
    for name, value, minimum in (("num_honest", num_honest, 1), ("num_byzantine", num_byzantine, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    n = num_honest + num_byzantine
    if n < 2:
        raise ValueError(f"a topology needs at least 2 clients so each has a neighbour, got {n}")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {shown(placement)}; valid choices: {', '.join(PLACEMENTS)}")
    builder = TOPOLOGY_REGISTRY.resolve(kind)
    if file and not TOPOLOGY_REGISTRY.takes(kind, "file"):
        raise ValueError(f"file={shown(str(file))} is only used by a topology that reads a file (edgelist), not {shown(kind)}")
    byzantine = place_byzantine(n, num_byzantine, seed) if placement == "random" else frozenset()
    supplied = {"num_clients": n, "byzantine": byzantine, "seed": seed, "rho": rho, "file": str(file) if file else ""}
    graph = TOPOLOGY_REGISTRY.build(kind, params, supplied)
    if not isinstance(graph, nx.Graph) or graph.is_directed() or graph.is_multigraph():
        raise ValueError(f"topology {kind!r}: the builder returned {type(graph).__name__}, not an undirected networkx.Graph")
    if set(graph.nodes) != set(range(n)):
        raise ValueError(f"topology {kind!r}: the graph's nodes must be exactly 0..{n - 1}")
    if any(u == v for u, v in graph.edges):
        raise ValueError(f"topology {kind!r}: the graph has a self loop")
    centrality: dict[int, float] = {}
    if placement != "random":
        check_usable(graph, byzantine, kind, require_honest_connected=False)
        chosen, centrality = place_by_centrality(graph, num_byzantine, placement, seed)
        byzantine = frozenset(chosen)
        _check_placement_keeps_honest_connected(graph, chosen, placement, kind)
    check_usable(graph, byzantine, kind, require_honest_connected=bool(getattr(builder, "honest_connected", False)))
    return Topology(graph=graph, byzantine=byzantine, centrality=centrality)


def _check_placement_keeps_honest_connected(graph: nx.Graph, chosen: tuple[int, ...], placement: str, kind: str) -> None:
    honest = [k for k in graph.nodes if k not in set(chosen)]
    if nx.is_connected(graph.subgraph(honest)):
        return
    which = "least central clients by degree" if placement == "leaf" else f"most central clients by {placement} centrality"
    raise ValueError(
        f"topology.placement={placement!r} cannot place {len(chosen)} Byzantine clients on this {kind} graph: "
        f"the {len(chosen)} {which}, {list(chosen)}, disconnect the honest clients once removed; "
        "try another placement, fewer Byzantine clients (topology.byzantine) or a denser graph"
    )
