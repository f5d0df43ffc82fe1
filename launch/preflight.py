"""Checks a launcher makes before starting any client: a bad setting fails once, clearly."""

from __future__ import annotations

from pathlib import Path

from dfedrw.peer.config.scenario import Scenario, ScenarioError
from dfedrw.peer.learning.datacache import provided, verify_stored
from dfedrw.peer.learning.device import engine_device
from dfedrw.peer.learning.datasets import check_available
from dfedrw.peer.wiring.assembly import client_attack, client_rule
from dfedrw.peer.graph.topology import Topology
from dfedrw.peer.wiring.memory import batched_needs, run_needs
from dfedrw.peer.wiring.plan import scenario_graphs, scenario_topology, told_byzantine
from dfedrw.peer.wiring.build import scenario_dataset, scenario_model_specs

# Where the memory the system can still give processes is read (Linux).
MEMINFO = Path("/proc/meminfo")


class NotEnoughMemory(ScenarioError):
    """The models a run's clients would hold do not fit the memory this machine has available."""


# What to change, by where the memory goes: client processes each hold an inbox of the round window.
_ADVICE = {
    "clients": "use fewer clients, a smaller model, fewer neighbours (topology.rho) or a smaller network.round_window",
    "batched": "use fewer clients, a smaller model or fewer neighbours (topology.rho)",
}


def preflight(scenario: Scenario, *, memory: bool = True) -> None:
    """Build each rule the clients' settings make (once per setting), every Byzantine client's
    attack, and check the data first, so a bad setting fails
    once, clearly, before any client starts; check that the device is here and (``memory``)
    that the run fits the memory available here (:func:`check_memory`); then build (or check, digests and all) the data set's
    entry in the machine's data cache, which every client maps."""
    engine_device(scenario.engine.device, resolve=False)  # a GPU named where there is none: one line, before any client starts
    topology = scenario_topology(scenario)
    # A schedule is built, and its first round drawn and checked, before any client starts.
    scenario_graphs(scenario, topology).senders_to(0, 0)
    built: set[tuple[object, int]] = set()
    for k in range(topology.num_clients):
        if k in topology.byzantine:
            client_attack(scenario, topology, k)
            continue
        # A rule is built from its client's settings and the Byzantine neighbours it is told
        # of: once for each that differ, not once per client (a thousand clients, one build).
        cfg = scenario.aggregation_for(k)
        key = (cfg, told_byzantine(cfg, topology, k))
        if key not in built:
            built.add(key)
            client_rule(scenario, topology, k)
    if memory:
        check_memory(scenario, topology=topology)
    source = scenario_dataset(scenario.data)
    if not provided(source):  # a node of a sweep on Ray given the driver's copy has no files
        check_available(source)
    verify_stored(source)


def available_memory(meminfo: Path | None = None) -> int | None:
    """Bytes the system can still give processes without swapping (``MemAvailable``), or None
    where it does not say."""
    try:
        for line in (meminfo or MEMINFO).read_text().splitlines():
            name, _, rest = line.partition(":")
            if name == "MemAvailable":
                value, unit = rest.split()
                return int(value) * (1024 if unit == "kB" else 1)
    except (OSError, ValueError):
        return None
    return None


def check_memory(scenario: Scenario, available: int | None = None, *, topology: Topology | None = None) -> None:
    """Refuse, in one line that gives the estimate, a run that would not fit in ``available``
    bytes (default: what /proc/meminfo says is available now): client processes by the bound
    of every client (:func:`~dfedrw.peer.wiring.memory.run_needs`), the batched engine by what
    its one process holds (:func:`~dfedrw.peer.wiring.memory.batched_needs`). ``topology``:
    the scenario's graph, where the caller has drawn it."""
    if scenario.engine.name == "batched":
        check_batch_memory([scenario], available, topologies=[topology])
        return
    available = available_memory() if available is None else available
    if available is None:
        return
    needs = run_needs(scenario, scenario_model_specs(scenario))
    if needs.total > available:
        raise NotEnoughMemory(f"{needs.describe()}; this machine has {available / 1e9:.1f} GB available: {_ADVICE['clients']}")


def check_batch_memory(scenarios: list[Scenario], available: int | None = None, *, topologies: list[Topology | None] | None = None) -> None:
    """:func:`check_memory` of runs of the batched engine that one process runs as one batch."""
    available = available_memory() if available is None else available
    if available is None:
        return
    needs = batched_needs(scenarios, [scenario_model_specs(s) for s in scenarios], topologies)
    if needs.total > available:
        more = " or a smaller batch (dfedrw sweep --batch)" if len(scenarios) > 1 else ""
        raise NotEnoughMemory(f"{needs.describe()}; this machine has {available / 1e9:.1f} GB available: {_ADVICE['batched']}{more}")
