"""The pieces of a batched round, shared by :func:`~dfedrw.engines.together.run_together` (the round
protocol) and :mod:`dfedrw.engines.gossip` (asynchronous gossip): the groups of clients that share a
rule, the local steps of many clients at once, and their aggregation over one pool of candidates."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from dfedrw.engines.run import BatchedRun, Candidates
from dfedrw.peer.aggregation import Aggregate, RoundBatch
from dfedrw.peer.aggregation.rules import finite_rows
from dfedrw.peer.learning.training import sgd_update
from dfedrw.peer.learning.model_matrix import ManyEvaluator, softmax_regression_grads


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - a rule whose equality cannot be decided is its own group
        return False


def rule_groups(rules: list[Any]) -> list[tuple[Any, list[int]]]:
    """Positions of equal rules (same class, same settings), in first-seen order: a rule with a
    batched method is called once a round for its whole group. A rule may say what it is grouped
    by (``batch_group()``, a hashable value): Flame leaves out its seed, which each client draws
    for itself, so one call takes every client's round (each its own rule: ``RoundBatch.rules``).
    Hashable rules (the built-in ones are frozen dataclasses) are grouped through a dict, so 10,000
    clients each with its own rule cost 10,000 lookups rather than 50 million comparisons; the
    others are compared with each group found so far."""
    groups: list[tuple[Any, list[int]]] = []
    by_key: dict[Any, list[int]] = {}
    for c, rule in enumerate(rules):
        group = getattr(rule, "batch_group", None)
        key = (type(rule), rule if group is None else group())
        try:
            members, hashable = by_key.get(key), True
        except Exception:  # noqa: BLE001 - unhashable, or an equality that cannot be decided
            members, hashable = next((m for r, m in groups if _same(r, rule)), None), False
        if members is None:
            members = []
            groups.append((rule, members))
            if hashable:
                by_key[key] = members
        members.append(c)
    return groups


def train_together(runs: list[BatchedRun], r: int = 0) -> list[list[float]]:
    """Round ``r``'s local SGD steps of every client of ``runs`` (runs of one :func:`batch_key`);
    returns each run's clients' mean minibatch loss. The clients' losses are independent, so the
    gradient of their sum with respect to the stacked ``[clients, params]`` parameters is each
    client's own gradient in its own row. The runs whose minibatches have one width share one
    product; a run with a padded minibatch (a shard smaller than the batch size) or with clients
    done with the round's steps (``train.local_epochs`` over shards of different sizes) has its own.
    Each step is an :func:`~dfedrw.peer.learning.training.sgd_update` of the rows, momentum buffers
    kept per run (as each client keeps its own)."""
    t = runs[0].scenario.train
    lr = t.lr_at(r, runs[0].scenario.rounds)
    totals = [[0.0] * len(run.honest) for run in runs]
    for s in range(max(max(run.steps) for run in runs)):
        active = [run.active_rows(s) for run in runs]
        picks = [run.picks(rows) for run, rows in zip(runs, active, strict=True)]
        groups: dict[Any, list[int]] = {}
        for i, (index, weight) in enumerate(picks):
            if active[i] is not None and not len(active[i]):
                continue
            groups.setdefault(index.shape[1] if weight is None and active[i] is None else ("own", i), []).append(i)
        for members in groups.values():
            if all(runs[i].train_x is runs[members[0]].train_x for i in members):  # one training set: one gather
                index = torch.cat([picks[i][0] for i in members])
                x = runs[members[0]].train_features(runs[members[0]].train_x.index_select(0, index.view(-1))).view(*index.shape, -1)
                y = runs[members[0]].train_y.index_select(0, index.view(-1)).view(index.shape)
            else:
                x = torch.cat([runs[i].train_features(runs[i].train_x[picks[i][0]]) for i in members])
                y = torch.cat([runs[i].train_y[picks[i][0]] for i in members])
            if any(runs[i].augment[0] is not None for i in members):
                x = torch.cat([runs[i].augmented(part, active[i], picks[i][1]) for i, part in zip(members, x.split([len(picks[i][0]) for i in members]), strict=True)])
            rows = [runs[i].models if active[i] is None else runs[i].models[active[i]] for i in members]
            models = (torch.cat(rows) if len(members) > 1 else rows[0]).detach()
            weight = picks[members[0]][1]
            # Softmax regression: its gradient composed without autograd (the same values).
            step = softmax_regression_grads(runs[members[0]].model, models, x, y, weight)
            if step is None:
                models.requires_grad_()
                losses = runs[members[0]].model.minibatch_losses(models, x, y, weight)
                (grads,) = torch.autograd.grad(losses.sum(), models)
            else:
                losses, grads = step
            models = models.detach()
            if t.momentum or t.weight_decay:
                held = [runs[i].momentum for i in members]
                buffer = None if any(b is None for b in held) else torch.cat(
                    [b if active[i] is None else b[active[i]] for i, b in zip(members, held, strict=True)]
                )
                buffer = sgd_update(models, grads, buffer, lr=lr, momentum=t.momentum, weight_decay=t.weight_decay)
            else:
                models.add_(grads, alpha=-lr)
                buffer = None
            stepped = models
            values = losses.tolist()
            start = 0
            for i in members:
                run = runs[i]
                n = len(run.honest) if active[i] is None else len(active[i])
                part = stepped[start : start + n] if len(members) > 1 else stepped
                moment = None if buffer is None else (buffer[start : start + n] if len(members) > 1 else buffer)
                if active[i] is None:
                    run.models = part
                    run.momentum = moment
                else:
                    run.models = run.models.index_copy(0, active[i], part)
                    if moment is not None:
                        run.momentum = run.momentum.index_copy(0, active[i], moment)
                positions = range(len(run.honest)) if active[i] is None else active[i].tolist()
                for c, v in zip(positions, values[start : start + n], strict=True):
                    totals[i][c] += v
                start += n
    return [[x / n for x, n in zip(total, run.steps, strict=True)] for total, run in zip(totals, runs, strict=True)]


def aggregate_together(
    r: int, total_rounds: int, parts: list[Candidates], groups: list[tuple[Any, list[int]]], scorer: ManyEvaluator,
    rules: list[Any] | None = None,
) -> list[Aggregate]:
    """Every honest client of several runs aggregated at once: one pool of candidates (each
    run's rows after the runs before it), each group of clients sharing a rule called once
    (its ``batched`` method, else per client; ``rules``: each client's own, which the group's
    batched call reads where they differ). Returns the aggregates in the clients' order."""
    offsets = np.cumsum([0] + [p.count for p in parts[:-1]]).tolist()
    pieces = [piece for p in parts for piece in p.pieces]
    vectors = torch.cat(pieces) if len(pieces) > 1 else pieces[0]  # one copy for every run's rows
    # Finite pooled rows, for every rule and the scorer: as the intake found them, or checked here.
    if all(p.finite is not None for p in parts):
        finite = torch.tensor([ok for p in parts for ok in p.finite], dtype=torch.bool)
    else:
        finite = finite_rows(vectors)
    batch = RoundBatch(
        round=r, vectors=vectors, finite_pool=finite,
        rows=tuple(tuple(i + off for i in c.models) for p, off in zip(parts, offsets, strict=True) for c in p.clients),
        ids=tuple(c.ids for p in parts for c in p.clients), num_samples=tuple(c.sizes for p in parts for c in p.clients),
        declared_losses=tuple(c.losses for p in parts for c in p.clients), evaluate=tuple(e for p in parts for e in p.evaluate),
        evaluate_many=functools.partial(scorer, finite=finite), references=torch.cat([p.reference for p in parts]) if len(parts) > 1 else parts[0].reference,
        total_rounds=total_rounds, runs=tuple(i for i, p in enumerate(parts) for _ in p.clients) if len(parts) > 1 else None,
        rules=None if rules is None else tuple(rules),
        staleness=tuple(c.staleness for p in parts for c in p.clients) if all(p.gossip for p in parts) else None,
        reports=tuple(c.reports for p in parts for c in p.clients), memory=tuple(c.memory for p in parts for c in p.clients),
    )
    results: list[Any] = [None] * len(batch)
    for rule, members in groups:
        if hasattr(rule, "batched"):
            sub = batch.select(members) if len(members) < len(batch) else batch
            for c, agg in zip(members, rule.batched(sub), strict=True):
                results[c] = agg
        else:
            for c in members:
                results[c] = (rule if rules is None else rules[c])(batch.one(c))
    return results
