"""Asynchronous gossip (``network.protocol = "async"``): a client without a round barrier. Its
honest steps are ``Client._run_honest``'s loop, shared with the round protocol, with
:class:`GossipGather`; a Byzantine client's loop is :func:`run_async_byzantine`.

An honest client takes its local steps at its own speed: it waits only until its last model went
out to each neighbour (:meth:`~peer.client.presence.Presence.pace`) and, briefly, for fresh
models of its neighbours (:class:`Freshness`). Step ``t``:
  1. local SGD step(s) -> w_k^{t+1/2};
  2. send it to every neighbour, labelled ``t`` (a neighbour presumed gone is probed now and
     then, as in the round protocol, :mod:`peer.client.presence`);
  3. aggregate it with the newest model held from each neighbour, whenever that came
     (:class:`~dfedrw.peer.transport.latest.LatestInbox`), with the client's rule, unchanged
     (DFedReweighting scores the candidates at hand, a robust rule is told the Byzantine
     neighbours). Each candidate's staleness (the client's own steps since it arrived) is in the
     rule's inputs (``staleness_exponent``) and the step's record; ``network.max_staleness``
     leaves out older ones. A neighbour that finished stays a candidate with its last model; one
     unreachable mid-run does not (until it sends again).

A Byzantine client has no steps of its own: when models of its honest neighbours arrive it
crafts its attack from the newest model held of each and answers each neighbour whose model
came with a message labelled as that model, as fresh as theirs. It stops once each honest
neighbour sent its last step, or none sent anything for ``max_missed_rounds + 1`` round timeouts.

Under a schedule (``topology.schedule``, e.g. Epidemic Learning) a client sends each step to
its receivers of that step's graph, and takes the newest model of anyone who sent it one.

Records: one per local step (``round`` is the step), with ``seconds`` since the loop began and
``staleness``; ``missing``: the step's senders (its graph's) nothing is held from. Unlike the
round protocol: no colluders' pools (refused by the scenario's checks), no deadlines. A client
that restarts continues where its neighbours are, taking their median model where its own is
stale (:meth:`~peer.client.rejoin.Resume.resume_steps`)."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import torch

from dfedrw.peer.client import link_messages
from dfedrw.peer.client.byzantine import restore_attack, send_crafted
from dfedrw.peer.client.checkpoint import CheckpointError
from dfedrw.peer.round.byzantine import ByzantineStep, scenario_lie
from dfedrw.peer.round.candidates import ClientCandidates, Offer, assemble
from dfedrw.peer.round.records import byzantine_record, checkpoint_due, loop_times
from dfedrw.peer.learning.models import set_vector
from dfedrw.peer.transport.inbox import Inbox
from dfedrw.peer.transport.latest import LatestInbox
from dfedrw.peer.wiring.plan import derive_seed

log = logging.getLogger("dfedrw.peer.client.client")


def client_inbox(scenario, client_id: int, neighbours, num_clients: int, window: int, **round_inbox: Any) -> Inbox:
    """The inbox of a client: the round protocol's, keyed by round (``round_inbox``: its
    arguments), or under asynchronous gossip the newest model of each neighbour."""
    if scenario.network.asynchronous:
        return LatestInbox(client_id, neighbours, num_clients, last_step=scenario.rounds - 1, model_size=round_inbox.get("model_size", 0))
    return Inbox(client_id, neighbours, num_clients, window, **round_inbox)


class GossipGather:
    """Asynchronous gossip's part of an honest client's step (``Client._run_honest``): where a
    resumed client goes on, how it sends (paced, then :class:`Freshness`), and what step ``t``
    aggregates: the newest model held of each neighbour, with its staleness."""

    unit = "step"  # what its progress lines count
    gossip = True  # its candidates carry their staleness

    def __init__(self, client) -> None:
        self.client = client
        self.fresh = Freshness(client.scenario.network.round_timeout, getattr(client.transport, "message_seconds", None))
        self.first_step = 0
        self.stale_steps = 0

    def first(self, num_samples: int) -> int:
        c = self.client
        if c.resumed is None:
            return 0
        reachable = [k for k in c.graphs.senders_to(c.id, c.resumed.round + 1) if k not in c.presence.unreachable]
        self.first_step, adopted = c.resume.resume_steps(reachable)
        if adopted is not None:
            set_vector(c.model, adopted)
        return self.first_step

    def send(self, t: int, own: Any, num_samples: int, loss: float) -> None:
        c = self.client
        receivers = c.graphs.receivers_of(c.id, t)
        c.presence.pace(receivers)
        c._send_all(t, own, num_samples, receivers, loss)
        self.fresh.wait(c.inbox, [k for k in c.graphs.senders_to(c.id, t) if k not in c.presence.unreachable], t, t == self.first_step)

    def candidates(self, t: int, own: Any, reference: Any, num_samples: int, loss: float, notes: dict[str, Any]) -> tuple[ClientCandidates, Any, Any, tuple[int, ...]]:
        """(step ``t``'s candidates, the own model and reference, the senders its rule is told
        of: those it holds a model of); their staleness goes into ``notes``."""
        c = self.client
        held = c.inbox.held_models(c.scenario.network.max_staleness)
        offers = (Offer(k, m.vector, m.num_samples, m.train_loss, stale, m.scores or None) for k, (m, stale) in sorted(held.items()))
        candidates = assemble(Offer(c.id, own, num_samples, loss), offers, c.graphs.senders_to(c.id, t), memory=c.memory)
        self.stale_steps += sum(candidates.staleness)
        notes["staleness"] = {str(k): s for k, s in zip(candidates.senders, candidates.staleness[1:], strict=True)}
        return candidates, own, reference, candidates.senders

    def final(self, steps: int, seconds: float) -> dict[str, Any]:
        return {
            "gossip": {
                "protocol": "async", "steps_per_second": round(steps / seconds, 3) if seconds > 0 else None, "staleness_total": self.stale_steps,
                "paced_seconds": round(self.client.presence.paced_seconds, 3), "fresh_seconds": round(self.fresh.seconds, 3),
            },
        }


class Freshness:
    """What a client waits for after sending step ``t``: the next model of each neighbour stepping
    with it (of one keeping pace, its step-``t`` model; of one behind, the one after the model
    held), for a grace (:data:`FACTOR` times the transport's ``message_seconds``, sent to answered;
    at least :data:`FLOOR`, at most ``timeout``); on (re)start, a first model of each neighbour, at
    most ``timeout``. A straggler (:data:`PACE`, :data:`WINDOW`: slower, not merely behind) is not
    waited for, so it slows only itself. So where neighbours step at one speed a step aggregates
    models of that step, as the batched engine's clock does: a message between processes takes
    about as long as a local step of a small model, and aggregating each neighbour's previous step
    at every step halves what a step learns. And a client that got ahead (a wait that ran out, a
    scheduler's whim) waits as one behind it does: waited for but not waiting, it would step ever
    faster, and its neighbours would aggregate its models of hundreds of steps before or after
    theirs; as it is, the one behind waits for nobody ahead and closes the gap."""

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
    """Every answer of the Byzantine ``client`` (see the module); returns what its final file
    adds. Its checkpoints are labelled with the newest step it answered, every
    ``checkpoint.every`` of them, and keep its attack's generator and standing and the step it
    last answered each neighbour at; resumed, it answers only what is newer."""
    sc = client.scenario
    inbox: LatestInbox = client.inbox
    byzantine = client.topology.byzantine
    gen = torch.Generator().manual_seed(derive_seed(sc.seed, "attack", client.id))
    loop_start, cpu_start, started_at = time.monotonic(), time.process_time(), time.time()
    honest = tuple(k for k in client.neighbours if k not in byzantine)
    answered = dict.fromkeys(honest, -1)  # per honest neighbour, the label it was last answered at
    last = last_labels(client.graphs, client.id, honest, sc.rounds)
    step = ByzantineStep(
        sc, client.id, client.attack, gen, lie=scenario_lie(sc, client.graphs, byzantine, client.id, client.plausible.max_scores), byzantine=byzantine,
    )
    newest = -1  # the newest label it answered at: its checkpoints' round
    if client.resumed is not None:
        restore_attack(client, gen, step)
        answered.update(answered_of(client, honest))
        newest = client.resumed.round
        client.resume.continue_at(newest + 1, newest + 1, {})
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
        reported = step.reported(label)
        claims = {"num_samples": claimed_size, "train_loss": claimed_loss, "scores": reported, "chunk_bytes": sc.network.chunk_bytes}
        silent = send_crafted(client, crafted, {k: held[k].round for k in due}, claims)
        for k in due:
            answered[k] = held[k].round
        record = byzantine_record(
            label, list(senders), silent, crafted, client.transport.bytes_sent - sent0, inbox.bytes_received - recv0, reported=reported,
        )
        record["answered"] = {str(k): held[k].round for k in due}  # each neighbour answered, at its model's label
        client.results.write(record)
        client.link.send(link_messages.round_event(client.id, label))
        crafts += 1
        before, newest = newest, max(newest, label)
        # A checkpoint when its newest label passed one of the steps that end with one.
        if sc.checkpoint.every and any(checkpoint_due(t, sc.rounds, sc.checkpoint.every) for t in range(before + 1, newest + 1)) and newest < sc.rounds - 1:
            answers = {str(k): v for k, v in answered.items()}
            client.resume.save(newest, generators={"attack": gen.get_state().numpy()}, answered=answers, **step.state())
        del received, messages, held, crafted
    return {"attack": sc.attack.name, **loop_times(loop_start, cpu_start, started_at), "gossip": {"protocol": "async", "crafts": crafts}}


def answered_of(client, honest) -> dict[int, int]:
    """Per honest neighbour, the label the resumed Byzantine ``client`` last answered it at, as
    its checkpoint kept them; :class:`CheckpointError` naming the file if they are unusable."""
    kept = client.resumed.counters.get("answered", {})  # none in a round protocol's checkpoint
    try:
        out = {int(k): v for k, v in kept.items()}
    except (AttributeError, TypeError, ValueError):
        out = None
    if out is None or not all(k in honest and type(v) is int and v >= -1 for k, v in out.items()):
        raise CheckpointError(f"checkpoint {client.checkpoint_file}: its answered labels are unusable ({kept!r}); delete it to start over")
    return out
