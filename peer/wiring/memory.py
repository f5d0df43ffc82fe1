"""What a client process holds: the bound on its models, in bytes, and what a run needs.

With ``M`` the bytes of one model (4 per parameter), ``W`` the rounds a message may be ahead
of its receiver (``network.round_window``; under a schedule the receive window,
:func:`~dfedrw.peer.graph.schedule.receive_window`), ``d`` the client's neighbours (under a schedule
every client it may exchange models with) and ``t`` the honest neighbours a Byzantine client
sends to, a client holds at most

* honest: ``M * ((W + 1) * d + 5)``: one received model per neighbour and round of the window (the
  inbox refuses one more: ``inbox_full``), its parameters (after its local step, the model it
  sends), its model of the round before (still in flight to a slow neighbour; the sender gives up
  one two rounds old), its model at the start of the round (the rule's reference), its own row in
  the round's candidate matrix, and the aggregate (``+ 1`` with ``train.momentum``: its buffer);
* Byzantine: ``M * ((W + 1) * d + 2 * t + 2)``: the received models likewise, a crafted message per
  receiver of this round and of the one before (one in flight and one queued per receiver), and a
  float64 mean of what it received (sign flipping's; the Gaussian attack takes its centre a block of
  coordinates at a time); colluding, also its colluders' pools of the window, each of at most one
  model per client: ``M * (W + 1) * (c - 1) * n`` (``c`` colluders, ``n`` clients);

plus a baseline :data:`CLIENT_BASELINE` for the interpreter, torch, gRPC and its shard of the data.
This holds for rules and attacks that work on the candidates in place, a block of coordinates at a
time (DFedAvg, the Gaussian attack: :mod:`~dfedrw.peer.aggregation.columns`); one that makes copies
(a sort, a distance matrix, float64 rows) holds those too. :func:`run_needs` adds the launcher and
the fork server; :mod:`dfedrw.launch.preflight` refuses a run needing more than is available.

The batched engine (``engine.name = "batched"``) holds no process and no inbox per client: one
process holds every honest client's model as a row of one matrix, and :func:`batched_needs` counts
what it holds (see :class:`BatchedNeeds`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dfedrw.peer.aggregation.rules import RULE_REGISTRY, DFedAvg, DFedReweighting
from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.graph.topology import Topology
from dfedrw.peer.wiring.build import scenario_dataset
from dfedrw.peer.wiring.plan import colluding_group, dataset_shape, scenario_graphs, scenario_topology
from dfedrw.peer.graph.schedule import receive_window
from dfedrw.peer.transport.serde import TensorSpec

# Unique memory (PSS) of a client process besides its models: the interpreter, torch, numpy,
# gRPC and zmq, its shard of the data and the test sets. Measured: 150 MB for a client of the
# softmax regression on Fashion-MNIST started as a fresh interpreter (bench/startup.py, spawn;
# forked from the fork server it shares most of that: 66 MB), rounded up.
CLIENT_BASELINE = 160 * 10**6
# The launcher and the fork server together (each about 250 MB, bench/memory_at_size.py).
LAUNCHER_BASELINE = 600 * 10**6

# Working copies besides received models, as the module lists them (a float64 mean: two models).
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


def _size(n: int) -> str:
    if n >= 10**9:
        return _gb(n)
    if n >= 10**6:
        return f"{n / 1e6:.0f} MB" if n >= 10**8 else f"{n / 1e6:.1f} MB"
    return f"{n / 1e3:.1f} KB"


# -- the batched engine --------------------------------------------------------------------------

# The batched engine's process besides what grows with its clients: the interpreter, torch, the
# engine. Measured: 266 MB peak RSS for 10 clients of softmax regression on digits; rounded up.
BATCHED_BASELINE = 280 * 10**6
# A client's Python objects besides its model rows: its rule, minibatch order, evaluator, round log,
# its share of a round's records, weights and scores, its final file. Measured: about 90 KB a client
# at 1,000 clients of digits over 100 rounds, 60-80 KB at 10,000 of Gaussian blobs; rounded up.
BATCHED_CLIENT = 120 * 10**3
# Model rows a round holds per honest client: its model, its copy at the start of the round
# (the rule's reference), a local step's gradient and what autograd keeps of it, its aggregate
# in float64 and in float32, and the new models stacked (with momentum, its buffer: one more).
BATCHED_ROWS = 8
# Rows per pooled candidate (the honest models and the Byzantine messages): the pool
# concatenated, and its float64 copy that the weighted sum of DFedAvg and DFedReweighting reads.
POOL_ROWS = 3
# The test set, which no data set declares: at most a quarter of the training set for the
# built-in ones (digits 0.25, Fashion-MNIST 0.17, CIFAR 0.2).
TEST_SHARE = 0.25
# Bytes per entry of the run's mean weight matrix (each honest client by every client) as the
# run ends and writes record.json (peer.results.records.RecordBuilder): 8 as float64, 8 as a
# list of Python values, and about 5 as JSON text, held three times while it is written (the
# text, with its newline, in UTF-8). Measured: 2.9 GB at 10,000 clients.
MATRIX_ENTRY = 30


@dataclass(frozen=True)
class BatchedNeeds:
    """What one process of the batched engine needs for a run or a batch of runs, :attr:`total` in
    bytes (:attr:`data`: each data set's bytes, held once however many runs read it).

    With ``C`` honest clients of a run, ``d_k`` client ``k``'s neighbours (under a schedule, every
    client it may hear from) and ``X`` the Byzantine messages a round may pool (one per honest
    neighbour of each Byzantine client; colluders' pools, ``C`` more; under a compression, the
    models each receiver rebuilds: one per link), a run holds

    * ``C x 8 (+ C with momentum) + 3 x (C + X) + sum_k (d_k + 1)`` model rows
      (:data:`BATCHED_ROWS`, :data:`POOL_ROWS`, and each client's candidates gathered once, as the
      coordinate-wise and distance rules gather them; the sum leaves out clients whose rule weighs
      the pool as it is, DFedAvg and DFedReweighting; a rule that sorts holds a sorted copy too);
    * a local step's minibatches, ``C x batch_size x features`` float32 values;
    * its clients' objects, :data:`BATCHED_CLIENT` each;
    * its mean weight matrix as the run ends, :data:`MATRIX_ENTRY` per honest client and client (the
      runs of a batch end one after the other);

    and the process holds each data set once (its training set, its clients' auxiliary copies and a
    test set of :data:`TEST_SHARE` of it, float32, with indexes) plus :data:`BATCHED_BASELINE`; a
    model whose local step keeps activations (a convolutional one) holds those too."""

    runs: tuple[tuple[int, int, int, int, int], ...]  # (clients, honest, rows, model bytes, minibatch bytes)
    data: tuple[int, ...]

    def run_bytes(self, run: tuple[int, int, int, int, int]) -> int:
        clients, _, rows, model, batches = run
        return rows * model + clients * BATCHED_CLIENT + batches

    @property
    def matrix(self) -> int:
        return max(clients * honest for clients, honest, *_ in self.runs) * MATRIX_ENTRY

    @property
    def total(self) -> int:
        return sum(self.run_bytes(r) for r in self.runs) + self.matrix + sum(self.data) + BATCHED_BASELINE

    def describe(self) -> str:
        """One line: the estimate and where it comes from."""
        clients = sum(r[0] for r in self.runs)
        models = sum(r[2] * r[3] + r[4] for r in self.runs)
        what = f"{len(self.runs)} runs as one batch, {clients:_} clients" if len(self.runs) > 1 else f"{clients:_} clients"
        return (
            f"this run needs about {_gb(self.total)} in the batched engine ({what}, model {_size(self.runs[0][3])}: "
            f"{_size(models)} of model rows and minibatches, {_size(clients * BATCHED_CLIENT)} for the clients at "
            f"{BATCHED_CLIENT / 1e3:.0f} KB each, {_size(self.matrix)} for the weight matrix, {_size(sum(self.data))} of data, "
            f"{_size(BATCHED_BASELINE)} for the process)"
        )


def batched_rows(scenario: Scenario, topology: Topology | None = None) -> tuple[int, int, int]:
    """(clients, honest clients, model rows) of one run of the batched engine (see
    :class:`BatchedNeeds`; ``topology``: the scenario's, where the caller has drawn it)."""
    topology = scenario_topology(scenario) if topology is None else topology
    graphs = scenario_graphs(scenario, topology)
    honest = [k for k in range(topology.num_clients) if k not in topology.byzantine]
    links = sum(len(graphs.possible(k)) for k in honest)
    weighs = {rule: issubclass(RULE_REGISTRY.resolve(rule), (DFedAvg, DFedReweighting)) for rule in scenario_rules(scenario)}
    gathered = sum(len(graphs.possible(k)) + 1 for k in honest if not weighs[scenario.aggregation_for(k).rule])
    messages = sum(1 for b in topology.byzantine for j in graphs.possible(b) if j not in topology.byzantine)
    if scenario.attack.colluding and topology.byzantine:
        messages += len(honest)
    if scenario.network.compression != "none":
        messages += links
    c = len(honest)
    rows = c * (BATCHED_ROWS + (1 if scenario.train.momentum else 0)) + POOL_ROWS * (c + messages) + gathered
    return topology.num_clients, c, rows


def scenario_rules(scenario: Scenario) -> set[str]:
    """The rules of ``scenario``'s clients: [aggregation]'s and any of [peers.K.aggregation]."""
    return {scenario.aggregation.rule, *(scenario.aggregation_for(k).rule for k in scenario.peers)}


def data_bytes(scenario: Scenario) -> int:
    """The data set of ``scenario`` as the batched engine holds it (see :class:`BatchedNeeds`)."""
    rows = int(scenario_dataset(scenario.data).train_size)
    features = dataset_shape(scenario)[0]
    values = rows * features * (1 + scenario.data.aux_fraction + TEST_SHARE)
    return int(values * 4 + rows * 8 * 3)  # float32 values; labels, shard rows and clients' indexes int64


def batched_needs(
    scenarios: Sequence[Scenario], specs: Sequence[tuple[TensorSpec, ...]], topologies: Sequence[Topology | None] | None = None,
) -> BatchedNeeds:
    """What one process of the batched engine needs for ``scenarios`` run as one batch
    (``specs``: each one's model layout; ``topologies``: their graphs, where drawn already)."""
    runs, data = [], {}
    for scenario, layout, topology in zip(scenarios, specs, topologies or [None] * len(scenarios), strict=True):
        clients, honest, rows = batched_rows(scenario, topology)
        features = dataset_shape(scenario)[0]
        runs.append((clients, honest, rows, model_bytes(layout), honest * scenario.train.batch_size * features * 4))
        d = scenario.data
        data.setdefault((d.name, d.params, d.dir), data_bytes(scenario))
    return BatchedNeeds(tuple(runs), tuple(data.values()))
