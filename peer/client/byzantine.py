"""A Byzantine client's round loop (:func:`run_byzantine`, on a :class:`peer.client.client.Client`
built for a Byzantine id, whose parts it uses). It holds no data: each round it waits for the
models of its honest senders of the round, crafts one message per receiver with its attack, and
sends them; with ``attack.colluding`` it first pools what it received with the other colluders
(:mod:`peer.client.collusion`). Under a schedule (:mod:`peer.graph.schedule`) it reaches no one
the schedule does not give it, whomever it sends to: receivers refuse a message from a sender
that is not their in-neighbour in the message's round."""

from __future__ import annotations

import time
from typing import Any

import torch

from dfedrw.peer.transport.heap_trim import release_free_heap
from dfedrw.peer.wiring.plan import derive_seed
from dfedrw.peer.client import link_messages
from dfedrw.peer.client.checkpoint import CheckpointError
from dfedrw.peer.client.rounds import Liveness
from dfedrw.peer.round.byzantine import ByzantineStep, scenario_lie
from dfedrw.peer.round.records import byzantine_record, checkpoint_due, loop_times, with_round_graph
from dfedrw.peer.transport.serde import message_out


def run_byzantine(client) -> dict[str, Any]:
    """Every round of the Byzantine ``client`` (its transport, inbox, collusion, attack, round
    log, presence and resume); returns what its final file adds."""
    sc = client.scenario
    attack = client.attack
    byzantine = client.topology.byzantine
    gen = torch.Generator().manual_seed(derive_seed(sc.seed, "attack", client.id))
    liveness = Liveness(sc.network.max_missed_rounds)
    loop_start, cpu_start, started_at = time.monotonic(), time.process_time(), time.time()
    r = 0
    step = ByzantineStep(
        sc, client.id, attack, gen, lie=scenario_lie(sc, client.graphs, byzantine, client.id, client.plausible.max_scores), byzantine=byzantine,
    )
    silent_before = False  # whether it was silent to a receiver last round
    if client.resumed is not None:
        restore_attack(client, gen, step)
        r = client.resume.rejoin(torch.zeros(sum(s.numel for s in client.specs)), 0)
    while r < sc.rounds:
        r, sent0, recv0 = client.begin_round(r)
        targets = tuple(k for k in client.graphs.receivers_of(client.id, r) if k not in byzantine)
        heard = tuple(k for k in client.graphs.senders_to(client.id, r) if k not in byzantine)
        expected = client.presence.expected(r, frozenset(heard))
        # Twice the deadline after a round in which it was silent to some receiver: those waited
        # out their whole round_timeout for it before they began round r. With one, its clock
        # would run ahead of theirs and, under load, miss their models in the rounds it acts.
        got = client.inbox.wait(r, expected, (2 if silent_before else 1) * sc.network.round_timeout)
        liveness.update(client.inbox, expected, got)
        senders = tuple(k for k in sorted(got) if k not in byzantine)
        honest_msgs = [got[k] for k in senders]
        # The round's matrix itself when every model was decoded into its row, else a stack.
        received = (
            client.inbox.stacked(r, [m.vector for m in honest_msgs]) if honest_msgs else torch.empty(0, sum(s.numel for s in client.specs))
        )
        pooled = client.collusion.exchange(r, senders, received, sc.network.round_timeout) if client.collusion is not None else None
        release_free_heap()
        crafted, claimed_size, claimed_loss = step(
            r, receivers=targets, senders=senders, received=received, sizes=[m.num_samples for m in honest_msgs],
            losses=[m.train_loss for m in honest_msgs], reports={k: m.scores for k, m in zip(senders, honest_msgs, strict=True)},
            **({"colluders": client.collusion.colluders, "pool_senders": pooled.senders, "pool": pooled.vectors} if pooled is not None else {}),
        )
        # Done with what it received this round: only the crafted messages are held now.
        client.inbox.close(r)
        received_from = sorted(got)
        reported = step.reported(r)
        del received, honest_msgs, got
        claims = {"num_samples": claimed_size, "train_loss": claimed_loss, "scores": reported, "chunk_bytes": sc.network.chunk_bytes}
        silent = send_crafted(client, crafted, dict.fromkeys(targets, r), claims)
        silent_before = silent > 0
        record = byzantine_record(
            r, received_from, silent, crafted, client.transport.bytes_sent - sent0, client.inbox.bytes_received - recv0,
            pooled_from=list(pooled.used) if pooled is not None else None, reported=reported,
        )
        client.results.write(with_round_graph(record, client.graphs, client.id, r))
        client.link.send(link_messages.round_event(client.id, r))
        if checkpoint_due(r, sc.rounds, sc.checkpoint.every):
            client.resume.save(r, generators={"attack": gen.get_state().numpy()}, **step.state())
        # The transport holds what it has still to send, and lets each message go once sent.
        crafted = None
        r += 1
    return {"attack": sc.attack.name, **loop_times(loop_start, cpu_start, started_at)}


def send_crafted(client, crafted, labels: dict[int, int], claims: dict[str, Any]) -> int:
    """Send what Byzantine ``client``'s attack crafted, each with the ``claims`` (declared size,
    loss, reported scores, chunk size): first the copies labelled with other rounds (a receiver,
    taking the round's own message last, is still running to count them), then each receiver
    ``k``'s message labelled ``labels[k]``. Returns how many receivers it was silent to."""
    for k, labelled in crafted.extra.items():
        for label, extra in labelled:
            client.transport.send(k, message_out(client.id, label, extra, client.specs, **claims))
    silent = 0
    for k, label in labels.items():
        if crafted.messages[k] is None:
            silent += 1
        else:
            client.transport.send(k, message_out(client.id, label, crafted.messages[k], client.specs, **claims))
    return silent


def restore_attack(client, gen: torch.Generator, step: ByzantineStep) -> None:
    """The resumed Byzantine ``client``'s attack generator and standing, as its checkpoint kept
    them; :class:`CheckpointError` naming the file if the standing is unusable."""
    if "attack" in client.resumed.generators:
        gen.set_state(torch.from_numpy(client.resumed.generators["attack"].copy()))
    try:
        step.restore(client.resumed.counters)
    except ValueError as exc:
        raise CheckpointError(f"checkpoint {client.checkpoint_file}: its attack's standing is unusable ({exc}); delete it to start over") from None
