"""Checks a launcher makes before starting any client: a bad setting fails once, clearly."""

from __future__ import annotations

from dfedrw.peer.config import Scenario
from dfedrw.peer.datacache import verify_stored
from dfedrw.peer.datasets import check_available, scenario_dataset
from dfedrw.peer.assembly import client_attack, client_rule
from dfedrw.peer.plan import scenario_graphs, scenario_topology


def preflight(scenario: Scenario) -> None:
    """Build every client's rule or attack and check the data first, so a bad setting fails
    once, clearly, before any client starts; then build (or check, digests and all) the data
    set's entry in the machine's data cache, which every client maps."""
    topology = scenario_topology(scenario)
    # A schedule is built, and its first round drawn and checked, before any client starts.
    scenario_graphs(scenario, topology).senders_to(0, 0)
    for k in range(topology.num_clients):
        if k in topology.byzantine:
            client_attack(scenario, topology, k)
        else:
            client_rule(scenario, topology, k)
    source = scenario_dataset(scenario.data)
    check_available(source)
    verify_stored(source)
