"""Each honest client's rule and what it is told of the Byzantine clients it hears from.

A robust rule is told how many Byzantine neighbours it has (``num_byzantine``): on a fixed graph
a client's Byzantine neighbours, or ``aggregation.assumed_byzantine``, with one rule per client.
Under a schedule the neighbours change by round, so a client's rule of round ``r`` is the one
told the Byzantine clients among that round's senders: one rule per client and number told,
built when first needed with the client's seed and kept, so that a rule with state (a generator,
a reputation) is the same object in every round it is told that number. A client's final record
names the most it was told in a round (on a fixed graph, the one number). :class:`ToldRules`
holds them for a batch of clients: one client process's, or every honest client of a batched run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.graph.topology import Topology
from dfedrw.peer.round.records import aggregation_summary
from dfedrw.peer.wiring.assembly import client_rule
from dfedrw.peer.wiring.plan import told_byzantine

__all__ = ["ToldRules"]


class ToldRules:
    """The rules of ``clients`` (honest ids) in ``scenario`` over ``topology``: on a fixed graph
    ``fixed[k]``, client k's one rule, built here in the order of ``clients``; under a schedule
    (``dynamic``) :meth:`at` builds the rule of a round's senders when first needed."""

    def __init__(self, scenario: Scenario, topology: Topology, clients: Iterable[int], *, dynamic: bool = False) -> None:
        self.scenario, self.topology, self.dynamic = scenario, topology, dynamic
        clients = tuple(clients)
        self.fixed: dict[int, Any] = {} if dynamic else {k: client_rule(scenario, topology, k) for k in clients}
        self._by_told: dict[tuple[int, int], Any] = {}
        # Under a schedule: the most client k was told in a round so far.
        self.most: dict[int, int] = dict.fromkeys(clients, 0)

    def at(self, k: int, senders: tuple[int, ...]) -> tuple[Any, int | None]:
        """Client ``k``'s rule for candidates from ``senders`` and what it is told (None on a
        fixed graph: its one rule)."""
        if not self.dynamic:
            return self.fixed[k], None
        told = told_byzantine(self.scenario.aggregation_for(k), self.topology, k, senders)
        rule = self._by_told.get((k, told))
        if rule is None:
            rule = self._by_told[(k, told)] = client_rule(self.scenario, self.topology, k, senders)
        self.most[k] = max(self.most[k], told)
        return rule, told

    def told_in_all(self, k: int) -> int:
        """What client ``k``'s final record says its rule was told: under a schedule the most
        in a round, else its one number."""
        if self.dynamic:
            return self.most[k]
        return told_byzantine(self.scenario.aggregation_for(k), self.topology, k)

    def summary(self, k: int) -> dict[str, Any]:
        """What client ``k``'s final file says of its rule (:func:`aggregation_summary`)."""
        return aggregation_summary(self.scenario.aggregation_for(k), self.told_in_all(k))
