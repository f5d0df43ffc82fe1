"""Local SGD steps and model evaluation (no networking here)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from peer.data import Dataset
from peer.models import set_vector


class LocalTrainer:
    """Plain SGD on a client's shard: ``step()`` takes ``local_steps`` minibatch steps.

    Minibatches are drawn by walking a seeded permutation of the shard (a new one each epoch),
    so every sample is used once per epoch.
    """

    def __init__(self, model: nn.Module, data: Dataset, *, lr: float, batch_size: int, local_steps: int, seed: int) -> None:
        self.model = model
        self.data = data
        self.lr = lr
        self.batch_size = min(batch_size, len(data.y))
        self.local_steps = local_steps
        self._gen = torch.Generator().manual_seed(seed)
        self._order = torch.empty(0, dtype=torch.long)
        self._pos = 0

    def _batch(self) -> torch.Tensor:
        if self._pos + self.batch_size > len(self._order):
            self._order = torch.randperm(len(self.data.y), generator=self._gen)
            self._pos = 0
        idx = self._order[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return idx

    def step(self) -> float:
        """Run the local steps; returns the mean minibatch loss (before each step)."""
        total = 0.0
        for _ in range(self.local_steps):
            idx = self._batch()
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

    Uses a scratch copy of the model so the client's own model is never touched.
    """

    def __init__(self, template: nn.Module, data: Dataset) -> None:
        import copy

        self.model = copy.deepcopy(template)
        self.data = data

    @torch.no_grad()
    def __call__(self, vectors: torch.Tensor) -> dict[str, torch.Tensor]:
        acc = torch.empty(len(vectors), dtype=torch.float64)
        loss = torch.empty(len(vectors), dtype=torch.float64)
        for i, v in enumerate(vectors):
            if not torch.isfinite(v).all():
                acc[i] = float("nan")
                loss[i] = float("nan")
                continue
            set_vector(self.model, v)
            m = evaluate(self.model, self.data)
            acc[i] = m["accuracy"]
            loss[i] = m["loss"]
        return {"accuracy": acc, "loss": loss}
