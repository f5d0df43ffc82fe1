"""Local SGD steps and model evaluation (no networking here)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn import functional as F

from dfedrw.peer.data import Dataset


class BatchOrder:
    """Which samples of a shard each minibatch takes: a seeded permutation of the shard is
    walked (a new one each epoch), so every sample is used once per epoch. Both engines draw
    a client's minibatches with it, so equal seeds give equal batches."""

    def __init__(self, size: int, batch_size: int, seed: int) -> None:
        self.size = size
        self.batch_size = min(batch_size, size)
        self._gen = torch.Generator().manual_seed(seed)
        self._order = torch.empty(0, dtype=torch.long)
        self._pos = 0

    def next(self) -> torch.Tensor:
        if self._pos + self.batch_size > len(self._order):
            self._order = torch.randperm(self.size, generator=self._gen)
            self._pos = 0
        idx = self._order[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return idx

    def state(self) -> tuple[dict[str, "np.ndarray"], dict[str, "np.ndarray"], int]:
        """(generator states, arrays, position) for a checkpoint: resuming from them draws
        the same minibatches as the run that was not interrupted."""
        return {"batches": self._gen.get_state().numpy()}, {"order": self._order.numpy()}, self._pos

    def load_state(self, generators: dict, arrays: dict, pos: int) -> None:
        order = torch.from_numpy(np.asarray(arrays["order"], dtype=np.int64).copy())
        if order.ndim != 1 or (len(order) and (int(order.min()) < 0 or int(order.max()) >= self.size)):
            raise ValueError("trainer permutation does not fit this shard")
        if not 0 <= pos <= len(order):
            raise ValueError(f"trainer position {pos} out of range")
        self._gen.set_state(torch.from_numpy(np.asarray(generators["batches"], dtype=np.uint8).copy()))
        self._order, self._pos = order, pos


class LocalTrainer:
    """Plain SGD on a client's shard: ``step()`` takes ``local_steps`` minibatch steps, the
    minibatches drawn by a :class:`BatchOrder`."""

    def __init__(self, model: nn.Module, data: Dataset, *, lr: float, batch_size: int, local_steps: int, seed: int) -> None:
        self.model = model
        self.data = data
        self.lr = lr
        self.local_steps = local_steps
        self.batches = BatchOrder(len(data.y), batch_size, seed)
        self.batch_size = self.batches.batch_size

    def state(self) -> tuple[dict[str, "np.ndarray"], dict[str, "np.ndarray"], int]:
        return self.batches.state()

    def load_state(self, generators: dict, arrays: dict, pos: int) -> None:
        self.batches.load_state(generators, arrays, pos)

    def step(self) -> float:
        """Run the local steps; returns the mean minibatch loss (before each step)."""
        total = 0.0
        for _ in range(self.local_steps):
            idx = self.batches.next()
            self.model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.model(self.data.x[idx]), self.data.y[idx])
            loss.backward()
            with torch.no_grad():
                for p in self.model.parameters():
                    p.add_(p.grad, alpha=-self.lr)
            total += float(loss.detach())
        return total / self.local_steps


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset) -> dict[str, float]:
    """Accuracy (fraction) and mean cross-entropy of ``model`` on ``data``."""
    logits = model(data.x)
    return {
        "accuracy": float((logits.argmax(1) == data.y).float().mean()),
        "loss": float(F.cross_entropy(logits, data.y)),
    }


class VectorEvaluator:
    """Scores flat model vectors on a fixed dataset: the ``evaluate`` a TPM calls.

    All finite candidates go through the model at once (:meth:`FlatModel.batch_logits`: for
    the project's models, one matrix product per layer for every candidate, the data read
    once). The client's own model is never touched.
    """

    def __init__(self, template: nn.Module, data: Dataset) -> None:
        import copy

        self.model = FlatModel(copy.deepcopy(template), data.x.device)
        self.data = data

    @torch.no_grad()
    def __call__(self, vectors: torch.Tensor) -> dict[str, torch.Tensor]:
        c = len(vectors)
        acc = torch.full((c,), float("nan"), dtype=torch.float64)
        loss = torch.full((c,), float("nan"), dtype=torch.float64)
        ok = torch.isfinite(vectors).all(dim=1)
        if ok.any():
            good = vectors[ok].to(self.data.x.device, torch.float32)
            logits = self.model.batch_logits(good, self.data.x)  # [c_ok, n, classes]
            y = self.data.y
            acc[ok] = (logits.argmax(-1) == y).float().mean(1).double().cpu()
            per = F.cross_entropy(logits.transpose(1, 2), y.expand(len(good), -1), reduction="none")
            loss[ok] = per.mean(1).double().cpu()
        return {"accuracy": acc, "loss": loss}


