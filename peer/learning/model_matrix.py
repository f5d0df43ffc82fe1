"""Many models at once, each a flat parameter vector, rows of one matrix: their logits, scores and
local-step gradients (:class:`FlatModel`, what the batched engine trains and scores with), the
candidates' scores on a client's auxiliary set (:class:`VectorEvaluator`, the ``evaluate`` a TPM
calls), and the blocks of rows that bound the activations a forward holds."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn import functional as F

from dfedrw.peer.learning.data import Dataset


# Values a block of rows may hold in a model's widest activation: measured on this project's
# convolutional models on the CPU (LeNet-5, ResNet-20), blocks of about 2 M values (8 MB) are
# the fastest (a whole test set at once is 1.5-2.5x slower: the activations leave the caches).
BLOCK_VALUES = 1 << 21
# On another device (a GPU) blocks that small leave it idle between launches: 64 M values
# (256 MB of float32) a block there, enough rows to fill a GPU, and several models' blocks still
# fit beside each other (chosen, not measured).
DEVICE_BLOCK_VALUES = 1 << 26


def activation_width(module: nn.Module, in_features: int) -> int:
    """The most values one input row makes in any layer's output of ``module``: read from a
    forward of one row of zeros (a meta-device forward would cost its kernels' first import,
    seconds; one row costs what one sample does)."""
    widest = [in_features]

    def hook(_module: nn.Module, _inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.dim():
            widest.append(output.numel() // max(1, output.shape[0]))

    device = next(module.parameters()).device
    handles = [m.register_forward_hook(hook) for m in module.modules()]
    try:
        with torch.no_grad():
            module(torch.zeros(1, in_features, device=device))
    finally:
        for h in handles:
            h.remove()
    return max(widest)


_ROWS: "weakref.WeakKeyDictionary[nn.Module, dict[int, int]]" = weakref.WeakKeyDictionary()


def block_rows(module: nn.Module, in_features: int) -> int:
    """Rows per block (at least 1) so that a block's widest activation holds about
    :data:`BLOCK_VALUES` values on the CPU, :data:`DEVICE_BLOCK_VALUES` on another device;
    measured once per module and input width."""
    known = _ROWS.setdefault(module, {})
    if in_features not in known:
        values = BLOCK_VALUES if next(module.parameters()).device.type == "cpu" else DEVICE_BLOCK_VALUES
        known[in_features] = max(1, values // activation_width(module, in_features))
    return known[in_features]


def in_blocks(forward: Any, x: torch.Tensor, rows: int | None) -> torch.Tensor:
    """``forward(x)``, the rows of ``x`` taken ``rows`` at a time when gradients are off (the
    outputs concatenated; every row's output the same as its block's); at once otherwise."""
    if rows is None or len(x) <= rows or torch.is_grad_enabled():
        return forward(x)
    return torch.cat([forward(part) for part in x.split(rows)])


_METRICS = ("accuracy", "loss")  # what an evaluator returns


class VectorEvaluator:
    """Scores flat model vectors on a fixed dataset: the ``evaluate`` a TPM calls. All finite
    candidates go through the model at once (:func:`score_models`: for the project's models, one
    matrix product per layer for every candidate, the data read once); the client's own model is
    never touched."""

    def __init__(self, template: nn.Module, data: Dataset) -> None:
        self.model = FlatModel(_structure(template, data.x.device), data.x.device)
        self.data = data

    @torch.no_grad()
    def __call__(self, vectors: torch.Tensor) -> dict[str, torch.Tensor]:
        finite = torch.isfinite(vectors).all(dim=1).tolist()
        where = [i for i, ok in enumerate(finite) if ok]
        return _metrics(len(vectors), where, self.score(vectors[where]).double().cpu() if where else None)

    def score(self, vectors: torch.Tensor) -> torch.Tensor:
        """:func:`score_models` of finite ``vectors`` on this evaluator's data (on its device)."""
        return score_models(self.model, vectors.to(self.data.x.device, torch.float32), self.data)

    def score_laid_out(self, laid: "_LaidOut", rows: Sequence[int], metrics: Sequence[str] = _METRICS) -> torch.Tensor:
        """:meth:`score` of the pooled ``rows`` of a one-layer model, their weights taken from
        ``laid`` (already in the layout the product reads): the same product on the same
        values, the same scores; of ``metrics`` only (NaN in the other's row)."""
        weight, bias = laid.rows(rows)
        h = self.data.x.t()
        logits = (weight @ h if bias is None else torch.addmm(bias, weight, h)).view(len(rows), laid.out, h.shape[1])
        return _scored(logits, self.data.y, metrics)


