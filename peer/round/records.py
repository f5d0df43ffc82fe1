"""What a round writes, the same under every engine: honest and Byzantine round records (with the
round's graph under a schedule), when evaluations and checkpoints are due, test measures, a final
file's keys and what it says of the rule, and the round loop's clock. A client process
(:mod:`peer.client`) and the batched engine (:mod:`engines`) both call these, so their results
folders cannot drift apart (``tests/integration/test_engine_parity.py`` holds them together)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from dfedrw.peer.aggregation.rules import takes_tpm_and_crs
from dfedrw.peer.learning.training import logits_of


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


def measures(hits: torch.Tensor, local_rows: torch.Tensor, probe_hits: torch.Tensor | None = None) -> dict[str, float]:
    """A client's test measures, in percent, from which rows of the global test set its model
    classifies right (``hits``, bool [N]): global accuracy, local accuracy (its local test set is
    the rows ``local_rows`` of the global one), and under a backdoor attack ``attack_success``,
    the share of the triggered rows put in the target class (``probe_hits``). Counts of 0/1
    values are exact in float32, so the measures do not depend on how the hits were stacked."""
    out = {
        "accuracy": 100.0 * float(hits.index_select(0, local_rows).float().mean()),
        "global_accuracy": 100.0 * float(hits.float().mean()),
    }
    if probe_hits is not None:
        out["attack_success"] = 100.0 * float(probe_hits.float().mean())
    return out


def test_measures(model: Any, data: Any, backdoor: Any = None) -> dict[str, float]:
    """A client's :func:`measures` with its model (a module): one pass over the global test set
    (converted once; a client process keeps no copy between evaluations) and one over the rows a
    backdoor triggers (:func:`~dfedrw.peer.wiring.assembly.scenario_backdoor`'s probe), if any."""
    test = data.global_test
    hits = logits_of(model, test.x).argmax(1) == test.y
    probe = None
    if backdoor is not None:
        triggered = backdoor.rows(test)
        probe = logits_of(model, triggered.x).argmax(1) == triggered.y
    return measures(hits, data.local_test_index.to(hits.device), probe)


def honest_record(
    r: int, train_loss: float, weights: Mapping[int, float], missing: list[int], *,
    scores: Mapping[int, float] | None = None, bytes_sent: int = 0, bytes_received: int = 0, notes: Mapping[str, Any] | None = None,
    seconds: float | None = None,
) -> dict[str, Any]:
    """An honest client's round record: its training loss, its rule's weight of each candidate,
    bytes on the wire, the neighbours whose model did not come, ``notes`` (what a client process
    adds of a resume), the TPM's scores where the rule scores, and ``seconds`` since the round loop
    began, at the round's end, on its clock if any (wall time, or simulated in a batched engine)."""
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


def byzantine_record(
    r: int, received_from: list[int], silent: int, crafted, bytes_sent: int, bytes_received: int, *, pooled_from: list[int] | None = None,
    reported: Mapping[int, float] | None = None,
) -> dict[str, Any]:
    """A Byzantine client's round record: the attack's note, if any, under ``"attack"``; when
    colluding, ``"pooled_from"``: the sorted colluders whose pool of the round it used, itself
    included (None: alone, no key); ``"reported"``: its messages' scores (``attack.scores``)."""
    record: dict[str, Any] = {
        "round": r, "train_loss": None, "weights": {}, "bytes_sent": bytes_sent, "bytes_received": bytes_received,
        "received_from": received_from, "silent_to": silent,
    }
    if pooled_from is not None:
        record["pooled_from"] = sorted(pooled_from)
    if crafted.note:
        record["attack"] = dict(crafted.note)
    if reported:
        record["reported"] = {str(k): v for k, v in sorted(reported.items())}
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


def final_keys(
    client: int, role: str, *, pid: int, address: str, device: str, wall_seconds: float, rejected: Mapping[str, int], stale_messages: int,
    unsent_messages: Mapping[str, int], refused_calls_by_reason: Mapping[str, int], tls: str, restarts: int = 0, rounds_lost: int = 0,
    resumed_from: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The keys every client's final file has, whatever ran it, in the order they are written
    (``resumed_from``: one entry per resume)."""
    return {
        "id": client, "role": role, "pid": pid, "address": address, "device": device, "completed": True, "wall_seconds": wall_seconds,
        "rejected_messages": sum(rejected.values()), "rejected_by_reason": dict(rejected), "stale_messages": stale_messages,
        "unsent_messages": dict(unsent_messages), "refused_calls_by_reason": dict(refused_calls_by_reason), "tls": tls, "restarts": restarts,
        "rounds_lost": rounds_lost, "resumed_from": list(resumed_from),
    }
