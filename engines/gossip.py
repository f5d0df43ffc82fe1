"""Asynchronous gossip (``network.protocol = "async"``) in the batched engine: every client's
steps in the order of a simulated clock, the clients whose steps end at the same instant as one
batch (:func:`run_gossip`).

It follows the client's loop (:mod:`peer.client.asynchronous`) step for step. Honest client
``k``'s step ``t`` starts at ``S_k(t)``, trains for its ``[clock]`` compute (``step_seconds``
over its speed) and at ``E_k(t)`` sends its model to every neighbour over the links (the seeded
:class:`~dfedrw.peer.transport.links.LinkSchedule` of a client's emulated links) and aggregates
it with the newest model arrived from each by ``E_k(t)``, which takes ``aggregate_seconds`` over
its speed; step ``t + 1`` starts at ``S_k(t + 1)``. Nothing waits. A model's staleness is the
receiver's steps since it arrived (in the latest step ``t`` with ``S_k(t)`` at or before its
arrival). A Byzantine client, at each arrival of an honest neighbour's model, crafts from the
newest model held of each and answers that neighbour with a message labelled as its model.

Why batches are exact: a client's model sent at ``E_k(t)`` is what it trained from its
aggregate of step ``t - 1``, which ended before ``E_k(t)``. So the clients are taken in the
order of their ``E``: when the earliest is ``T``, every model sent by ``T`` is already trained
(it was trained as soon as its sender aggregated), and every Byzantine answer that can arrive
by ``T`` is crafted first. The clients whose ``E`` is exactly ``T`` (the same compute and speed,
from the same start) aggregate as one batch: one training product, one rule call per group.

What it leaves out, besides what the sync clock leaves out: the transport's word on
reachability (no neighbour is presumed gone and probed), and attacks that send copies labelled
with other steps (refused: what a receiver does with them is the real client's timing)."""

from __future__ import annotations

import bisect
import heapq
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from dfedrw.engines.layout import choose_layout
from dfedrw.engines.steps import aggregate_together, rule_groups, train_together
from dfedrw.engines.run import BatchedRun, Candidates
from dfedrw.peer.round.candidates import Offer, assemble
from dfedrw.peer.round.records import byzantine_record, evaluation_due, honest_record, with_round_graph
from dfedrw.peer.learning.model_matrix import ManyEvaluator
from dfedrw.peer.transport.latest import fresh_enough


@dataclass(frozen=True)
class Message:
    """A model on its way to a receiver: its arrival (simulated seconds), sender, label (the
    sender's step), the model as its receiver takes it, declared size and loss; for an
    honest sender's model, the reason every receiver's intake refuses it (None: taken); the
    scores it carries (``network.share_scores``; None: none)."""

    arrival: float
    sender: int
    label: int
    vector: torch.Tensor
    num_samples: int
    loss: float
    refused: str | None = None
    scores: Mapping[int, float] | None = None


@dataclass(frozen=True)
class Held:
    message: Message
    arrived_step: int


