"""Asynchronous gossip (``network.protocol = "async"``): a client's loop without a round barrier.

An honest client takes its local steps at its own speed, one after the other, and never waits
for anyone. Its step ``t``:
  1. local SGD step(s) -> w_k^{t+1/2};
  2. send it to every neighbour, labelled ``t`` (a neighbour presumed gone is probed now and
     then, as in the round protocol, :mod:`peer.client.presence`);
  3. aggregate it with the newest model it holds from each neighbour, whenever that came
     (:class:`~dfedrw.peer.transport.latest.LatestInbox`), with the client's rule, unchanged:
     DFedReweighting scores the candidates at hand on its auxiliary set, a robust rule is told
     the Byzantine neighbours as ever. Each candidate's staleness (how many of the client's
     own steps ago it arrived) is in the rule's inputs, for a rule that weighs by it
     (``staleness_exponent``), and in the step's record; ``network.max_staleness`` leaves out
     the older ones. A neighbour that finished its steps stays a candidate with its last model;
     one that cannot be reached mid-run does not (until it sends again).

Pacing: a client takes its next step only once the model it sent last went out to each
neighbour (at most ``round_timeout``; :meth:`~peer.client.presence.Presence.pace`), so that it
makes no model faster than its neighbours take them; after it sent step ``t`` it waits, briefly,
for the next model of each neighbour stepping with it (the step-``t`` model of one keeping pace,
:class:`Freshness`); as it (re)starts, once, for a first model of each neighbour.

A Byzantine client has no steps of its own: each time models of its honest neighbours arrive
it crafts its attack from the newest model it holds of each (what it received, as ever) and
answers each neighbour whose model came with a message labelled as that model, so that its
messages are as fresh as theirs. It stops when each honest neighbour sent its last step, or
when none sent anything for ``max_missed_rounds + 1`` round timeouts.

Under a schedule (``topology.schedule``, e.g. Epidemic Learning) a client sends each step to
its receivers of that step's graph, and takes the newest model of anyone who sent it one.

Records: one per local step (``round`` is the step), with ``seconds`` since the loop began
and ``staleness``; ``missing``: the step's senders (its graph's) nothing is held from. What
the round protocol has and this one has not: colluders' pools (refused by the scenario's
checks) and deadlines. A client that restarts waits briefly for its neighbours' models and
continues one past the steps they are at (the upper median), taking the median of their models
in place of its own where that skips many steps (:meth:`~peer.client.rejoin.Resume.resume_steps`);
a client that lagged its neighbours by the time its restart took would otherwise pull their
aggregates back for the rest of the run.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import torch

from dfedrw.peer.aggregation.rules import finite_rows
from dfedrw.peer.client import link_messages
from dfedrw.peer.client.rounds import end_of_round
from dfedrw.peer.round.byzantine import ByzantineStep, scenario_lie
from dfedrw.peer.round.candidates import Offer, assemble
from dfedrw.peer.round.records import byzantine_record, honest_record, loop_times, with_round_graph
from dfedrw.peer.learning.models import get_vector, set_vector
from dfedrw.peer.transport.inbox import Inbox
from dfedrw.peer.transport.latest import LatestInbox
from dfedrw.peer.transport.serde import message_out
from dfedrw.peer.wiring.plan import derive_seed

log = logging.getLogger("dfedrw.peer.client.client")


def client_inbox(scenario, client_id: int, neighbours, num_clients: int, window: int, **round_inbox: Any) -> Inbox:
    """The inbox of a client: the round protocol's, keyed by round (``round_inbox``: its
    arguments), or under asynchronous gossip the newest model of each neighbour."""
    if scenario.network.asynchronous:
        return LatestInbox(client_id, neighbours, num_clients, last_step=scenario.rounds - 1, model_size=round_inbox.get("model_size", 0))
    return Inbox(client_id, neighbours, num_clients, window, **round_inbox)


def run_async(client) -> dict[str, Any]:
    """Every step of ``client`` (a :class:`~dfedrw.peer.client.client.Client`) under
    asynchronous gossip; returns what its final file adds."""
    return run_async_honest(client) if client.role == "honest" else run_async_byzantine(client)


def run_async_honest(client) -> dict[str, Any]:
    sc = client.scenario
    data, trainer, inbox = client.data, client.trainer, client.inbox
    num_samples = len(data.train.y)
    graphs = client.graphs
    last: dict[str, float] = {}
    loop_start, cpu_start, started_at = time.monotonic(), time.process_time(), time.time()
    t = first = 0
    first_after_resume = client.resumed is not None
    if first_after_resume:
        reachable = [k for k in graphs.senders_to(client.id, client.resumed.round + 1) if k not in client.presence.unreachable]
        t, adopted = client.resume.resume_steps(reachable)
        first = t
        if adopted is not None:
            set_vector(client.model, adopted)
    flat = client._flatten()  # on the CPU the parameters are views of one flat vector (the model to send)
    stale_steps = 0
    fresh = Freshness(sc.network.round_timeout, getattr(client.transport, "message_seconds", None))
    while t < sc.rounds:
        client._check_stop()
        inbox.advance(t)
        client.presence.begin_round(t)
        client.resume.note_round(t)
        sent0, recv0 = client.encoder.total, inbox.bytes_received  # bytes as it made them for its links
        reference = get_vector(client.model)
        with client.pace.work():
            loss = trainer.step(sc.train.lr_at(t, sc.rounds))
        own = flat if flat is not None else get_vector(client.model)
        receivers = graphs.receivers_of(client.id, t)
        client.presence.pace(receivers)
        client._send_all(t, own, num_samples, receivers, loss)
        fresh.wait(inbox, [k for k in graphs.senders_to(client.id, t) if k not in client.presence.unreachable], t, t == first)
        held = inbox.held_models(sc.network.max_staleness)
        senders = sorted(held)
        rule, told = client.rules.at(client.id, tuple(senders))  # under a schedule: told the Byzantine senders it holds
        candidates = assemble(
            Offer(client.id, own, num_samples, loss),
            (Offer(k, m.vector, m.num_samples, m.train_loss, stale, m.scores or None) for k, (m, stale) in sorted(held.items())),
            graphs.senders_to(client.id, t), memory=client.memory,
        )
        stale_steps += sum(candidates.staleness)
        vectors = candidates.stack()
        finite = (bool(finite_rows(own[None])[0]), *(True for _ in senders))  # the intake checked the others
        with client.pace.work():
            agg = rule(
                candidates.inputs(t, vectors, evaluate=client.aux_eval, total_rounds=sc.rounds, reference=reference, finite=finite, gossip=True)
            )
        model = agg.model.clone() if agg.model.untyped_storage().data_ptr() == vectors.untyped_storage().data_ptr() else agg.model
        client._keep(agg)
        set_vector(client.model, model)
        flat = model if flat is not None else None
        notes: dict[str, Any] = {"staleness": {str(k): s for k, s in zip(senders, candidates.staleness[1:], strict=True)}}
        if first_after_resume:
            notes["resumed_from"], first_after_resume = client.resumed.round, False
        record = honest_record(
            t, loss, agg.weights, candidates.missing, scores=agg.scores, notes=notes,
            bytes_sent=client.encoder.total - sent0, bytes_received=inbox.bytes_received - recv0,
            seconds=round(time.monotonic() - loop_start, 3),
        )
        with_round_graph(record, graphs, client.id, t, told)
        del vectors, candidates, held, agg, reference, own
        last = end_of_round(client, t, loss, record, model, last, step="step")
        del model
        t += 1
    seconds = time.monotonic() - loop_start
    return {
        **last, **loop_times(loop_start, cpu_start, started_at), "num_samples": num_samples, "aux_samples": len(data.aux.y),
        "local_test_samples": len(data.local_test.y),
        "gossip": {
            "protocol": "async", "steps_per_second": round((sc.rounds - first) / seconds, 3) if seconds > 0 else None, "staleness_total": stale_steps,
            "paced_seconds": round(client.presence.paced_seconds, 3), "fresh_seconds": round(fresh.seconds, 3),
        },
    }


class Freshness:
    """What a client waits for after it sent its step ``t``: the next model of each neighbour
    stepping with it, at most a grace of a few times what a message takes lately (its
    transport's ``message_seconds``: sent to answered; :data:`FLOOR` where it does not say),
    never more than ``timeout``; as it (re)starts, a first model of each neighbour, at most
    ``timeout``. Of a neighbour keeping pace (the model it holds of it is of step ``t - 1`` or
    later) the next model is that of step ``t`` (held already of one ahead: not waited for); of
    one behind, the one after the model it holds.
    So that, where neighbours step at one speed, a step aggregates models of that step, as the
    batched engine's clock does: a message between two processes takes about as long as a local
    step of a small model, and aggregating each neighbour's step before at every step halves
    what a step learns. And so that a client that got ahead (a wait that ran out, a scheduler's
    whim) waits as a client behind it does: were it waited for by its neighbours and not
    waiting itself, it would step faster the further ahead it got, and under a long run its
    neighbours would aggregate its model of hundreds of steps before or after theirs; as it is,
    the one behind waits for nobody ahead of it and closes the gap. A neighbour behind that made
    fewer than :data:`PACE` steps per step of this client over its last :data:`WINDOW` steps is
    a straggler (slower, not merely behind): not waited for, so that a straggler slows only
    itself. What it waited is counted (:attr:`seconds`)."""

    FACTOR = 6.0  # the grace: this many times what a message takes
    FLOOR = 0.002  # seconds: the least grace
    WINDOW = 20  # steps of this client over which a neighbour's pace is measured
    PACE = 0.5  # a neighbour behind that made fewer steps than this per step of ours: a straggler

    def __init__(self, timeout: float, message_seconds=None) -> None:
        self.timeout = timeout
        self.message_seconds = message_seconds or (lambda: None)
        self.seconds = 0.0  # waited in all
        self._marks: deque[tuple[int, dict[int, int]]] = deque(maxlen=self.WINDOW)  # (step, labels held then)

    def grace(self) -> float:
        took = self.message_seconds()
        return min(self.timeout, max(self.FLOOR, self.FACTOR * (took or 0.0)))

    def stragglers(self, held: dict[int, int], t: int) -> set[int]:
        """Of the neighbours whose labels are ``held`` at step ``t``, those behind (a label before
        ``t - 1``) that stepped slower than :data:`PACE` of this client over the window."""
        if not self._marks or t - self._marks[0][0] < self.WINDOW // 2:
            return set()  # too few steps yet to tell a straggler from a neighbour a step late
        then_t, then = self._marks[0]
        return {k for k, label in held.items() if label < t - 1 and k in then and label - then[k] < self.PACE * (t - then_t)}

    def wait(self, inbox: LatestInbox, senders, t: int, first: bool) -> None:
        if first:
            labels, grace = dict.fromkeys(senders, 0), self.timeout
        else:
            held = inbox.labels()
            slow = self.stragglers(held, t)
            self._marks.append((t, held))
            labels = {k: t if held[k] >= t - 1 else held[k] + 1 for k in senders if k in held and k not in slow}
            grace = self.grace()
        if labels:
            start = time.monotonic()
            inbox.wait_for_labels(labels, grace)
            self.seconds += time.monotonic() - start


def last_labels(graphs, own: int, senders, rounds: int) -> dict[int, int]:
    """Per sender, the last step in which it sends to ``own`` (-1: never): the last step on a
    fixed graph; under a schedule, the last step whose graph gives it the edge."""
    if not graphs.dynamic:
        return dict.fromkeys(senders, rounds - 1)
    return {k: max((t for t in range(rounds) if own in graphs.receivers_of(k, t)), default=-1) for k in senders}


def run_async_byzantine(client) -> dict[str, Any]:
    sc = client.scenario
    inbox: LatestInbox = client.inbox
    byzantine = client.topology.byzantine
    gen = torch.Generator().manual_seed(derive_seed(sc.seed, "attack", client.id))
    loop_start, cpu_start, started_at = time.monotonic(), time.process_time(), time.time()
    honest = tuple(k for k in client.neighbours if k not in byzantine)
    answered = dict.fromkeys(honest, -1)  # per honest neighbour, the label it was last answered at
    # The last step each honest neighbour sends it a model in (a fixed graph: the last step).
    last = last_labels(client.graphs, client.id, honest, sc.rounds)
    step = ByzantineStep(
        sc, client.id, client.attack, gen, lie=scenario_lie(sc, client.graphs, byzantine, client.id, client.plausible.max_scores), byzantine=byzantine,
    )
    seen, quiet, crafts = 0, 0, 0
    size = sum(s.numel for s in client.specs)
    while any(answered[k] < last[k] for k in honest):
        client._check_stop()
        news = inbox.wait_news(seen, sc.network.round_timeout)
        if news == seen:
            quiet += 1
            if quiet > sc.network.max_missed_rounds:
                log.warning("client %d: nothing from its honest neighbours for %d timeouts; stopping", client.id, quiet)
                break
            continue
        seen, quiet = news, 0
        held = {k: m for k, (m, _) in inbox.held_models().items() if k in answered}
        due = tuple(k for k in honest if k in held and held[k].round > answered[k])
        if not due:
            continue
        senders = tuple(sorted(held))
        messages = [held[k] for k in senders]
        sent0, recv0 = client.transport.bytes_sent, inbox.bytes_received
        label = max(held[k].round for k in due)
        received = torch.stack([m.vector for m in messages]) if messages else torch.empty(0, size)
        crafted, claimed_size, claimed_loss = step(
            label, receivers=due, senders=senders, received=received, sizes=[m.num_samples for m in messages], losses=[m.train_loss for m in messages],
            reports={k: held[k].scores for k in due},
        )
        chunk_bytes, reported = sc.network.chunk_bytes, step.reported(label)
        claims = {"num_samples": claimed_size, "train_loss": claimed_loss, "scores": reported, "chunk_bytes": chunk_bytes}
        for k, labelled in crafted.extra.items():
            for extra_label, extra in labelled:
                client.transport.send(k, message_out(client.id, extra_label, extra, client.specs, **claims))
        silent = 0
        for k in due:
            answered[k] = held[k].round
            if crafted.messages[k] is None:
                silent += 1
                continue
            client.transport.send(
                k, message_out(client.id, held[k].round, crafted.messages[k], client.specs, **claims)
            )
        record = byzantine_record(
            label, list(senders), silent, crafted, client.transport.bytes_sent - sent0, inbox.bytes_received - recv0, reported=reported,
        )
        record["answered"] = {str(k): held[k].round for k in due}  # each neighbour answered, at its model's label
        client.results.write(record)
        client.link.send(link_messages.round_event(client.id, label))
        crafts += 1
        del received, messages, held, crafted
    return {"attack": sc.attack.name, **loop_times(loop_start, cpu_start, started_at), "gossip": {"protocol": "async", "crafts": crafts}}