def _structure(template: nn.Module, device: torch.device) -> nn.Module:
    """A copy of ``template`` to run flat vectors through: its buffers copied, each parameter
    (which every call replaces with the candidate's values) a placeholder of its shape that
    holds one value, not a copy of the model. On another device than the CPU, a full copy."""
    import copy

    if device.type != "cpu":
        return copy.deepcopy(template)
    memo = {
        id(p): nn.Parameter(torch.zeros((), dtype=p.dtype).expand(p.shape), requires_grad=p.requires_grad)
        for p in template.parameters()
    }
    return copy.deepcopy(template, memo)


def _metrics(count: int, where: list[int], scored: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """``{"accuracy", "loss"}`` of ``count`` candidates: ``scored`` (float64 CPU ``[2, len(where)]``)
    at the positions ``where``, NaN at the others (the non-finite candidates)."""
    if scored is not None and len(where) == count:  # every candidate scored (the usual case): its rows as they are
        return {"accuracy": scored[0], "loss": scored[1]}
    acc = torch.full((count,), float("nan"), dtype=torch.float64)
    loss = acc.clone()
    if where:
        acc[where], loss[where] = scored
    return {"accuracy": acc, "loss": loss}


@torch.no_grad()
def score_models(model: "FlatModel", vectors: torch.Tensor, data: Dataset) -> torch.Tensor:
    """Accuracy and mean cross-entropy of every model ``vectors [C, P]`` (finite, float32, on
    the data's device) on ``data``: float32 ``[2, C]``, on that device. Every evaluator scores
    with this, so a client's scores do not depend on which engine computed them."""
    return _scored(model.class_first_logits(vectors, data.x), data.y)  # logits [C, classes, n]


def _scored(logits: torch.Tensor, y: torch.Tensor, metrics: Sequence[str] = _METRICS) -> torch.Tensor:
    """Accuracy and mean cross-entropy ``[2, C]`` of the logits ``[C, classes, n]`` of labels
    ``y``; a metric not in ``metrics`` is not computed (NaN). Each is computed on its own, so
    leaving one out changes no bit of the other."""
    def skipped() -> torch.Tensor:
        return torch.full((len(logits),), float("nan"), dtype=logits.dtype, device=logits.device)

    # max(dim).indices is argmax (the first of equal maxima) and, with the classes along
    # dim 1 and the samples last, many times faster than argmax over that dim.
    correct = (logits.max(1).indices == y).float().mean(1) if "accuracy" in metrics else skipped()
    loss = F.cross_entropy(logits, y.expand(len(logits), -1), reduction="none").mean(1) if "loss" in metrics else skipped()
    return torch.stack([correct, loss])


class FlatModel:
    """A model as a function of flat parameter vectors (:func:`~dfedrw.peer.learning.models.get_vector`
    order), for many models at once: the candidates a client scores, or every client's model in
    the batched engine.

    A ``Sequential`` of ``Linear`` and parameter-free layers (softmax regression, the MLP) runs
    as batched matrix products over the models, and inputs every model shares go through each layer
    as one product for all of them (the data read once, not once per model). Any other module (the
    convolutional models) is called once per model (``functional_call`` on views of its vector:
    ``layout = "loop"``), its rows in blocks of :func:`block_rows` when no gradient is wanted; on
    the CPU that is faster than ``torch.func.vmap`` of the same call (``layout = "vmap"``), which
    turns the models' convolutions into grouped ones (2.7x for LeNet-5's scoring with every row at
    once, docs/models.md; in blocks: :mod:`dfedrw.engines.layout`, which picks the layout)."""

    LAYOUTS = ("loop", "vmap")
    # The layout of models without a layer plan when none is named (a benchmark may change it).
    default_layout = "loop"

    def __init__(self, template: torch.nn.Module, device: torch.device, *, layout: str | None = None) -> None:
        layout = layout or self.default_layout
        if layout not in self.LAYOUTS:
            raise ValueError(f"FlatModel: layout={layout!r} is not valid; choose one of: {', '.join(self.LAYOUTS)}")
        self.module = template.to(device)
        named = list(self.module.named_parameters())
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.plan = _layer_plan(self.module)
        self.layout = layout

    def block_rows(self, in_features: int) -> int:
        """:func:`block_rows` of this model for rows of ``in_features``."""
        return block_rows(self.module, in_features)

    def logits(self, vector: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """One model's logits (its flat parameters ``vector``, inputs ``x [N, F]``). A model with a
        layer plan runs it as its ``forward`` would (``F.linear`` on views of ``vector``, the
        same calls on the same views), without swapping the module's parameters."""
        if self.plan is not None:
            h = x
            for step, weight, b in self._steps(vector[None]):
                h = step(h) if weight is None else F.linear(h, weight[0], None if b is None else b[0])
            return h
        parts = torch.split(vector, self.sizes)
        params = {n: p.view(s) for n, p, s in zip(self.names, parts, self.shapes, strict=True)}
        if self.layout == "vmap":
            return functional_call(self.module, params, (x,))
        return in_blocks(lambda rows: functional_call(self.module, params, (rows,)), x, self.block_rows(x.shape[-1]))

    def batch_logits(self, vectors: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Every model's logits ``[C, N, K]``: ``x`` is ``[C, N, F]`` (each model its own
        inputs) or ``[N, F]`` (inputs all models share)."""
        if self.plan is None:
            if self.layout == "vmap":
                call = vmap(self.logits, in_dims=(0, 0 if x.dim() == 3 else None))
                rows = max(1, self.block_rows(x.shape[-1]) // max(1, len(vectors)))
                if x.dim() == 2 and len(x) > rows and not torch.is_grad_enabled():
                    # Every model's activations at once: the shared rows in blocks that hold,
                    # for all models together, what one model's block holds in the loop (ten
                    # ResNet-20s on a whole test set at once outgrow a 24 GB machine).
                    return torch.cat([call(vectors, part) for part in x.split(rows)], dim=1)
                return call(vectors, x)
            return torch.stack([self.logits(v, x[i] if x.dim() == 3 else x) for i, v in enumerate(vectors)])
        count, h = len(vectors), x
        for step, weight, b in self._steps(vectors):
            if weight is None:
                h = step(h)
            elif h.dim() == 2:  # shared inputs: one product for all models' weights
                flat = weight.reshape(-1, weight.shape[2])
                y = h @ flat.t() if b is None else torch.addmm(b.reshape(-1), h, flat.t())
                h = y.view(len(h), count, weight.shape[1]).transpose(0, 1)
            else:
                h = torch.bmm(h, weight.transpose(1, 2)) if b is None else torch.baddbmm(b[:, None, :], h, weight.transpose(1, 2))
        return h

    def minibatch_losses(self, vectors: torch.Tensor, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Each model's loss on its own minibatch (``x [C, B, F]``, ``y [C, B]``): the mean
        cross-entropy, or with ``weight [C, B]`` the weighted sum. A model without a layer plan
        computes it as a client's own step does (``F.cross_entropy`` of its logits, one model at
        a time), so its gradient is the client's, bit for bit."""
        if self.plan is None and weight is None and self.layout == "loop":
            return torch.stack([F.cross_entropy(self.logits(v, x[i]), y[i]) for i, v in enumerate(vectors)])
        per = F.cross_entropy(self.class_first_logits(vectors, x), y, reduction="none")  # [C, B]
        return per.mean(1) if weight is None else (per * weight).sum(1)

    def _steps(self, vectors: torch.Tensor):
        """The plan's steps with each Linear layer's weights ``[C, out, in]`` and biases
        ``[C, out]`` (or None) as views of ``vectors``; (layer, None, None) for the others."""
        for step in self.plan:
            if not isinstance(step, tuple):
                yield step, None, None
                continue
            offset, out, inp, bias = step
            weight = vectors[:, offset : offset + out * inp].view(len(vectors), out, inp)
            yield step, weight, vectors[:, offset + out * inp : offset + out * inp + out] if bias else None

    def class_first_logits(self, vectors: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Every model's logits, classes first: ``[C, K, N]``; ``x`` is ``[N, F]`` (inputs all
        models share) or ``[C, N, F]`` (each model its own inputs). With the samples last, the
        products write the layout that the cross-entropy and the class maximum read fastest
        (and, measured on softmax regression, the product itself is faster than ``x @ W^T``:
        about half the time of :meth:`batch_logits` for a local step of 160 clients, its
        gradient too). Models without a layer plan get :meth:`batch_logits` transposed (a view)."""
        if self.plan is None:
            return self.batch_logits(vectors, x).transpose(1, 2)
        count, h = len(vectors), x.t() if x.dim() == 2 else x.transpose(1, 2)  # [F, N] or [C, F, N]
        for step, weight, b in self._steps(vectors):
            if weight is None:
                h = step(h)
            elif h.dim() == 2:  # shared inputs: one product for all models' weights
                flat = weight.reshape(-1, weight.shape[2])
                h = (flat @ h if b is None else torch.addmm(b.reshape(-1, 1), flat, h)).view(count, weight.shape[1], h.shape[1])
            else:
                h = torch.bmm(weight, h) if b is None else torch.baddbmm(b[:, :, None], weight, h)
        return h


def softmax_regression_grads(
    model: FlatModel, models: torch.Tensor, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The minibatch losses ``[C]`` of the flat ``models`` and their gradients ``[C, P]`` when the
    model is one Linear layer, else None (``x [C, B, F]``, ``y [C, B]``; the loss the mean
    cross-entropy, or with ``weight [C, B]`` the weighted sum). The gradient is composed as autograd
    composes it for ``class_first_logits`` and ``F.cross_entropy`` (the loss's gradient at the
    targets, torch's own log-softmax backward, then the two products), so the values are autograd's,
    bit for bit (a test compares them), in about half its time for a few hundred small models: no
    graph recorded, nothing else computed."""
    plan = model.plan
    if plan is None or len(plan) != 1 or not isinstance(plan[0], tuple) or models.dim() != 2 or models.dtype != torch.float32:
        return None
    offset, out, inp, bias = plan[0]
    count, width = x.shape[0], x.shape[1]
    logits = model.class_first_logits(models, x)  # [C, classes, B]
    log_probs = torch.log_softmax(logits, dim=1)
    per = F.nll_loss(log_probs, y, reduction="none")  # [C, B], as F.cross_entropy computes it
    losses = per.mean(1) if weight is None else (per * weight).sum(1)
    per_grad = torch.ones(count, width, dtype=logits.dtype, device=logits.device).div_(width) if weight is None else weight
    upstream = torch.zeros_like(log_probs).scatter_(1, y[:, None, :], per_grad.neg()[:, None, :])
    logit_grads = torch.ops.aten._log_softmax_backward_data(upstream, log_probs, 1, log_probs.dtype)
    grads = torch.zeros_like(models)
    torch.bmm(logit_grads, x, out=grads[:, offset : offset + out * inp].view(count, out, inp))
    if bias:
        grads[:, offset + out * inp : offset + out * inp + out] = logit_grads.sum(dim=2)
    return losses, grads


class ManyEvaluator:
    """Many clients' ``evaluate`` at once (:data:`~dfedrw.peer.aggregation.rules.EvaluateMany`):
    each owner's candidate rows scored by that owner's :class:`VectorEvaluator` on its auxiliary
    set, exactly as the evaluator alone scores them (the same :func:`score_models` call on the
    same rows). Owners may come from several runs (a batch of runs).

    What it saves over one evaluator call per owner: the pooled rows are checked for finiteness
    once (a row is the candidate of several owners), and all owners' scores come back from the
    device in one transfer. For a one-layer model (softmax regression) each candidate's weights
    are laid out once as the product reads them (``[classes, in]`` rows, which
    :meth:`FlatModel.class_first_logits` would copy out of every owner's gathered candidates), and
    each owner takes its rows of that: one copy of its candidates, not two."""

    @torch.no_grad()
    def __call__(
        self, vectors: torch.Tensor, owners: Sequence[VectorEvaluator], rows, *, finite: torch.Tensor | None = None,
        metrics: Sequence[str] = _METRICS,
    ) -> list[dict[str, torch.Tensor]]:
        """``finite``: which rows of ``vectors`` are finite, when the caller has checked (bool [R]);
        ``metrics``: the keys wanted, the others neither computed nor returned."""
        finite = (torch.isfinite(vectors).all(1) if finite is None else finite).tolist()
        device = owners[0].data.x.device if owners else vectors.device
        if vectors.device != device and all(e.data.x.device == device for e in owners):
            # The pool on the CPU (as rules get it), the owners' data on a GPU: the pool goes over
            # once, not each owner's candidates in turn (the same float32 values, the same scores).
            vectors = vectors.to(device, torch.float32)
        where = [[j for j, i in enumerate(r) if finite[i]] for r in rows]  # positions in each list
        picked = [[r[j] for j in w] for r, w in zip(rows, where, strict=True)]
        laid = _LaidOut.of(vectors, owners, picked)
        if laid is None:
            scored = [e.score(vectors[p]) for e, p in zip(owners, picked, strict=True) if p]
        else:
            scored = [e.score_laid_out(laid, p, metrics) for e, p in zip(owners, picked, strict=True) if p]
        values = torch.cat(scored, dim=1).double().cpu() if scored else None
        out, start = [], 0
        for r, w in zip(rows, where, strict=True):
            answer = _metrics(len(r), w, values[:, start : start + len(w)] if w else None)
            out.append(answer if set(metrics) == set(_METRICS) else {key: answer[key] for key in metrics})
            start += len(w)
        return out


class _LaidOut:
    """The first-layer weights ``[rows * out, in]`` and biases ``[rows * out, 1]`` of the pooled
    rows ``used`` of one-layer models, as :meth:`FlatModel.class_first_logits` lays out each
    model's ``[out, in]`` weights for its product; :meth:`rows` takes some rows' of them."""

    def __init__(self, vectors: torch.Tensor, step: tuple[int, int, int, bool], used: list[int]) -> None:
        offset, self.out, inp, bias = step
        index = torch.tensor(used, dtype=torch.long, device=vectors.device)
        end = offset + self.out * inp
        self.weights = vectors[:, offset:end].index_select(0, index).view(len(used) * self.out, inp)
        self.biases = vectors[:, end : end + self.out].index_select(0, index).view(len(used) * self.out, 1) if bias else None
        self.position = {row: i for i, row in enumerate(used)}
        self.classes = torch.arange(self.out, device=vectors.device)

    @classmethod
    def of(cls, vectors: torch.Tensor, owners: Sequence["VectorEvaluator"], picked: Sequence[Sequence[int]]) -> "_LaidOut | None":
        """The layout of every row some owner scores, where every owner's model is the same one
        Linear layer and its data shares the float32 pool's device; else None."""
        plans = {repr(e.model.plan) for e in owners}
        plan = owners[0].model.plan if owners and len(plans) == 1 else None
        if plan is None or len(plan) != 1 or not isinstance(plan[0], tuple) or vectors.dtype != torch.float32 or vectors.dim() != 2:
            return None
        if any(e.data.x.device != vectors.device for e in owners):
            return None
        used = sorted({row for p in picked for row in p})
        return cls(vectors, plan[0], used) if used else None

    def rows(self, rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weights ``[len(rows) * out, in]`` and biases of the pooled ``rows``, in order."""
        start = torch.tensor([self.position[r] * self.out for r in rows], dtype=torch.long, device=self.classes.device)
        index = (start[:, None] + self.classes).view(-1)
        return self.weights.index_select(0, index), None if self.biases is None else self.biases.index_select(0, index)


# Parameter-free layers that act on each value alone, so they work in any layout (exact types:
# a subclass may read its dims).
_ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Identity)


def _layer_plan(module: torch.nn.Module) -> list | None:
    """``module`` as steps (offset, out, in, has bias) for each Linear layer and the layer itself
    for each elementwise one; None for any other module (a layer such as ``Softmax(dim=1)`` or
    ``Flatten`` reads its dims, which the batched layouts move)."""
    if not isinstance(module, torch.nn.Sequential):
        return None
    plan: list = []
    offset = 0
    for layer in module:
        if isinstance(layer, torch.nn.Linear) and type(layer) is torch.nn.Linear:
            bias = layer.bias is not None
            plan.append((offset, layer.out_features, layer.in_features, bias))
            offset += layer.out_features * layer.in_features + (layer.out_features if bias else 0)
        elif type(layer) in _ELEMENTWISE:
            plan.append(layer)
        else:
            return None
    return plan
