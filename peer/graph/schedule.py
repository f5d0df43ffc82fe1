"""Topologies that change from round to round (``topology.schedule``): one registry of schedules,
and :class:`RoundGraphs`, who sends to whom in a round, for fixed graphs and schedules alike.

A schedule is a class registered in :data:`SCHEDULE_REGISTRY` (or named by import path
``"module:Class"``, or a plugin of the ``dfedrw.schedules`` entry-point group) whose method
``graph_at(round)`` returns the round's graph on the nodes ``0 .. num_clients - 1``: a
``networkx.Graph`` (every edge carries a model both ways) or a ``networkx.DiGraph`` (an edge
``u -> v``: ``u`` sends to ``v``). Its settings (``[topology.schedule_params.NAME]``) are its
constructor's keyword parameters; the running system supplies, to a constructor that takes them,
``num_clients``, ``byzantine`` (the Byzantine ids, placed once before any graph), the scenario's
``seed``, ``rho`` (``topology.rho``) and ``base`` (``topology.kind``'s graph, a ``networkx.Graph``).

``graph_at`` must be a pure function of the constructor's arguments and the round, so that every
client computes any round's graph alone. Optional on the class: ``possible_peers(k)``, whom ``k``
may exchange a model with in some round (default: all others; it bounds whom ``k`` accepts a
connection or message from before it knows the round), and the promises ``connected = True`` (every
round's graph is connected, weakly when directed) and ``honest_connected = True`` (so is its honest
subgraph), checked on every graph.

A message's sender must be one of the receiver's in-neighbours in the message's round; a Byzantine
client gets at most the edges the schedule gives it, however many clients it sends to."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import networkx as nx

from dfedrw.peer.registry import Registry, check_choice, check_int, check_real
from dfedrw.topologies import Topology, erdos_renyi_connected
from dfedrw.topologies.schedules import edges_up, epidemic_push, random_regular_connected, round_seed

__all__ = ["SCHEDULE_REGISTRY", "EdgeFailures", "EpidemicPush", "Redraw", "RoundGraphs", "build_schedule", "receive_window"]

SCHEDULE_WINDOW_FACTOR = 8


def receive_window(round_window: int, schedule: str) -> int:
    """How many rounds ahead of a receiver a message is buffered: ``network.round_window`` with a
    fixed graph (two neighbours are at most a round apart: each waits for the other),
    ``SCHEDULE_WINDOW_FACTOR`` times it under a schedule. There a client waits only for the round's
    senders, so a sender may run rounds ahead of a receiver it did not hear from lately (under
    ``epidemic`` a client that receives nothing does not wait at all); its message is kept until the
    receiver gets to that round. Only the round's in-neighbours fill these rounds (one message
    each), so what a receiver holds stays bounded."""
    return round_window * SCHEDULE_WINDOW_FACTOR if schedule else round_window

SCHEDULE_REGISTRY = Registry(
    "schedule", "dfedrw.schedules", required=("graph_at",), supplied=("num_clients", "byzantine", "seed", "rho", "base"),
    calls={"graph_at": ("round_",)},
)
"""The schedules by name; settings in a scenario's ``[topology.schedule_params.NAME]``."""


