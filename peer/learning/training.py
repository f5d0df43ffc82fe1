"""Local SGD steps and one model's evaluation (no networking here); many models at once, as rows
of one matrix, are in :mod:`peer.learning.model_matrix`."""

from __future__ import annotations

import functools

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from dfedrw.peer.quote import shown
from dfedrw.peer.learning.data import Dataset, augment_batch
from dfedrw.peer.learning.model_matrix import _layer_plan, block_rows, in_blocks


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


LR_SCHEDULES = ("constant", "step", "cosine")


def learning_rate(lr: float, schedule: str, r: int, rounds: int, *, gamma: float = 0.1, step: int = 100) -> float:
    """The learning rate of round ``r`` (0-based) of ``rounds``, a Python float so every engine
    computes the same value: ``"constant"``: ``lr``; ``"step"``: ``lr * gamma ** (r // step)``
    (``step = 1``: an exponential decay); ``"cosine"``: ``lr * (1 + cos(pi * r / rounds)) / 2``
    (Loshchilov and Hutter 2017, without restarts: ``lr`` at round 0, towards 0 at the last)."""
    if schedule == "constant":
        return lr
    if schedule == "step":
        return lr * gamma ** (r // step)
    if schedule == "cosine":
        return lr * (1.0 + math.cos(math.pi * r / rounds)) / 2.0
    raise ValueError(f"learning-rate schedule {shown(schedule)} is not valid; choose one of: {', '.join(LR_SCHEDULES)}")


def local_step_count(local_steps: int, local_epochs: float, shard_size: int, batch_size: int) -> int:
    """The local steps a client takes each round: ``local_steps``, or with ``local_epochs > 0``
    as many minibatches as ``local_epochs`` passes over its shard make (``ceil(local_epochs *
    shard_size / batch)``, the batch capped at the shard's size; at least 1)."""
    if local_epochs <= 0:
        return local_steps
    batch = max(1, min(batch_size, shard_size))
    return max(1, math.ceil(local_epochs * shard_size / batch - 1e-9))


def sgd_update(
    weights: torch.Tensor, grads: torch.Tensor, buffer: torch.Tensor | None, *, lr: float, momentum: float, weight_decay: float
) -> torch.Tensor | None:
    """One step of SGD with momentum and weight decay on ``weights`` in place, as
    ``torch.optim.SGD`` (no dampening, no Nesterov) computes it: ``g = grad + weight_decay * w``;
    ``buffer = g`` at the first step, else ``momentum * buffer + g``; ``w -= lr * buffer`` (``g``
    without momentum). Elementwise: a client's parameters one tensor at a time or the batched
    engine's rows at once give the same bits. Returns the new buffer (None without momentum)."""
    if weight_decay:
        grads = grads.add(weights, alpha=weight_decay)
    if momentum:
        buffer = grads.clone() if buffer is None else buffer.mul_(momentum).add_(grads)
        grads = buffer
    weights.add_(grads, alpha=-lr)
    return buffer


class Augmentation:
    """A client's minibatch augmentation (:func:`~dfedrw.peer.learning.data.augment_batch`): the kind, the
    padding, the images' shape and the client's own generator, drawn on step after step."""

    def __init__(self, kind: str, padding: int, input_shape: Sequence[int], seed: int) -> None:
        self.kind, self.padding, self.input_shape = kind, padding, tuple(input_shape)
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return augment_batch(x, self.input_shape, self.kind, self.padding, self.generator)


class LocalTrainer:
    """SGD on a client's shard: ``step(lr)`` takes the round's local steps (``local_steps``, or
    ``local_epochs`` passes over the shard: :func:`local_step_count`), the minibatches drawn by a
    :class:`BatchOrder`, each an :func:`sgd_update` (``torch.optim.SGD``'s momentum and weight decay;
    the momentum buffer stays with the client across rounds, neither sent nor averaged)."""

    def __init__(
        self, model: nn.Module, data: Dataset, *, lr: float, batch_size: int, local_steps: int, seed: int, local_epochs: float = 0.0,
        momentum: float = 0.0, weight_decay: float = 0.0, augment: Augmentation | None = None,
    ) -> None:
        self.model = model
        self.data = data
        self.lr = lr
        self.batches = BatchOrder(len(data.y), batch_size, seed)
        self.batch_size = self.batches.batch_size
        self.local_steps = local_step_count(local_steps, local_epochs, len(data.y), batch_size)
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.buffers: list[torch.Tensor] | None = None
        self.augment = augment if augment is not None and augment.kind != "none" else None

    def state(self) -> tuple[dict[str, "np.ndarray"], dict[str, "np.ndarray"], int]:
        """(generator states, arrays, position): the minibatch order's and, once there is one, the
        momentum buffer (``momentum``, flat float32), so a resumed client goes on the same way."""
        generators, arrays, pos = self.batches.state()
        if self.augment is not None:
            generators = {**generators, "augment": self.augment.generator.get_state().numpy()}
        if self.buffers is not None:
            arrays = {**arrays, "momentum": torch.nn.utils.parameters_to_vector(self.buffers).detach().cpu().numpy()}
        return generators, arrays, pos

    def load_state(self, generators: dict, arrays: dict, pos: int) -> None:
        self.batches.load_state(generators, arrays, pos)
        if self.augment is not None:
            self.augment.generator.set_state(torch.from_numpy(np.asarray(generators["augment"], dtype=np.uint8).copy()))
        if "momentum" in arrays and self.momentum:
            flat = torch.from_numpy(np.asarray(arrays["momentum"], dtype=np.float32).copy())
            params = list(self.model.parameters())
            if flat.shape != (sum(p.numel() for p in params),) or not bool(torch.isfinite(flat).all()):
                raise ValueError("momentum buffer does not fit this model or is not finite")
            self.buffers = [part.view_as(p).to(p.device).clone() for part, p in zip(flat.split([p.numel() for p in params]), params, strict=True)]
        elif self.momentum:
            raise ValueError("the checkpoint holds no momentum buffer, which train.momentum needs")

    def step(self, lr: float | None = None) -> float:
        """Run the round's local steps at ``lr`` (default: the trainer's); returns the mean
        minibatch loss (before each step)."""
        lr = self.lr if lr is None else lr
        total = 0.0
        params = self.params
        for _ in range(self.local_steps):
            idx = self.batches.next()
            for p in params:
                p.grad = None
            x = self.data.x[idx] if self.augment is None else self.augment(self.data.x[idx])
            loss = F.cross_entropy(self.model(x), self.data.y[idx])
            loss.backward()
            with torch.no_grad():
                if not self.momentum and not self.weight_decay:
                    for p in params:
                        p.add_(p.grad, alpha=-lr)
                else:
                    buffers = self.buffers or [None] * len(params)
                    self.buffers = [
                        sgd_update(p, p.grad, b, lr=lr, momentum=self.momentum, weight_decay=self.weight_decay)
                        for p, b in zip(params, buffers, strict=True)
                    ]
                    if not self.momentum:
                        self.buffers = None
            total += float(loss.detach())
        # Let the gradients go until the next step makes new ones: a model's worth of memory.
        for p in params:
            p.grad = None
        return total / self.local_steps

    @functools.cached_property
    def params(self) -> list[torch.nn.Parameter]:
        """The model's parameters, listed once (loading a vector replaces their values, not them):
        walking its modules each step costs more than the step of a small model."""
        return list(self.model.parameters())


# A stack of linear layers of more than this many parameters is evaluated in blocks of rows too: its
# activations for a whole test set (10,000 samples through a 4,096-unit layer: 164 MB) outweigh it.
BIG_MODEL = 1 << 20


@torch.no_grad()
def logits_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``model``'s logits for the rows ``x``; a model other than a stack of linear layers, or one of
    more than :data:`BIG_MODEL` parameters, takes them in blocks, as :class:`FlatModel` does."""
    big = sum(p.numel() for p in model.parameters()) > BIG_MODEL
    rows = None if _layer_plan(model) is not None and not big else block_rows(model, x.shape[1])
    return in_blocks(model, x, rows)


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset) -> dict[str, float]:
    """Accuracy (fraction) and mean cross-entropy of ``model`` on ``data`` (:func:`logits_of`)."""
    logits = logits_of(model, data.x)
    return {
        "accuracy": float((logits.argmax(1) == data.y).float().mean()),
        "loss": float(F.cross_entropy(logits, data.y)),
    }
