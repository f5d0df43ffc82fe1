"""What a client process holds: the bound on its models, in bytes, and what a run needs.

With ``M`` the bytes of one model (4 per parameter), ``W`` the rounds a message may be ahead
of its receiver (``network.round_window``; under a schedule the receive window,
:func:`~dfedrw.peer.graph.schedule.receive_window`), ``d`` the client's neighbours (under a schedule
every client it may exchange models with) and ``t`` the honest neighbours a Byzantine client
sends to, a client holds at most

* honest: ``M * ((W + 1) * d + 5)``: one received model per neighbour and round of the window
  (the inbox refuses one more: ``inbox_full``), its parameters (which after its local step are
  the model it sends), its model of the round before (still in flight to a slow neighbour; the
  sender gives up one two rounds old), its model at the start of the round (the rule's
  reference), the copy of its own model in the round's candidate matrix, and the aggregate
  (with ``train.momentum``, its momentum buffer too: ``+ 1``);
* Byzantine: ``M * ((W + 1) * d + 2 * t + 2)``: the received models likewise, a crafted
  message per receiver of this round and of the one before (one in flight and one queued per
  receiver), and a float64 mean of what it received (sign flipping's; the Gaussian attack
  takes its centre a block of coordinates at a time); colluding, also its colluders' pools
  of the window, each of at most one model per client: ``M * (W + 1) * (c - 1) * n``;

plus a baseline :data:`CLIENT_BASELINE` for the interpreter, torch, gRPC and its shard of the
data. That is so for the rules and attacks that work on the candidates as they are, a block of
coordinates at a time (DFedAvg, the Gaussian attack: :mod:`~dfedrw.peer.aggregation.columns`);
a rule or an attack that makes copies of its own (a sort, a distance matrix, float64 rows) holds
those besides. :func:`run_needs` adds the launcher and the fork server: the launcher refuses a
run that needs more than the machine has available (:mod:`dfedrw.launch.preflight`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.wiring.plan import colluding_group, scenario_graphs, scenario_topology
from dfedrw.peer.graph.schedule import receive_window
from dfedrw.peer.transport.serde import TensorSpec

# Unique memory (PSS) of a client process besides its models: the interpreter, torch, numpy,
# gRPC and zmq, its shard of the data and the test sets. Measured: 150 MB for a client of the
# softmax regression on Fashion-MNIST started as a fresh interpreter (bench/startup.py, spawn;
# forked from the fork server it shares most of that: 66 MB), rounded up.
CLIENT_BASELINE = 160 * 10**6
# The launcher and the fork server together (each about 250 MB, bench/memory_at_size.py).
LAUNCHER_BASELINE = 600 * 10**6

# Working copies besides received models: honest (parameters, last round's model in flight,
# reference, the own model's row, the aggregate), Byzantine (a float64 mean: two models).
HONEST_WORK = 5
BYZANTINE_WORK = 2


@dataclass(frozen=True)
class Held:
    """The models one client holds at most, by what holds them; :attr:`models` in all."""

    client: int
    role: str
    received: int  # (W + 1) * d: the inbox's capacity
    sending: int  # Byzantine: 2 * t; honest: counted in work
    work: int
    pools: int = 0

    @property
    def models(self) -> int:
        return self.received + self.sending + self.work + self.pools

    def formula(self, window: int, neighbours: int, targets: int) -> str:
        if self.role == "honest":
            return f"({window} + 1) x {neighbours} + {self.work}"
        text = f"({window} + 1) x {neighbours} + 2 x {targets} + {BYZANTINE_WORK}"
        return text + (f" + {self.pools} pooled" if self.pools else "")


def model_bytes(specs: tuple[TensorSpec, ...]) -> int:
    return sum(s.nbytes for s in specs)


def held_models(scenario: Scenario) -> list[Held]:
    """The bound of every client of ``scenario``, in models (see the module)."""
    topology = scenario_topology(scenario)
    graphs = scenario_graphs(scenario, topology)
    window = receive_window(scenario.network.round_window, scenario.topology.schedule)
    colluders = colluding_group(topology.byzantine, scenario.attack.colluding)
    out = []
    for k in range(topology.num_clients):
        neighbours = graphs.possible(k)
        received = (window + 1) * len(neighbours)
        if k in topology.byzantine:
            targets = sum(1 for j in neighbours if j not in topology.byzantine)
            pools = (window + 1) * (len(colluders) - 1) * topology.num_clients if k in colluders else 0
            out.append(Held(k, "byzantine", received, 2 * targets, BYZANTINE_WORK, pools))
        else:
            # With momentum the trainer keeps its buffer: one model more.
            out.append(Held(k, "honest", received, 0, HONEST_WORK + (1 if scenario.train.momentum else 0)))
    return out


@dataclass(frozen=True)
class RunNeeds:
    """What a run of client processes needs: :attr:`total` bytes, from :attr:`held` (each
    client's bound) and the model's size."""

    model: int
    held: list[Held]
    window: int
    degrees: dict[int, tuple[int, int]]  # client -> (neighbours, honest neighbours)

    def client_bytes(self, held: Held) -> int:
        return held.models * self.model + CLIENT_BASELINE

    @property
    def total(self) -> int:
        return sum(self.client_bytes(h) for h in self.held) + LAUNCHER_BASELINE

    def largest(self) -> Held:
        return max(self.held, key=lambda h: h.models)

    def describe(self) -> str:
        """One line: the estimate and where it comes from."""
        big = self.largest()
        d, t = self.degrees[big.client]
        models = sum(h.models for h in self.held)
        return (
            f"this run needs about {_gb(self.total)} ({len(self.held)} clients, model {self.model / 1e6:.1f} MB: "
            f"{models} models held in all, at most {big.models} by client {big.client} ({big.formula(self.window, d, t)}), "
            f"plus {CLIENT_BASELINE / 1e6:.0f} MB a client and {LAUNCHER_BASELINE / 1e6:.0f} MB for the launcher)"
        )


def run_needs(scenario: Scenario, specs: tuple[TensorSpec, ...]) -> RunNeeds:
    topology = scenario_topology(scenario)
    graphs = scenario_graphs(scenario, topology)
    degrees = {
        k: (len(graphs.possible(k)), sum(1 for j in graphs.possible(k) if j not in topology.byzantine)) for k in range(topology.num_clients)
    }
    window = receive_window(scenario.network.round_window, scenario.topology.schedule)
    return RunNeeds(model_bytes(specs), held_models(scenario), window, degrees)


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"