@SCHEDULE_REGISTRY.register("redraw")
@dataclass(frozen=True)
class Redraw:
    """A fresh random graph every ``every`` rounds, connected with a connected honest subgraph.

    ``graph = "random_regular"``: a random ``degree``-regular graph (every client, Byzantine ones
    too, has exactly ``degree`` neighbours); ``"erdos_renyi"``: G(N, rho) with ``topology.rho``.
    Each is re-drawn (up to ``max_tries`` draws) until it and its honest subgraph are connected,
    from a seed of (scenario seed, round // every) alone.

    Example::

        [topology]
        schedule = "redraw"
        [topology.schedule_params.redraw]
        graph = "random_regular"
        degree = 4
        every = 1
    """

    num_clients: int
    byzantine: frozenset[int]
    seed: int
    rho: float = 0.7
    graph: str = "random_regular"
    degree: int = 3
    every: int = 1
    max_tries: int = 10000

    connected = True
    honest_connected = True

    def __post_init__(self) -> None:
        check_choice("Redraw", "graph", self.graph, ("random_regular", "erdos_renyi"))
        check_int("Redraw", "every", self.every, minimum=1)
        check_int("Redraw", "max_tries", self.max_tries, minimum=1)
        check_int("Redraw", "degree", self.degree, minimum=1)
        if self.graph == "random_regular":
            n, d = self.num_clients, self.degree
            if d >= n or (n * d) % 2:
                raise ValueError(f"Redraw: degree={d} on {n} clients: a regular graph needs degree < {n} and clients x degree even")
            if d < 2 and n > 2:
                raise ValueError(f"Redraw: degree=1 on {n} clients is never connected; use degree >= 2")

    def graph_at(self, round_: int) -> nx.Graph:
        seed = round_seed(self.seed, f"redraw-{self.graph}", round_ // self.every)
        if self.graph == "random_regular":
            return random_regular_connected(self.num_clients, self.degree, self.byzantine, seed, self.max_tries)
        return erdos_renyi_connected(self.num_clients, self.rho, self.byzantine, seed, self.max_tries)


@SCHEDULE_REGISTRY.register("epidemic")
@dataclass(frozen=True)
class EpidemicPush:
    """Epidemic Learning (de Vos et al., NeurIPS 2023): each round every client sends to ``fanout`` peers drawn uniformly.

    A directed graph per round (``u -> v``: ``u`` sends its model to ``v``); a receiver
    aggregates its own model with those it got. Every client, Byzantine ones too, sends to
    exactly ``fanout`` peers; the number a client receives varies (mean ``fanout``), may be 0,
    and a round's graph need not be connected (the paper's EL-Oracle: the union over rounds
    mixes fast). Drawn from (scenario seed, round) alone."""

    num_clients: int
    seed: int
    fanout: int = 3

    directed = True

    def __post_init__(self) -> None:
        check_int("EpidemicPush", "fanout", self.fanout, minimum=1)
        if self.fanout >= self.num_clients:
            raise ValueError(f"EpidemicPush: fanout={self.fanout} needs more than {self.fanout} clients, got {self.num_clients}")

    def graph_at(self, round_: int) -> nx.DiGraph:
        return epidemic_push(self.num_clients, self.fanout, round_seed(self.seed, "epidemic", round_))


@SCHEDULE_REGISTRY.register("edge_failures")
@dataclass(frozen=True)
class EdgeFailures:
    """The scenario's graph (``topology.kind``) with each edge down independently with probability ``p`` each round.

    An edge that is down carries nothing either way in that round. Nothing is promised of a
    round's connectivity; a client only ever exchanges with its neighbours in the base graph.
    Drawn from (scenario seed, round) alone."""

    base: Any
    seed: int
    p: float = 0.1

    def __post_init__(self) -> None:
        check_real("EdgeFailures", "p", self.p, nonnegative=True)
        if not self.p < 1:
            raise ValueError(f"EdgeFailures: p must be < 1 (every edge down every round carries nothing), got {self.p!r}")

    def graph_at(self, round_: int) -> nx.Graph:
        return edges_up(self.base, self.p, round_seed(self.seed, "edge-failures", round_))

    def possible_peers(self, k: int) -> Iterable[int]:
        return self.base.neighbors(k)


def build_schedule(name: str, params: dict[str, Any] | None, topology: Topology, seed: int, rho: float) -> Any:
    """The schedule ``name`` with its settings, over ``topology`` (its graph is ``base``, its
    Byzantine ids ``byzantine``). Raises ``ValueError`` for an unknown name or a bad setting."""
    supplied = {"num_clients": topology.num_clients, "byzantine": topology.byzantine, "seed": seed, "rho": rho, "base": topology.graph}
    return SCHEDULE_REGISTRY.build(name, params, supplied)


# Rounds whose graphs a client keeps: those of the round window on either side, with room.
_CACHED_ROUNDS = 64


@dataclass(frozen=True)
class _Round:
    senders: dict[int, tuple[int, ...]]  # client -> who sends to it (sorted)
    receivers: dict[int, tuple[int, ...]]  # client -> whom it sends to (sorted)
    edges: int  # messages of the round (an undirected edge counts twice)


class RoundGraphs:
    """Who sends to whom in each round: ``topology``'s graph every round (``schedule`` None),
    or the schedule's graph of the round, checked (nodes, no self loop, declared promises) and
    kept for the last rounds asked. Safe to share between threads."""

    def __init__(self, topology: Topology, schedule: Any = None, name: str = "") -> None:
        self.topology = topology
        self.schedule = schedule
        self.name = name or (type(schedule).__name__ if schedule is not None else "")
        self.directed = bool(getattr(schedule, "directed", False))
        n = topology.num_clients
        self._fixed = {k: topology.neighbours(k) for k in range(n)} if schedule is None else None
        self._cache: OrderedDict[int, _Round] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def dynamic(self) -> bool:
        """Whether the graph changes from round to round (a schedule is set)."""
        return self.schedule is not None

    @property
    def num_clients(self) -> int:
        return self.topology.num_clients

    def possible(self, k: int) -> tuple[int, ...]:
        """Whom ``k`` may exchange a model with in some round, sorted (fixed: its neighbours)."""
        if self._fixed is not None:
            return self._fixed[k]
        peers = getattr(self.schedule, "possible_peers", None)
        found = range(self.num_clients) if peers is None else peers(k)
        return tuple(sorted(int(j) for j in found if int(j) != k))

    def senders_to(self, k: int, round_: int) -> tuple[int, ...]:
        """Whose round-``round_`` models client ``k`` receives (its in-neighbours), sorted."""
        if self._fixed is not None:
            return self._fixed[k]
        return self._round(round_).senders[k]

    def receivers_of(self, k: int, round_: int) -> tuple[int, ...]:
        """To whom client ``k`` sends its round-``round_`` model (its out-neighbours), sorted."""
        if self._fixed is not None:
            return self._fixed[k]
        return self._round(round_).receivers[k]

    def senders_at(self, k: int) -> Callable[[int], tuple[int, ...]]:
        """``round -> senders_to(k, round)``: what client ``k``'s intake checks a message against."""
        return lambda round_: self.senders_to(k, round_)

    def messages(self, round_: int) -> int:
        """How many models go from one client to another in ``round_`` (an undirected edge: 2)."""
        if self._fixed is not None:
            return 2 * self.topology.graph.number_of_edges()
        return self._round(round_).edges

    def mean_degree(self, rounds: int) -> float:
        """The mean number of models a client receives in a round, over ``rounds`` rounds."""
        if self._fixed is not None:
            return self.messages(0) / self.num_clients
        return sum(self.messages(r) for r in range(rounds)) / (rounds * self.num_clients)

    def graph(self, round_: int) -> nx.DiGraph:
        """The round's graph as a directed graph (an undirected edge both ways)."""
        g = nx.DiGraph()
        g.add_nodes_from(range(self.num_clients))
        g.add_edges_from((j, k) for k in range(self.num_clients) for j in self.senders_to(k, round_))
        return g

    def _round(self, round_: int) -> _Round:
        if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 0:
            raise ValueError(f"a round is an integer >= 0, got {round_!r}")
        with self._lock:
            found = self._cache.get(round_)
            if found is not None:
                self._cache.move_to_end(round_)
                return found
        made = self._draw(round_)
        with self._lock:
            self._cache[round_] = made
            while len(self._cache) > _CACHED_ROUNDS:
                self._cache.popitem(last=False)
        return made

    def _draw(self, round_: int) -> _Round:
        graph = self.schedule.graph_at(round_)
        check_round_graph(graph, self.topology, self.name, round_, self.schedule)
        n = self.num_clients
        if graph.is_directed():
            senders = {k: tuple(sorted(int(j) for j in graph.predecessors(k))) for k in range(n)}
            receivers = {k: tuple(sorted(int(j) for j in graph.successors(k))) for k in range(n)}
            edges = graph.number_of_edges()
        else:
            senders = {k: tuple(sorted(int(j) for j in graph.neighbors(k))) for k in range(n)}
            receivers = senders
            edges = 2 * graph.number_of_edges()
        allowed = {k: frozenset(self.possible(k)) for k in range(n)} if hasattr(self.schedule, "possible_peers") else None
        if allowed is not None:
            for k in range(n):
                outside = sorted(set(senders[k]) - allowed[k])
                if outside:
                    raise ValueError(f"schedule {self.name!r}, round {round_}: {outside} send to {k}, not among its possible_peers")
        return _Round(senders, receivers, edges)


def check_round_graph(graph: Any, topology: Topology, name: str, round_: int, schedule: Any) -> None:
    """Raise ValueError (naming the schedule and round) unless ``graph`` is a simple networkx
    graph on exactly the clients, without self loops, keeping the schedule's promises."""
    where = f"schedule {name!r}, round {round_}"
    if not isinstance(graph, nx.Graph) or graph.is_multigraph():
        raise ValueError(f"{where}: graph_at returned {type(graph).__name__}, not a networkx Graph or DiGraph")
    n = topology.num_clients
    if set(graph.nodes) != set(range(n)):
        raise ValueError(f"{where}: the graph's nodes must be exactly 0..{n - 1}")
    if any(u == v for u, v in graph.edges):
        raise ValueError(f"{where}: the graph has a self loop")
    if getattr(schedule, "connected", False):
        whole = graph.to_undirected(as_view=True) if graph.is_directed() else graph
        if not nx.is_connected(whole):
            raise ValueError(f"{where}: the graph is not connected, though the schedule promises it")
    if getattr(schedule, "honest_connected", False):
        honest = graph.subgraph(topology.honest())
        honest = honest.to_undirected(as_view=True) if honest.is_directed() else honest
        if not nx.is_connected(honest):
            raise ValueError(f"{where}: the honest subgraph is not connected, though the schedule promises it")
