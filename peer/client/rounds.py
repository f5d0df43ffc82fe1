"""A client process's round beyond what it writes (:mod:`peer.round.records`): what the round
protocol's round aggregates (:class:`RoundGather`), its end (the record written, the launcher
told, a checkpoint when due), its pace when it runs slower than the machine, and how many
missed deadlines make a neighbour gone."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from dfedrw.peer.client import link_messages
from dfedrw.peer.client.checkpoint import memory_counters
from dfedrw.peer.client.rejoin import coordinate_median
from dfedrw.peer.learning.models import get_vector
from dfedrw.peer.round.candidates import ClientCandidates, Offer, assemble
from dfedrw.peer.round.records import checkpoint_due, evaluation_due, test_measures
from dfedrw.peer.transport.heap_trim import release_free_heap

log = logging.getLogger("dfedrw.peer.client.client")


class RoundGather:
    """The round protocol's part of an honest client's round (``Client._run_honest``): where a
    resumed client goes on (:meth:`~peer.client.rejoin.Resume.rejoin`), and what round ``r``
    aggregates: its senders' round-``r`` models that came by the deadline (:class:`Liveness`)."""

    unit = "round"  # what its progress lines count
    gossip = False  # its candidates carry no staleness

    def __init__(self, client) -> None:
        self.client = client
        self.liveness = Liveness(client.scenario.network.max_missed_rounds)

    def first(self, num_samples: int) -> int:
        c = self.client
        return c.resume.rejoin(get_vector(c.model), num_samples) if c.resumed is not None else 0

    def send(self, r: int, own: Any, num_samples: int, loss: float) -> None:
        c = self.client
        c._send_all(r, own, num_samples, c.graphs.receivers_of(c.id, r), loss)

    def candidates(self, r: int, own: Any, reference: Any, num_samples: int, loss: float, notes: dict[str, Any]) -> tuple[ClientCandidates, Any, Any, tuple[int, ...]]:
        """(round ``r``'s candidates, the own model and reference, the senders its rule is told
        of: the round's in-neighbours); what the round did beyond that goes into ``notes``."""
        c = self.client
        senders = c.graphs.senders_to(c.id, r)
        expected = c.presence.expected(r, frozenset(senders))
        got, passed = c.resume.wait(r, expected)
        expected -= passed
        self.liveness.update(c.inbox, expected, got)
        ids = sorted(got)
        if r == c.resume.stale_round and got:
            # Resumed far behind its neighbours: its own model is many rounds stale, and one vote
            # among theirs would pull every aggregate back. It takes the coordinate-wise median of
            # their models as its own (not the mean: one Byzantine of three cannot set it).
            own = reference = coordinate_median(torch.stack([got[k].vector for k in ids]))
            c.resume.stale_round = None
            c.resume.resumed_from[-1]["took_neighbours_model"] = notes["took_neighbours_model"] = True
            log.warning("client %d: round %d: took its neighbours' median model in place of its stale one", c.id, r)
        elif r == c.resume.stale_round:
            c.resume.stale_round = r + 1  # no neighbour model this round: try again in the next
        release_free_heap()
        offers = (Offer(k, got[k].vector, got[k].num_samples, got[k].train_loss, reports=got[k].scores or None) for k in ids)
        return assemble(Offer(c.id, own, num_samples, loss), offers, expected, memory=c.memory), own, reference, senders

    def final(self, steps: int, seconds: float) -> dict[str, Any]:
        return {}


def end_of_round(client, r: int, loss: float, record: dict[str, Any], model: Any, last: dict[str, float], *, step: str = "round") -> dict[str, float]:
    """The end of honest ``client``'s round ``r`` (asynchronous gossip: its step, as ``step`` says):
    the evaluation when due, ``record`` written, the launcher told, a progress line now and then,
    a checkpoint when due (``model``: the aggregate the parameters view, saved as it is, not
    copied). Returns the latest test measures (``last`` when none were due)."""
    sc = client.scenario
    if evaluation_due(r, sc.rounds, sc.eval.every):
        last = test_measures(client.model, client.data, client.backdoor)
        record.update(last)
    client.results.write(record)
    client.link.send(link_messages.round_event(client.id, r, loss, accuracy=last.get("accuracy"), global_accuracy=last.get("global_accuracy")))
    if (r + 1) % max(1, sc.rounds // 20) == 0 or r == sc.rounds - 1:
        # A progress line for whoever reads this client's log (docker-compose logs, torchrun).
        acc = f", local accuracy {last['accuracy']:.2f}%" if last else ""
        log.info("client %d %s %d/%d: train loss %.4f%s", client.id, step, r + 1, sc.rounds, loss, acc)
    if checkpoint_due(r, sc.rounds, sc.checkpoint.every):
        generators, arrays, pos = client.trainer.state()
        client.resume.save(r, generators=generators, arrays=arrays, vector=model.numpy(), trainer_pos=pos, **memory_counters(client.memory))
    return last


class Pace:
    """A client slower than the machine (``speed`` in (0, 1], :meth:`Scenario.speed_of`): after
    each piece of work timed with :meth:`work` it waits ``1/speed - 1`` times as long, so the work
    takes ``1/speed`` times as long in all (``waited``: seconds); at speed 1 it times nothing."""

    def __init__(self, speed: float) -> None:
        self.extra = 1.0 / speed - 1.0
        self.waited = 0.0

    @contextmanager
    def work(self) -> Iterator[None]:
        if not self.extra:
            yield
            return
        start = time.monotonic()
        yield
        wait = self.extra * (time.monotonic() - start)
        time.sleep(wait)
        self.waited += wait


@dataclass
class Liveness:
    """Consecutive missed deadlines per peer; past the limit a peer is not waited for
    (``store.set_gone``). ``own_id`` (default: the store's) and the words of the warning name
    whose peers they are and what they miss (a colluder's pools as well as a neighbour's models)."""

    limit: int
    own_id: int | None = None
    peer: str = "neighbour"
    missing: str = "deadlines"
    missed: dict[int, int] = field(default_factory=dict)
    given_up: set[int] = field(default_factory=set)  # marked gone here, not since waited for

    def update(self, store, expected: frozenset[int], arrived: Mapping[int, Any]) -> None:
        for k in expected:
            if k in self.given_up:
                # Waited for again (it came back): it gets the same number of deadlines as at
                # first, and is given up again when it misses them all.
                self.given_up.discard(k)
                self.missed[k] = 0
            if k in arrived:
                self.missed[k] = 0
            else:
                self.missed[k] = self.missed.get(k, 0) + 1
                if self.missed[k] >= self.limit:
                    own = store.own_id if self.own_id is None else self.own_id
                    log.warning("client %d: %s %d missed %d %s, no longer waiting for it", own, self.peer, k, self.limit, self.missing)
                    store.set_gone(k)
                    self.given_up.add(k)