class FlatModel:
    """A model as a function of flat parameter vectors (:func:`~dfedrw.peer.models.get_vector`
    order), for many models at once: the candidates a client scores, or every client's model in
    the batched engine.

    A ``Sequential`` of ``Linear`` layers and parameter-free layers (the project's models) runs
    as batched matrix products over the models, and inputs every model shares go through each
    layer as one product for all of them (reading the data once, not once per model). Any
    other module goes through ``torch.func.vmap`` of ``functional_call``.
    """

    def __init__(self, template: torch.nn.Module, device: torch.device) -> None:
        self.module = template.to(device)
        named = list(self.module.named_parameters())
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.plan = _layer_plan(self.module)

    def logits(self, vector: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """One model's logits (its flat parameters ``vector``, inputs ``x [N, F]``)."""
        parts = torch.split(vector, self.sizes)
        params = {n: p.view(s) for n, p, s in zip(self.names, parts, self.shapes, strict=True)}
        return functional_call(self.module, params, (x,))

    def batch_logits(self, vectors: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Every model's logits ``[C, N, K]``: ``x`` is ``[C, N, F]`` (each model its own
        inputs) or ``[N, F]`` (inputs all models share)."""
        if self.plan is None:
            return vmap(self.logits, in_dims=(0, 0 if x.dim() == 3 else None))(vectors, x)
        count, h = len(vectors), x
        for step in self.plan:
            if isinstance(step, torch.nn.Module):
                h = step(h)
                continue
            offset, out, inp, bias = step
            weight = vectors[:, offset : offset + out * inp].view(count, out, inp)
            b = vectors[:, offset + out * inp : offset + out * inp + out] if bias else None
            if h.dim() == 2:  # shared inputs: one product for all models' weights
                flat = weight.reshape(count * out, inp)
                y = h @ flat.t() if b is None else torch.addmm(b.reshape(count * out), h, flat.t())
                h = y.view(len(h), count, out).transpose(0, 1)
            else:
                h = torch.bmm(h, weight.transpose(1, 2)) if b is None else torch.baddbmm(b[:, None, :], h, weight.transpose(1, 2))
        return h


class ManyEvaluator:
    """Many clients' ``evaluate`` at once (:data:`~dfedrw.peer.aggregation.rules.EvaluateMany`):
    each owner's candidate rows scored on that owner's auxiliary set, as its
    :class:`VectorEvaluator` scores them.

    Each owner's candidates go through the model on its own samples (for the project's models
    one product per layer for all of them, :meth:`FlatModel.batch_logits`): the multiply-adds
    are exactly those of one evaluator per owner. What follows (finiteness, predictions,
    cross-entropy, the mean over each owner's samples) runs once for a block of owners, their
    logits side by side, instead of a dozen small operations per owner. Blocks are bounded so
    their logits stay under ``max_values`` values.
    """

    def __init__(self, template: nn.Module, aux: dict[int, Dataset], device: torch.device, *, max_values: int = 16 << 20) -> None:
        import copy

        self.each = {k: VectorEvaluator(template, d) for k, d in aux.items()}
        self.model = FlatModel(copy.deepcopy(template), device)
        self.aux = aux
        self.device = device
        self.max_values = max_values

    @torch.no_grad()
    def __call__(self, vectors: torch.Tensor, owners, rows) -> list[dict[str, torch.Tensor]]:
        out: list[dict[str, torch.Tensor]] = []
        values = [len(r) * len(self.aux[k].y) * self.aux[k].num_classes for k, r in zip(owners, rows, strict=True)]  # logits each
        lo = 0
        while lo < len(owners):  # blocks of owners whose logits fit in max_values
            hi, size = lo, 0
            while hi < len(owners) and (hi == lo or size + values[hi] <= self.max_values):
                size += values[hi]
                hi += 1
            out.extend(self._block(vectors, owners[lo:hi], rows[lo:hi]))
            lo = hi
        return out

    def _block(self, vectors, owners, rows) -> list[dict[str, torch.Tensor]]:
        picked = vectors[[i for r in rows for i in r]].to(self.device, torch.float32)
        finite = torch.isfinite(picked).all(1)
        if not bool(finite.all()):
            picked = torch.where(finite[:, None], picked, 0.0)  # scored as zeros, reported as NaN
        columns, labels, spans = [], [], []
        start = 0
        for k, r in zip(owners, rows, strict=True):
            data = self.aux[k]
            block = self.model.batch_logits(picked[start : start + len(r)], data.x)  # [m, n, K]
            columns.append(block.reshape(-1, block.shape[-1]))  # [m * n, K]
            labels.append(data.y.repeat(len(r)))
            spans.extend([len(data.y)] * len(r))
            start += len(r)
        logits, labels = torch.cat(columns), torch.cat(labels)
        # One segment per candidate (its owner's n samples), in order: the mean over each.
        segment = torch.repeat_interleave(torch.arange(len(spans), device=self.device), torch.tensor(spans, device=self.device))
        counts = torch.tensor(spans, dtype=torch.float64, device=self.device)
        correct = (logits.argmax(1) == labels).double()
        # The softmax with the classes along dim 1 and the samples last runs over the samples
        # in vector lanes: measured 15x faster than over rows of ~10 classes.
        per = F.cross_entropy(logits.t().contiguous()[None], labels[None], reduction="none")[0].double()
        acc = torch.zeros(len(spans), dtype=torch.float64, device=self.device).index_add_(0, segment, correct) / counts
        loss = torch.zeros(len(spans), dtype=torch.float64, device=self.device).index_add_(0, segment, per) / counts
        nan = torch.tensor(float("nan"), dtype=torch.float64, device=self.device)
        acc, loss = torch.where(finite, acc, nan).cpu(), torch.where(finite, loss, nan).cpu()
        out, start = [], 0
        for r in rows:
            out.append({"accuracy": acc[start : start + len(r)], "loss": loss[start : start + len(r)]})
            start += len(r)
        return out


def _layer_plan(module: torch.nn.Module) -> list | None:
    """``module`` as steps (offset, out, in, has bias) for each Linear layer and the layer
    itself for each parameter-free one; None for any other module."""
    if not isinstance(module, torch.nn.Sequential):
        return None
    plan: list = []
    offset = 0
    for layer in module:
        if isinstance(layer, torch.nn.Linear) and type(layer) is torch.nn.Linear:
            bias = layer.bias is not None
            plan.append((offset, layer.out_features, layer.in_features, bias))
            offset += layer.out_features * layer.in_features + (layer.out_features if bias else 0)
        elif not any(True for _ in layer.parameters()) and not any(True for _ in layer.buffers()):
            plan.append(layer)
        else:
            return None
    return plan
