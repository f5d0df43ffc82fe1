"""Seeded graph builders, Byzantine placement and edge-list io."""

from topologies.graphs import (
    TOPOLOGY_KINDS,
    Topology,
    build_topology,
    complete,
    erdos_renyi_connected,
    place_byzantine,
    read_edgelist,
    ring,
    write_edgelist,
)

__all__ = [
    "TOPOLOGY_KINDS",
    "Topology",
    "build_topology",
    "complete",
    "erdos_renyi_connected",
    "place_byzantine",
    "read_edgelist",
    "ring",
    "write_edgelist",
]
