"""What a client's round writes and when, the same under every engine: the round records of an
honest and a Byzantine client, the round's graph in them under a schedule, when an evaluation
and a checkpoint are due, what a client's final file says of its rule, the round loop's clock,
and how many missed deadlines make a neighbour gone. A client process (:mod:`peer.client.client`) and
the batched engine (:mod:`engines.run`) both call these, so that their results folders
cannot drift apart (``tests/integration/test_engine_parity.py`` holds them together)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dfedrw.peer.aggregation.rules import takes_tpm_and_crs
from dfedrw.peer.client import link_messages
from dfedrw.peer.learning.training import evaluate

log = logging.getLogger("dfedrw.peer.client.client")


def evaluation_due(r: int, rounds: int, every: int) -> bool:
    """Whether round ``r`` ends with an evaluation: every ``every`` rounds (0: never) and after
    the last round."""
    return r == rounds - 1 or bool(every and (r + 1) % every == 0)


def checkpoint_due(r: int, rounds: int, every: int) -> bool:
    """Whether round ``r`` ends with a checkpoint: every ``every`` rounds (0: never), not after
    the last round (the final file replaces it)."""
    return bool(every) and (r + 1) % every == 0 and r < rounds - 1


def finite_or_none(x: float) -> float | None:
    """A score as a record keeps it: rounded to 6 places, or None when not finite (JSON has no
    infinity)."""
    x = float(x)
    return round(x, 6) if math.isfinite(x) else None


def test_measures(model: Any, data: Any, backdoor: Any = None) -> dict[str, float]:
    """A client's measures on its test sets, in percent: local and global accuracy, and under a
    backdoor attack (``backdoor``: :func:`~dfedrw.peer.wiring.assembly.scenario_backdoor`'s
    probe) ``attack_success``, the share of triggered global test rows put in the target class."""
    test = data.global_test  # converted once (a client process holds no copy between evaluations)
    out = {
        "accuracy": 100.0 * evaluate(model, data.local_test)["accuracy"],
        "global_accuracy": 100.0 * evaluate(model, test)["accuracy"],
    }
    if backdoor is not None:
        out["attack_success"] = 100.0 * evaluate(model, backdoor.rows(test))["accuracy"]
    return out


def honest_record(
    r: int, train_loss: float, weights: Mapping[int, float], missing: list[int], *,
    scores: Mapping[int, float] | None = None, bytes_sent: int = 0, bytes_received: int = 0, notes: Mapping[str, Any] | None = None,
    seconds: float | None = None,
) -> dict[str, Any]:
    """An honest client's round record: its training loss, the weight its rule gave each
    candidate, bytes on the wire, the neighbours whose model did not come, ``notes`` (what a
    client process adds of a resume), the TPM's score of each candidate where the rule
    scores them, and ``seconds`` since its round loop began at the round's end, where there is
    a clock (wall time for a client, simulated time in a batched engine that keeps one)."""
    record: dict[str, Any] = {
        "round": r,
        "train_loss": train_loss,
        "weights": {str(k): round(float(w), 6) for k, w in weights.items()},
        "bytes_sent": bytes_sent,
        "bytes_received": bytes_received,
        "missing": missing,
    }
    if seconds is not None:
        record["seconds"] = seconds
    record.update(notes or {})
    if scores is not None:
        record["scores"] = {str(k): finite_or_none(v) for k, v in scores.items()}
    return record


def end_of_round(client, r: int, loss: float, record: dict[str, Any], model: Any, last: dict[str, float], *, step: str = "round") -> dict[str, float]:
    """Honest ``client``'s round ``r`` (under asynchronous gossip its step: ``step``) ends with
    ``record``: the evaluation when due, the record written, the launcher told, a progress line
    now and then, a checkpoint when due (``model``: the aggregate whose vector the parameters
    view, saved as it is, not copied). Returns the latest test measures (``last`` when none
    were due)."""
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
        client.resume.save(r, generators=generators, arrays=arrays, vector=model.numpy(), trainer_pos=pos)
    return last


def byzantine_record(
    r: int, received_from: list[int], silent: int, crafted, bytes_sent: int, bytes_received: int, *, pooled_from: list[int] | None = None
) -> dict[str, Any]:
    """A Byzantine client's round record; the attack's note, when it keeps one, under
    ``"attack"``; when colluding, ``"pooled_from"``: the sorted colluders whose pool of the
    round it used, itself included (None: it acts alone, no key)."""
    record: dict[str, Any] = {
        "round": r, "train_loss": None, "weights": {}, "bytes_sent": bytes_sent, "bytes_received": bytes_received,
        "received_from": received_from, "silent_to": silent,
    }
    if pooled_from is not None:
        record["pooled_from"] = sorted(pooled_from)
    if crafted.note:
        record["attack"] = dict(crafted.note)
    return record


def with_round_graph(record: dict[str, Any], graphs, k: int, r: int, told: int | None = None) -> dict[str, Any]:
    """``record`` of client ``k`` with, under a schedule (``graphs.dynamic``), round ``r``'s
    neighbours: ``neighbours``, whose models it was to receive; ``sent_to`` (directed
    schedules), whom it sent to; and ``told_byzantine``, what its rule was told (None: nothing
    told, a Byzantine client). A fixed graph's records stay as they were."""
    if graphs.dynamic:
        record["neighbours"] = list(graphs.senders_to(k, r))
        if graphs.directed:
            record["sent_to"] = list(graphs.receivers_of(k, r))
        if told is not None:
            record["told_byzantine"] = told
    return record


def aggregation_summary(cfg, told: int) -> dict[str, Any]:
    """What an honest client's final file says of its rule (``cfg``, its aggregation settings):
    the rule, how many Byzantine neighbours it was told of, and its TPM and CRS where it scores."""
    out: dict[str, Any] = {"rule": cfg.rule, "told_byzantine": told}
    if takes_tpm_and_crs(cfg.rule):
        out.update(tpm=cfg.tpm, crs=cfg.crs)
    return out


def loop_times(wall_start: float, cpu_start: float, started_at: float) -> dict[str, float]:
    """Wall and CPU seconds of the round loop, and when it started (Unix time: what a launcher
    compares with when it started the process). CPU time is the whole process's (all its
    threads; with the in-process transport, all its clients)."""
    return {
        "loop_seconds": round(time.monotonic() - wall_start, 3), "loop_cpu_seconds": round(time.process_time() - cpu_start, 3),
        "loop_started_at": round(started_at, 3),
    }


class Pace:
    """A client slower than the machine (``speed`` in (0, 1], :meth:`Scenario.speed_of`): after
    each piece of work timed with :meth:`work` it waits ``1/speed - 1`` times as long as the
    work took, so the work takes ``1/speed`` times as long in all. ``waited``: the seconds it
    waited. At speed 1 it times nothing and waits for nothing."""

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
