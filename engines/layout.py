"""Which layout the batched engine runs its models in (``engine.layout``), picked once per batch
before the first round and recorded in every run's results.

A model with a layer plan (a stack of Linear and elementwise layers) runs as batched matrix
products whatever the setting. Any other model (the convolutional ones) runs in one of
:attr:`~dfedrw.peer.learning.model_matrix.FlatModel.LAYOUTS`: ``loop``, each model called in
turn, or ``vmap``, every model in one call per layer (grouped convolutions). On the CPU ``loop``
is the faster (1.3x for LeNet-5, 1.5x for ResNet-20: docs/gpu.md), so ``auto`` takes it there
without measuring and the CPU's results do not depend on a timing. On another device ``auto``
times both on the run's own work (:func:`layout_work`) and keeps the faster: which wins on a GPU
depends on the model, the client count and the card. The two layouts compute the same function;
their floats may differ in the last bits (a grouped convolution sums in another order), so a run
on a GPU under ``auto`` is reproducible up to that."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

# The layout the CPU takes under ``auto`` without timing (None: time it there too).
CPU_RULE: str | None = "loop"
# Clients whose local step the measurement times: the loop's time grows with the count and
# vmap's much less, so a few dozen rows show which wins without costing a round of 10,000.
MEASURED_ROWS = 64
MEASURED_OWNERS = 4
# Timed repetitions of each layout, after one untimed (kernel selection, caches); the least counts.
REPEATS = 2


def choose_layout(runs: list[Any]) -> dict[str, Any]:
    """Set the layout of every run's model (runs of one batch share the setting) and return
    what each run records: ``layout``, ``layout_choice`` (``layer plan``, ``engine.layout``,
    ``cpu rule`` or ``measured``) and, when measured, ``layout_seconds`` per layout."""
    run = runs[0]
    model, setting = run.model, run.scenario.engine.layout
    if model.plan is not None:
        record: dict[str, Any] = {"layout": "products", "layout_choice": "layer plan"}
    elif setting != "auto":
        record = {"layout": setting, "layout_choice": "engine.layout"}
    elif run.device.type == "cpu" and CPU_RULE is not None:
        record = {"layout": CPU_RULE, "layout_choice": "cpu rule"}
    else:
        seconds = {layout: measure(run, layout) for layout in model.LAYOUTS}
        record = {"layout": min(seconds, key=seconds.get), "layout_choice": "measured", "layout_seconds": seconds}
    for each in runs:
        if model.plan is None:
            set_layout(each, record["layout"])
        each.layout = record
    return record


def set_layout(run: Any, layout: str) -> None:
    """Run ``run``'s models in ``layout``: its local steps' and its clients' scoring (each
    client's evaluator holds a model of its own)."""
    run.model.layout = layout
    for evaluator in run.aux.values():
        evaluator.model.layout = layout


def measure(run: Any, layout: str, repeats: int = REPEATS) -> float:
    """Seconds of :func:`layout_work` in ``layout`` on ``run``'s device (the least of
    ``repeats`` after one untimed), the model's layout restored after."""
    before = run.model.layout
    set_layout(run, layout)
    try:
        work = layout_work(run)
        work()
        best = float("inf")
        for _ in range(repeats):
            _synchronize(run.device)
            start = time.perf_counter()
            work()
            _synchronize(run.device)
            best = min(best, time.perf_counter() - start)
        return round(best, 6)
    finally:
        set_layout(run, before)


def layout_work(run: Any) -> Callable[[], None]:
    """A round's two kinds of model calls on ``run``'s data, changing nothing of the run: one
    local step's gradients for up to :data:`MEASURED_ROWS` clients (each on the first rows of
    its shard, no minibatch drawn) and the scoring of up to :data:`MEASURED_OWNERS` clients'
    candidates (their own model and their neighbours') on their auxiliary sets."""
    count = min(len(run.honest), MEASURED_ROWS)
    models = run.models[:count].detach().clone()
    sizes = torch.diff(torch.cat([run.offsets, run.offsets.new_tensor([len(run.shard_rows)])]))[:count]
    width = max(1, min(run.scenario.train.batch_size, int(sizes.min())))
    rows = run.shard_rows[run.offsets[:count, None] + torch.arange(width, device=run.offsets.device)]
    x = run.train_features(run.train_x.index_select(0, rows.view(-1))).view(count, width, -1)
    y = run.train_y.index_select(0, rows.view(-1)).view(count, width)
    owners = []
    for k in run.honest[:MEASURED_OWNERS]:
        neighbours = [run.row[j] for j in sorted(run.topology.graph.neighbors(k)) if j in run.row]
        owners.append((run.aux[k], run.models[[run.row[k], *neighbours]].detach()))

    def work() -> None:
        rows_ = models.clone().requires_grad_()
        losses = run.model.minibatch_losses(rows_, x, y)
        torch.autograd.grad(losses.sum(), rows_)
        with torch.no_grad():
            for evaluator, candidates in owners:
                evaluator.score(candidates)

    return work


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
