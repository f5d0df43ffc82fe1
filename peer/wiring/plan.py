"""What a scenario says about its clients, without building any of them: the graph, who is
Byzantine, each client's role and seeds, the model layout per dataset. Light on purpose: it
imports neither torch nor gRPC, so the launchers that only plan a run (docker-compose files, the
summary) stay light. :mod:`peer.client.client` builds clients from it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from dfedrw.topologies import Topology

if TYPE_CHECKING:
    from dfedrw.peer.config.scenario import AggregationConfig, Scenario
    from dfedrw.peer.graph.schedule import RoundGraphs


def dataset_shape(scenario: Scenario) -> tuple[int, int]:
    """(features, classes) of the scenario's data set, as it declares them: what a client (a
    Byzantine one holds no data) knows of the model layout without loading anything."""
    from dfedrw.peer.learning.datasets import dataset_of

    d = scenario.data
    source = dataset_of(d.name, d.params, d.dir)
    return int(source.num_features), int(source.num_classes)


def dataset_input_shape(scenario: Scenario) -> tuple[int, ...]:
    """One sample's shape as the scenario's data set declares it (``(channels, height, width)``
    for images; ``(features,)`` where it declares none): what a model gets as ``input_shape``."""
    from dfedrw.peer.learning.datasets import dataset_of, input_shape_of

    d = scenario.data
    return input_shape_of(dataset_of(d.name, d.params, d.dir))

def role_of(topology: Topology, client: int) -> str:
    """"byzantine" or "honest"."""
    return "byzantine" if client in topology.byzantine else "honest"


def derive_seed(seed: int, *keys: int | str) -> int:
    """An independent, reproducible seed for one purpose of one client."""
    words = [k if isinstance(k, int) else int.from_bytes(k.encode()[:8].ljust(8, b"\0"), "little") for k in keys]
    return int(np.random.SeedSequence([seed, *words]).generate_state(1, dtype=np.uint32)[0])


def scenario_topology(scenario: Scenario) -> Topology:
    from dfedrw.peer.registry import settings_of
    from dfedrw.peer.graph.topology import build_topology

    t = scenario.topology
    return build_topology(
        t.kind, t.honest, t.byzantine, scenario.seed, rho=t.rho, file=t.file or None, params=settings_of(t.params, t.kind),
        placement=t.placement,
    )


def scenario_graphs(scenario: Scenario, topology: Topology | None = None) -> RoundGraphs:
    """Who sends to whom in each round: the scenario's graph, or the ``topology.schedule`` graph of
    the round, over ``topology`` (base graph and Byzantine placement; given or built here)."""
    from dfedrw.peer.registry import settings_of
    from dfedrw.peer.graph.schedule import RoundGraphs, build_schedule

    topology = scenario_topology(scenario) if topology is None else topology
    t = scenario.topology
    if not t.schedule:
        return RoundGraphs(topology)
    schedule = build_schedule(t.schedule, settings_of(t.schedule_params, t.schedule), topology, scenario.seed, t.rho)
    return RoundGraphs(topology, schedule, t.schedule)


def told_byzantine(cfg: AggregationConfig, topology: Topology, client: int, senders: tuple[int, ...] | None = None) -> int:
    """How many Byzantine neighbours a robust rule at ``client`` is told it has: those among
    ``senders`` (the round's in-neighbours under a schedule; default: its neighbours in the
    graph), unless ``aggregation.assumed_byzantine`` says."""
    if cfg.assumed_byzantine >= 0:
        return cfg.assumed_byzantine
    among = topology.neighbours(client) if senders is None else senders
    return sum(1 for k in among if k in topology.byzantine)


def colluding_group(byzantine: Iterable[int], colluding: bool) -> tuple[int, ...]:
    """The colluders of a run: every Byzantine client, sorted, when ``attack.colluding``; else ()."""
    return tuple(sorted(byzantine)) if colluding else ()
