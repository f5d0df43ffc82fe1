"""The robust rules' batched paths against a hand-vectorised version of each, on a grid's own rounds.

A few runs of each robust method of the grid run as one batch of the batched engine (as a sweep
runs them); the calls of the rules' batched paths in the last ``--keep`` rounds are recorded
with their inputs. Each recorded call is then timed three ways, on the same inputs:

* ``engine``: the rule's own batched path (``rule.batched(batch)``), what a sweep runs: bit for
  bit the rule's one-client call, every client's aggregate packaged with its weights;
* ``vec64``: a hand-vectorised version (below): the clients with one number of candidates as one
  ``[clients, candidates, D]`` tensor, each step one tensor operation for all of them, float64
  as the engine computes; only the choices that are one client's own (Flame's clustering) run per
  client; tensors out, nothing packaged;
* ``vec32``: the same in float32.

Printed per rule: milliseconds per run and round (10 honest clients) of each, the ratios, and
how far each hand-vectorised version's results are from the engine's: the largest model
difference relative to the model's largest entry, the largest weight difference, and the
clients whose chosen candidates (those of nonzero weight) differ. The hand-vectorised versions
compute distances from Gram matrices (``|a|^2 + |b|^2 - 2 a.b``), not from differences, and sum
in another order (in float32, in another precision too); so a close decision may come out the
other way, and the last count shows how often it did.

    python bench/rules_floor.py
    python bench/rules_floor.py --runs 4 --rounds 60 --keep 10 --repeat 5

What it answers: how much of a rule's cost a rewrite that vectorises it across clients could
remove (the gap between ``engine`` and ``vec64``), and what float32 would add (``vec32``).
CPU time (``time.process_time``), torch on one thread, as in a sweep's children.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
FAMILIES = ("median", "trimmed_mean", "multi_krum", "flame", "balance")


def groups(batch, finite: list[bool], dtype: torch.dtype):
    """The clients of ``batch`` by their number of finite candidates: (clients, their
    candidates' senders [clients, count], the candidates [clients, count, D] in ``dtype``), each
    client's own model first."""
    by_count: dict[int, list[tuple[int, list[int], list[int]]]] = collections.defaultdict(list)
    for c, (rows, ids) in enumerate(zip(batch.rows, batch.ids, strict=True)):
        kept = [(r, i) for r, i in zip(rows, ids, strict=True) if finite[r]]
        by_count[len(kept)].append((c, [r for r, _ in kept], [i for _, i in kept]))
    pool = batch.vectors.to(dtype)
    for count, members in by_count.items():
        if count == 0:
            continue
        index = torch.tensor([rows for _, rows, _ in members], dtype=torch.long)
        senders = torch.tensor([ids for _, _, ids in members], dtype=torch.long)
        yield [c for c, _, _ in members], senders, pool.index_select(0, index.view(-1)).view(len(members), count, -1)


def sort_candidates(x: torch.Tensor) -> torch.Tensor:
    """``x [clients, count, D]`` sorted along dim 1 by a sorting network (elementwise minima and
    maxima over whole ``[clients, D]`` slices: many times faster here than ``torch.sort(dim=1)``,
    which sorts each column of a few values on its own)."""
    from dfedrw.peer.aggregation.coordinate import sorting_network

    rows = list(x.unbind(1))
    for i, j in sorting_network(len(rows)):
        rows[i], rows[j] = torch.minimum(rows[i], rows[j]), torch.maximum(rows[i], rows[j])
    return torch.stack(rows, dim=1)


def median(rule, batch, finite, dtype):
    out = []
    for clients, _, x in groups(batch, finite, dtype):
        count = x.shape[1]
        ordered = sort_candidates(x)
        low, high = ordered[:, (count - 1) // 2], ordered[:, count // 2]
        hits = ((x == low[:, None]) | (x == high[:, None])).sum(dim=2).to(dtype)
        out.append((clients, (low + high) / 2, hits / hits.sum(dim=1, keepdim=True)))
    return out


def trimmed_mean(rule, batch, finite, dtype):
    rules = batch.rules or (rule,) * len(batch)
    out = []
    for clients, senders, x in groups(batch, finite, dtype):
        count = x.shape[1]
        ordered = sort_candidates(x)
        trims = torch.tensor([rules[c]._trim(count) for c in clients])
        for trim in trims.unique().tolist():
            mine = (trims == trim).nonzero().squeeze(1)
            xs, kept = x[mine], ordered[mine, trim : count - trim]
            first, last = kept[:, 0], kept[:, -1]
            inside = (xs >= first[:, None]) & (xs <= last[:, None])
            # Where a value equal to a bound was trimmed too, equal values are kept lower id
            # first (the rule's stable rank), on those columns only.
            tied = torch.zeros_like(first, dtype=torch.bool)
            if trim > 0:
                tied = (ordered[mine, trim - 1] == first) | (ordered[mine, count - trim] == last)
            client, column = tied.nonzero(as_tuple=True)
            if len(client):
                by_id = senders[mine][client].argsort(dim=1)  # each tied column's candidates in id order
                values = xs[client, :, column].gather(1, by_id)  # [P, count]
                earlier = torch.ones(count, count, dtype=torch.bool).tril(-1)  # [i, j]: j < i
                rank = (values[:, None, :] < values[:, :, None]).sum(2) + ((values[:, None, :] == values[:, :, None]) & earlier).sum(2)
                kept_by_id = (rank >= trim) & (rank < count - trim)
                inside[client, :, column] = torch.empty_like(kept_by_id).scatter_(1, by_id, kept_by_id)
            shares = inside.sum(dim=2).to(dtype)
            out.append(([clients[i] for i in mine.tolist()], kept.sum(dim=1) / kept.shape[1], shares / shares.sum(dim=1, keepdim=True)))
    return out


def _gram_distances(x: torch.Tensor) -> torch.Tensor:
    gram = torch.bmm(x, x.transpose(1, 2))
    squares = gram.diagonal(dim1=1, dim2=2)
    return (squares[:, :, None] + squares[:, None, :] - 2 * gram).clamp_(min=0)


def multi_krum(rule, batch, finite, dtype):
    rules = batch.rules or (rule,) * len(batch)
    out = []
    for clients, _, x in groups(batch, finite, dtype):
        count = x.shape[1]
        distances = _gram_distances(x)
        distances.diagonal(dim1=1, dim2=2).fill_(math.inf)
        ordered = distances.sort(dim=2).values
        weights = torch.zeros(len(clients), count, dtype=dtype)
        for i, c in enumerate(clients):  # each client its own f and m
            f, keep = rules[c].num_byzantine, rules[c]._keep(count)
            near = min(max(count - f - 2, 1), count - 1)
            chosen = ordered[i, :, :near].sum(dim=1).sort(stable=True).indices[:keep]
            weights[i, chosen] = 1.0 / keep
        out.append((clients, torch.bmm(weights[:, None], x)[:, 0], weights))
    return out


def flame(rule, batch, finite, dtype):
    from dfedrw.peer.aggregation.flame import _largest_cluster, _noise_seed

    rules = batch.rules or (rule,) * len(batch)
    out = []
    for clients, _, x in groups(batch, finite, dtype):
        count = x.shape[1]
        reference = x[:, 0] if batch.references is None else batch.references[clients].to(dtype)
        updates = x - reference[:, None]
        norms = updates.norm(dim=2)
        # The cosine distances of the models or the updates (``cluster_on``), from float64
        # products whatever ``dtype``: in float32 the distances of near-equal models tie, and the
        # clustering then takes scikit-learn's slow path.
        wide = (x if rule.cluster_on == "models" else updates).to(torch.float64)
        gram = torch.bmm(wide, wide.transpose(1, 2))
        lengths = gram.diagonal(dim1=1, dim2=2).sqrt()
        cosine = (1 - gram / (lengths[:, :, None] * lengths[:, None, :])).clamp_(0, 2).tolist()
        size = count // 2 + 1 if rule.min_cluster_size is None else rule.min_cluster_size
        accepted = torch.tensor([_largest_cluster(cosine[i], size) if count >= 3 else [True] * count for i in range(len(clients))])
        ordered = norms.sort(dim=1).values
        bound = (ordered[:, (count - 1) // 2] + ordered[:, count // 2]) / 2  # the median (two middle values: their mean)
        clip = torch.where(norms > bound[:, None], bound[:, None] / norms, torch.ones_like(norms))
        weights = accepted.to(dtype) / accepted.sum(dim=1, keepdim=True)
        models = reference + torch.bmm((clip * weights)[:, None], updates)[:, 0]
        noise = torch.stack([
            torch.randn(x.shape[2], generator=torch.Generator().manual_seed(_noise_seed(rules[c].seed, batch.ids[c][0], batch.round)), dtype=torch.float32)
            for c in clients
        ]).to(dtype)
        out.append((clients, models + (rule.noise * bound)[:, None] * noise, weights))
    return out


def balance(rule, batch, finite, dtype):
    out = []
    progress = batch.round / batch.total_rounds if batch.total_rounds > 0 else 0.0
    for clients, _, x in groups(batch, finite, dtype):
        own = x[:, 0]
        radius = rule.gamma * math.exp(-rule.kappa * progress) * own.norm(dim=1)
        accepted = (x - own[:, None]).norm(dim=2) <= radius[:, None]
        accepted[:, 0] = False
        taken = accepted.sum(dim=1, keepdim=True)
        weights = torch.where(taken > 0, (1 - rule.alpha) * accepted.to(dtype) / taken.clamp(min=1), torch.zeros((), dtype=dtype))
        weights[:, 0] = torch.where(taken[:, 0] > 0, torch.full_like(weights[:, 0], rule.alpha), torch.ones_like(weights[:, 0]))
        out.append((clients, torch.bmm(weights[:, None], x)[:, 0], weights))
    return out


REFERENCE = {"median": median, "trimmed_mean": trimmed_mean, "multi_krum": multi_krum, "flame": flame, "balance": balance}


def agreement(batch, finite, engine, reference) -> tuple[float, float, int]:
    """How far the hand-vectorised ``reference`` results are from the ``engine``'s: (largest
    |model difference| over the largest |model entry|, largest |weight difference|, clients whose
    chosen candidates, those of nonzero weight, differ)."""
    worst_model, worst_weight, differing = 0.0, 0.0, 0
    for clients, models, weights in reference:
        for i, c in enumerate(clients):
            agg = engine[c]
            model = agg.model.to(torch.float64)
            worst_model = max(worst_model, float((models[i].to(torch.float64) - model).abs().max() / model.abs().max().clamp(min=1e-30)))
            ids = [batch.ids[c][p] for p, r in enumerate(batch.rows[c]) if finite[r]]
            mine = torch.tensor([float(agg.weights.get(s, 0.0)) for s in ids], dtype=torch.float64)
            theirs = weights[i].to(torch.float64)
            worst_weight = max(worst_weight, float((mine - theirs).abs().max()))
            differing += int(not torch.equal(mine > 0, theirs > 0))
    return worst_model, worst_weight, differing


def record_calls(grid: Path, runs_per_method: int, rounds: int, keep: int, work: Path):
    """The rules' batched calls of the last ``keep`` rounds of a batch of the grid's robust runs."""
    from dfedrw.experiments.grid import load_grid
    from dfedrw.experiments.sweep_plan import plan_sweep
    from dfedrw.engines.together import batch_key, run_together
    from dfedrw.engines.run import BatchedRun
    from dfedrw.peer.aggregation import RULE_REGISTRY

    plan = plan_sweep(load_grid(grid), work / "plan")
    robust = [run for run in plan.runs.values() if run.scenario.aggregation.rule in FAMILIES]
    if not robust:
        return {}, collections.Counter()
    by_rule: dict[str, list] = collections.defaultdict(list)
    for run in robust:  # the runs that can share a batch with the first (model, training, rounds)
        if batch_key(run.scenario) == batch_key(robust[0].scenario):
            by_rule[run.scenario.aggregation.rule].append(run)
    chosen = [run for runs in by_rule.values() for run in runs[:: max(1, len(runs) // runs_per_method)][:runs_per_method]]
    calls: dict[str, list] = collections.defaultdict(list)
    originals = {}
    for family in FAMILIES:
        cls = RULE_REGISTRY.get(family)
        originals[family] = cls.batched

        def recorded(self, batch, _family=family, _original=cls.batched):
            if batch.round >= rounds - keep:
                calls[_family].append((self, batch))
            return _original(self, batch)

        cls.batched = recorded
    try:
        run_together([BatchedRun(dataclasses.replace(r.scenario, rounds=rounds), work / "runs" / r.name) for r in chosen])
    finally:
        for family in FAMILIES:
            RULE_REGISTRY.get(family).batched = originals[family]
    return calls, collections.Counter(r.scenario.aggregation.rule for r in chosen)


def clock(call, repeat: int) -> float:
    start = time.process_time()
    for _ in range(repeat):
        call()
    return (time.process_time() - start) / repeat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=Path, default=REPO / "examples" / "grids" / "paper_byzantine_fmnist.toml")
    parser.add_argument("--runs", type=int, default=4, help="runs of each robust rule, all in one batch (default 4)")
    parser.add_argument("--rounds", type=int, default=60, help="rounds the batch runs (default 60)")
    parser.add_argument("--keep", type=int, default=10, help="last rounds whose calls are timed (default 10)")
    parser.add_argument("--repeat", type=int, default=5, help="timings of each call, averaged (default 5)")
    args = parser.parse_args(argv)
    if min(args.runs, args.rounds, args.keep, args.repeat) < 1 or args.keep > args.rounds:
        parser.error("--runs, --rounds, --keep and --repeat must be at least 1, and --keep at most --rounds")
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="rules-floor-"))
    try:
        calls, runs = record_calls(args.grid, args.runs, args.rounds, args.keep, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not calls:
        parser.error(f"{args.grid}: no run uses a rule this bench covers ({', '.join(FAMILIES)})")
    print(f"{'rule':14} {'engine':>8} {'vec64':>8} {'vec32':>8}  {'engine/vec64':>12} {'engine/vec32':>12}")
    agree = []
    for family, recorded in calls.items():
        reference = REFERENCE[family]
        totals = collections.Counter()
        apart = {torch.float64: [0.0, 0.0, 0], torch.float32: [0.0, 0.0, 0]}
        clients = 0
        for rule, batch in recorded:
            finite = batch.finite().tolist()
            totals["engine"] += clock(lambda: rule.batched(batch), args.repeat)
            totals["vec64"] += clock(lambda: reference(rule, batch, finite, torch.float64), args.repeat)
            totals["vec32"] += clock(lambda: reference(rule, batch, finite, torch.float32), args.repeat)
            engine = rule.batched(batch)
            for dtype, far in apart.items():
                model, weight, chose = agreement(batch, finite, engine, reference(rule, batch, finite, dtype))
                far[0], far[1], far[2] = max(far[0], model), max(far[1], weight), far[2] + chose
            clients += len(batch)
        run_rounds = runs[family] * args.keep
        ms = {k: 1000 * v / run_rounds for k, v in totals.items()}
        print(f"{family:14} {ms['engine']:8.2f} {ms['vec64']:8.2f} {ms['vec32']:8.2f}  {ms['engine'] / ms['vec64']:12.2f} {ms['engine'] / ms['vec32']:12.2f}")
        agree.append((family, clients, apart))
    print("ms: CPU milliseconds per run and round (one run's 10 honest clients), the rule's aggregation only")
    print()
    print(f"{'rule':14} {'':>6} {'model diff':>11} {'weight diff':>12} {'clients that chose otherwise':>29}")
    for family, clients, apart in agree:
        for dtype, (model, weight, chose) in apart.items():
            label = "vec64" if dtype == torch.float64 else "vec32"
            print(f"{family:14} {label:>6} {model:11.1e} {weight:12.1e} {f'{chose} of {clients}':>29}")
    print("model diff: largest |difference| over the model's largest |entry|; weight diff: largest |difference|")
    return 0


if __name__ == "__main__":
    sys.exit(main())