class Gossip:
    """One run's asynchronous gossip on the simulated clock (see the module)."""

    def __init__(self, run: BatchedRun) -> None:
        self.run = run
        sc = run.scenario
        self.clock = run.network.clock
        self.codec = run.network.codec
        self.sizes = run.network.sizes
        self.topology = run.topology
        self.byzantine = frozenset(run.byzantine)
        self.graphs = run.graphs
        self.starts = {k: [0.0] for k in run.honest}  # S_k(0), S_k(1), ...
        self.step = dict.fromkeys(run.honest, 0)  # the step each honest client is in
        self.pending: dict[int, list[tuple[float, int, Message]]] = {k: [] for k in range(self.topology.num_clients)}
        self.held: dict[int, dict[int, Held]] = {k: {} for k in range(self.topology.num_clients)}
        self.answered = {b: {k: -1 for k in self.graphs.possible(b) if k not in self.byzantine} for b in run.byzantine}
        # Each Byzantine client's step (attack, generator, reference): the run's, driven by gossip.
        self.attack_steps = run.attack_steps
        self.byzantine_events: list[tuple[float, int, int]] = []  # (arrival, order, Byzantine receiver)
        self.losses: dict[int, float] = {}
        self.errors: dict[int, Any] = {}  # each honest client's last trained model: what an intake refuses it for, or None
        self.references: dict[int, torch.Tensor] = {}
        self.bytes_step = dict.fromkeys(run.honest, 0)
        self.staleness_total = dict.fromkeys(run.honest, 0)
        self.crafts = dict.fromkeys(run.byzantine, 0)
        self.skipped_busy: dict[int, int] = {}
        self.order = 0
        self.max_staleness = sc.network.max_staleness
        self.scorer = ManyEvaluator()

    # -- the clock -------------------------------------------------------------------------
    def end_of_training(self, k: int) -> float:
        return self.starts[k][self.step[k]] + self.clock.step_seconds[k]

    def _plan(self, sender: int, receiver: int, now: float, size: int) -> float | None:
        arrival = self.clock.link(sender, receiver).plan(now, size)
        link = (sender, receiver)
        self.run.network.bytes_to[link] = self.run.network.bytes_to.get(link, 0) + size
        return arrival

    def _free(self, sender: int, receivers, now: float) -> list[tuple[int, int]]:
        """The links from ``sender`` to ``receivers`` free at ``now``; one still sending skips this
        model, counted (the next goes instead, as over a client's emulated links under gossip)."""
        free = []
        for j in receivers:
            if self.clock.link(sender, j).busy(now):
                self.skipped_busy[sender] = self.skipped_busy.get(sender, 0) + 1
            else:
                free.append((sender, j))
        return free

    def _post(self, receiver: int, message: Message) -> None:
        self.order += 1
        heapq.heappush(self.pending[receiver], (message.arrival, self.order, message))
        if receiver in self.byzantine:
            heapq.heappush(self.byzantine_events, (message.arrival, self.order, receiver))

    def _take(self, receiver: int, until: float) -> None:
        """What reached ``receiver`` by ``until``, in the order it arrived: a newer model of its
        sender replaces the one held (a refused one is counted)."""
        queue, held = self.pending[receiver], self.held[receiver]
        while queue and queue[0][0] <= until:
            _, _, message = heapq.heappop(queue)
            if message.refused is not None:
                self.run._reject(receiver, message.refused)
                continue
            old = held.get(message.sender)
            if old is not None and old.message.label >= message.label:
                self.run.stale[receiver] = self.run.stale.get(receiver, 0) + 1
                continue
            arrived = bisect.bisect_right(self.starts[receiver], message.arrival) - 1 if receiver in self.starts else 0
            held[message.sender] = Held(message, arrived)

    # -- honest clients ----------------------------------------------------------------------
    def train(self, wave: list[int]) -> None:
        """The next step's local training of the clients ``wave`` (all in the same step), and
        what they send at its end."""
        run = self.run
        t = self.step[wave[0]]
        rows = [run.row[k] for k in wave]
        for k, row in zip(wave, rows, strict=True):
            self.references[k] = run.models[row].to("cpu", copy=True)
        run.wave = rows
        try:
            losses = train_together([run], t)[0]
        finally:
            run.wave = None
        low, high = run.models[rows].amin(dim=1).tolist(), run.models[rows].amax(dim=1).tolist()
        for i, (k, row) in enumerate(zip(wave, rows, strict=True)):
            self.losses[k] = losses[row]
            self.errors[k] = run.plausible.values_error(low[i], high[i])  # as every receiver's intake finds it
            self.send(k, t, run.models[row].to("cpu", copy=True), self.errors[k])

    def send(self, k: int, t: int, vector: torch.Tensor, error) -> None:
        run = self.run
        now = self.end_of_training(k)
        links = self._free(k, self.graphs.receivers_of(k, t), now)
        sizes = self.sizes.links(links, self.codec, t)
        arrivals = {link: self._plan(k, link[1], now, sizes[link]) for link in links}
        self.bytes_step[k] = sum(sizes.values())
        rebuilt = self.codec.rebuilt(t, {k: vector}, links) if self.codec is not None else {}
        believed = run.plausible.train_loss(self.losses[k])
        for link, arrival in arrivals.items():
            if arrival is None:
                continue
            model = rebuilt.get(link, vector)
            if self.codec is not None and self.codec.compression.stateful:
                model = model.clone()  # the link's copy moves on with its next message
            message = Message(arrival, k, t, model, run.num_samples[k], believed, None if error is None else error.reason, run.network.shared.get(k))
            self._post(link[1], message)

    def aggregate(self, wave: list[int], now: float) -> None:
        """Step ``t`` of the clients ``wave`` (all in step ``t``, all at ``now``): each takes
        what reached it, aggregates with its rule, writes its record."""
        run, sc = self.run, self.run.scenario
        t = self.step[wave[0]]
        for k in wave:
            self._take(k, now)
        rows = [run.row[k] for k in wave]
        pool = [run.models[rows].cpu()]
        place: dict[int, int] = {}  # id of a held model -> its pooled row
        clients = []
        for i, k in enumerate(wave):
            held = {j: h for j, h in self.held[k].items() if fresh_enough(t - h.arrived_step, self.max_staleness)}
            offers = []
            for j in sorted(held):
                message = held[j].message
                if id(message.vector) not in place:
                    place[id(message.vector)] = len(wave) + len(place)
                    pool.append(message.vector[None])
                offers.append(Offer(j, place[id(message.vector)], message.num_samples, message.loss, t - held[j].arrived_step, message.scores))
            clients.append(assemble(Offer(k, i, run.num_samples[k], self.losses[k]), offers, self.graphs.senders_to(k, t), memory=run.memory.get(k)))
        # The own trained model is non-finite exactly when the intake's check found it so.
        finite = [self.errors[k] is None or self.errors[k].reason != "non_finite" for k in wave] + [True] * (sum(len(p) for p in pool) - len(wave))
        parts = Candidates(
            pieces=pool, clients=clients, evaluate=[run.aux[k] for k in wave],
            reference=torch.stack([self.references[k] for k in wave]).to(run.device), finite=finite, gossip=True,
        )
        rules, told = zip(*(self.run.told_rules.at(k, clients[i].senders) for i, k in enumerate(wave)), strict=True)
        rules = list(rules)
        results = aggregate_together(t, sc.rounds, [parts], rule_groups(rules), self.scorer, rules)
        models = torch.stack([agg.model for agg in results]).to(run.device)
        run.models = run.models.index_copy(0, torch.tensor(rows, dtype=torch.long, device=run.device), models)
        due = [k for k in wave if evaluation_due(t, sc.rounds, sc.eval.every)]
        measured = run.accuracies(due) if due else {}
        for i, (k, agg) in enumerate(zip(wave, results, strict=True)):
            end = now + self.clock.aggregate_seconds[k]
            mine = clients[i]
            run.aggregated(k, agg)
            self.staleness_total[k] += sum(mine.staleness)
            record = honest_record(
                t, self.losses[k], agg.weights, mine.missing, scores=agg.scores, notes={"staleness": {str(j): s for j, s in zip(mine.senders, mine.staleness[1:], strict=True)}},
                bytes_sent=self.bytes_step[k], seconds=round(end, 6),
            )
            if k in measured:
                run.last[k] = measured[k]
                record.update(measured[k])
            run.logs[k].write(with_round_graph(record, self.graphs, k, t, told[i]))
            self.starts[k].append(end)
            self.step[k] = t + 1

    # -- Byzantine clients -------------------------------------------------------------------
    def answer(self, b: int, now: float) -> None:
        """Byzantine ``b`` at ``now``: what reached it taken, each honest neighbour whose newer
        model came answered with one crafted message."""
        run = self.run
        self._take(b, now)
        held = {j: h.message for j, h in self.held[b].items() if j in self.answered[b]}
        due = tuple(j for j in sorted(held) if held[j].label > self.answered[b][j])
        if not due:
            return
        senders = tuple(sorted(held))
        received = torch.stack([held[j].vector for j in senders])
        label = max(held[j].label for j in due)
        crafted, claimed_size, claimed_loss = self.attack_steps[b](
            label, receivers=due, senders=senders, received=received, sizes=[held[j].num_samples for j in senders], losses=[held[j].loss for j in senders],
            reports={j: held[j].scores for j in due},
        )
        if crafted.extra:
            raise ValueError(
                f"an attack sent copies labelled with other steps (client {b}): under asynchronous gossip what a receiver does "
                "with them depends on the clients' timing, which the batched engine does not model; use the clients engine"
            )
        silent, sent = 0, 0
        reported = self.attack_steps[b].reported(label)
        self.sizes.scored[b] = len(reported or ())
        for j in due:
            self.answered[b][j] = held[j].label
            vector = crafted.messages[j]
            if vector is None:
                silent += 1
                run.silent[b] += 1
                continue
            error = run.plausible.samples_error(claimed_size) or run.plausible.model_error(vector)
            if not self._free(b, (j,), now):
                continue
            arrival = self._plan(b, j, now, self.sizes.of(b))
            sent += self.sizes.of(b)
            if arrival is not None:
                message = Message(
                    arrival, b, held[j].label, vector.to(torch.float32), claimed_size, run.plausible.train_loss(claimed_loss),
                    None if error is None else error.reason, reported,
                )
                self._post(j, message)
        record = byzantine_record(label, list(senders), silent, crafted, sent, 0, reported=reported)
        record["answered"] = {str(j): held[j].label for j in due}
        run.logs[b].write(record)  # (no round graph: a Byzantine client answers whoever sent to it)
        self.crafts[b] += 1

    def byzantine_until(self, until: float) -> None:
        """Every Byzantine answer crafted at or before ``until``, in the order of the arrivals
        that prompt them."""
        while self.byzantine_events and self.byzantine_events[0][0] <= until:
            now, _, b = heapq.heappop(self.byzantine_events)
            while self.byzantine_events and self.byzantine_events[0][0] == now and self.byzantine_events[0][2] == b:
                heapq.heappop(self.byzantine_events)  # models that reached it at the same instant: one answer
            self.answer(b, now)

    # -- the run -------------------------------------------------------------------------------
    def run_all(self, on_step: Callable[[int], None] | None = None) -> None:
        run, rounds = self.run, self.run.scenario.rounds
        self.train(list(run.honest))
        queue = [(self.end_of_training(k), k) for k in run.honest]
        heapq.heapify(queue)
        slowest = -1
        while queue:
            now = queue[0][0]
            wave = []
            while queue and queue[0][0] == now:
                wave.append(heapq.heappop(queue)[1])
            self.byzantine_until(now)
            by_step: dict[int, list[int]] = {}
            for k in sorted(wave):
                by_step.setdefault(self.step[k], []).append(k)
            for group in by_step.values():
                self.aggregate(group, now)
                going = [k for k in group if self.step[k] < rounds]
                if going:
                    self.train(going)
                    for k in going:
                        heapq.heappush(queue, (self.end_of_training(k), k))
            done = min(self.step.values()) - 1
            if on_step is not None and done > slowest:
                for step in range(slowest + 1, done + 1):
                    on_step(step)
                slowest = done
        self.byzantine_until(float("inf"))
        for k in run.honest:
            seconds = self.starts[k][-1]
            run.network.gossip[k] = {
                "protocol": "async", "steps_per_second": round(rounds / seconds, 3) if seconds > 0 else None, "staleness_total": self.staleness_total[k],
                # A client process waits for its links to take its models and for its neighbours'
                # models of its step; here a link takes one whenever not still sending the last
                # (skipped_busy), and a same-step model is in if it arrived by the end of training.
                "paced_seconds": 0.0, "fresh_seconds": 0.0,
            }
        for b in run.byzantine:
            run.network.gossip[b] = {"protocol": "async", "crafts": self.crafts[b]}
        run.network.skipped_busy = dict(self.skipped_busy)


def run_gossip(run: BatchedRun, on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
    """One run under asynchronous gossip, to its results folder; returns its summary
    (``on_step(t)``: once every honest client finished step ``t``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(run.scenario.engine.threads)
    start = loop_start = time.monotonic()
    cpu_start = time.process_time()
    interrupted = False
    try:
        run.begin()
        choose_layout([run])
        loop_start, cpu_start = time.monotonic(), time.process_time()
        Gossip(run).run_all(on_step)
    except KeyboardInterrupt:
        interrupted = True  # the steps logged so far stay; the summary says it was interrupted
    finally:
        torch.set_num_threads(threads)
        run.close()
    loop = {"loop_seconds": round(time.monotonic() - loop_start, 3), "loop_cpu_seconds": round(time.process_time() - cpu_start, 3)}
    return run.finish(loop, round(time.monotonic() - start, 3), interrupted=interrupted)
