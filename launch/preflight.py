"""Checks a launcher makes before starting any client: a bad setting fails once, clearly."""

from __future__ import annotations

from dfedrw.peer.config import Scenario
from dfedrw.peer.data import check_dataset
from dfedrw.peer.node import client_rule
from dfedrw.peer.plan import scenario_topology
from dfedrw.peer.plugins import build_attack


def preflight(scenario: Scenario) -> None:
    """Build every client's rule or attack and check the data first, so a bad setting fails
    once, clearly, before any client starts."""
    topology = scenario_topology(scenario)
    for k in range(topology.num_clients):
        if k in topology.byzantine:
            build_attack(scenario, topology.num_clients, len(topology.byzantine))
        else:
            client_rule(scenario, topology, k)
    check_dataset(scenario.data.name, scenario.data.dir or None)
