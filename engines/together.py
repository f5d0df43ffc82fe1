"""``engine.name = "batched"``: every client of a scenario at once, in this process.

The honest clients' models are the rows of one ``[clients, params]`` tensor on one device. A round
is, for all of them together: the local SGD step(s) (:func:`~dfedrw.engines.steps.train_together`),
the Byzantine clients' messages (each attack called on the rows its neighbours sent it, as a
Byzantine process would), and each client's aggregation rule on the rows its neighbours sent it.
Nothing is serialised, nothing waits, no threads: when time can change what happens (emulated
links, slow clients, ``[clock]`` compute) a simulated clock says which models each receiver has
by its deadline, and under a compression each receiver aggregates the models as it would rebuild
them (:mod:`dfedrw.engines.network`).

It is the same experiment as the other engines, not a re-implementation of it: the partition,
graph, Byzantine placement, initial models, minibatch order (:class:`~dfedrw.peer.learning.training.BatchOrder`),
attack noise, the rule, TPM, CRS and attack classes and the plausibility checks a receiver
applies are the ones the clients use, drawn from the same seeds. Floats may differ in the last
bits (a batched matrix product sums in another order), see ``tests/integration/test_engine_parity.py``.

Its results folder has the layout and keys of every run (``scenario.toml``, ``peers/<id>.jsonl``,
``peers/<id>.json``, ``summary.json``); byte counts are the simulated links' with a clock, else 0
(nothing was sent), and ``summary.json`` says ``"engine": "batched"``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from dfedrw.engines.gossip import run_gossip
from dfedrw.engines.layout import choose_layout
from dfedrw.engines.run import BatchedRun
from dfedrw.engines.steps import aggregate_together, rule_groups, train_together
from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.learning.model_matrix import ManyEvaluator


def batch_key(scenario: Scenario) -> tuple:
    """What runs must share to be rows of one batch (:func:`run_together`): the data set and model
    (one parameter shape), local training (one SGD step for all rows), rounds and evaluation rounds
    (one loop), device, threads and layout. Seeds, partitions, graphs, rules, attacks may differ."""
    t = scenario.train
    return (
        scenario.engine.name, scenario.engine.device, scenario.engine.threads, scenario.engine.layout, scenario.data.name, t.model, t.hidden, t.lr,
        t.batch_size, t.local_steps, t.local_epochs, t.momentum, t.weight_decay, t.lr_schedule, t.lr_gamma, t.lr_step,
        scenario.rounds, scenario.eval.every, scenario.network.protocol,
    )


def _share(on_round: Callable[[int], None] | None, i: int, count: int, rounds: int) -> Callable[[int], None] | None:
    """Run ``i`` of ``count`` run one after the other: its step ``t`` done reported to
    ``on_round`` as the round of the whole batch's progress it makes (each once, in order)."""
    if on_round is None:
        return None
    last = [(i * rounds) // count - 1]

    def on_step(t: int) -> None:
        r = (i * rounds + t + 1) // count - 1
        for done in range(last[0] + 1, r + 1):
            on_round(done)
        last[0] = max(last[0], r)

    return on_step


def run_together(runs: list[BatchedRun], on_round: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Run several scenarios of one :func:`batch_key` as one batch: their clients are rows of
    the same products (local steps, scoring, mixing), each run's attacks, intake checks,
    records and results folder its own, as if it had run alone. Returns the summaries."""
    keys = {batch_key(run.scenario) for run in runs}
    if len(keys) != 1:
        raise ValueError(f"runs of one batch must share the model, training, rounds and device; got {len(keys)} different settings")
    sc = runs[0].scenario
    if sc.network.asynchronous:
        # No rounds to share: each run's steps on its own clock (engines/gossip.py), one
        # run after the other; progress as the share of all their steps done.
        return [run_gossip(run, _share(on_round, i, len(runs), sc.rounds)) for i, run in enumerate(runs)]
    rules = [run.rules[k] for run in runs for k in run.honest]
    groups = rule_groups(rules)
    scorer = ManyEvaluator()
    start = time.monotonic()
    threads = torch.get_num_threads()
    torch.set_num_threads(sc.engine.threads)
    interrupted = False
    loop_start, cpu_start = time.monotonic(), time.process_time()
    try:
        for run in runs:
            run.begin()
        choose_layout(runs)
        loop_start, cpu_start = time.monotonic(), time.process_time()
        dynamic = any(run.graphs.dynamic for run in runs)
        for r in range(sc.rounds):
            for run in runs:
                run._reference = run.models.to("cpu", copy=True)  # the local steps update the models in place
                if r and (run.graphs.dynamic or run.network.clock is not None):
                    run.begin_round(r)
            if dynamic and r:
                # A schedule changes what a rule is told from round to round.
                rules = [run.rules[k] for run in runs for k in run.honest]
                groups = rule_groups(rules)
            losses = train_together(runs, r)
            parts = [run.before_aggregation(r, loss) for run, loss in zip(runs, losses, strict=True)]
            results = aggregate_together(r, sc.rounds, [p for _, p in parts], groups, scorer, rules)
            start_row = 0
            for run, (by_id, part) in zip(runs, parts, strict=True):
                n = len(run.honest)
                run.end_round(r, by_id, part, results[start_row : start_row + n])
                start_row += n
            if on_round is not None:
                on_round(r)
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM (stop_on_signals): the rounds logged so far stay, and each run's
        # summary says it was interrupted (a sweep runs it again).
        interrupted = True
    finally:
        torch.set_num_threads(threads)
        for run in runs:
            run.close()
    loop = {"loop_seconds": round(time.monotonic() - loop_start, 3), "loop_cpu_seconds": round(time.process_time() - cpu_start, 3)}
    wall = round(time.monotonic() - start, 3)
    return [run.finish(loop, wall, interrupted=interrupted) for run in runs]
