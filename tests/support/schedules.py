"""Schedules of a user's own, named by import path in tests (``tests.support.schedules:Rotating``)."""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx


@dataclass(frozen=True)
class Rotating:
    """Round r: client k sends to client (k + 1 + r mod (N - 1)) mod N (a directed cycle-like graph)."""

    num_clients: int
    step: int = 1

    directed = True

    def graph_at(self, round_: int) -> nx.DiGraph:
        n = self.num_clients
        shift = 1 + (round_ * self.step) % (n - 1)
        graph = nx.DiGraph()
        graph.add_nodes_from(range(n))
        graph.add_edges_from((k, (k + shift) % n) for k in range(n))
        return graph


@dataclass(frozen=True)
class BrokenPromise:
    """Promises a connected graph, gives an empty one from round ``from_round`` on."""

    num_clients: int
    from_round: int = 1

    connected = True

    def graph_at(self, round_: int) -> nx.Graph:
        graph = nx.complete_graph(self.num_clients) if round_ < self.from_round else nx.empty_graph(self.num_clients)
        return graph


@dataclass(frozen=True)
class OutsideItsPeers:
    """Says client 0 only ever meets client 1, then makes it hear from everyone."""

    num_clients: int

    def graph_at(self, round_: int) -> nx.Graph:
        return nx.complete_graph(self.num_clients)

    def possible_peers(self, k: int):
        if k == 0:
            return [1]
        return [j for j in range(self.num_clients) if j != k]
