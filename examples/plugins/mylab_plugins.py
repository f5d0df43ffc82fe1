"""An outside attack and an outside CRS: plain classes in the user's own module.

Nothing here is registered in dfedrw; a scenario names them by import path
(``mylab_plugins:ScaledMean``) with this folder on ``PYTHONPATH`` (see README.md). Their
constructor parameters are their settings, checked in ``__post_init__``; a parameter named like
a value the running system supplies (``num_clients``, ``num_byzantine``, ...) is filled in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ScaledMean:
    """Scaled-mean attack: send the received models' mean times ``factor``, plus a little noise.

    ``message = factor * mean(received) + noise * N(0, I)``; silent (None) if nothing was
    received. With ``factor`` near 1 and small noise the message looks like a benign model.
    """

    factor: float = 1.5
    noise: float = 0.01

    def __post_init__(self) -> None:
        if not isinstance(self.factor, (int, float)) or isinstance(self.factor, bool) or self.factor != self.factor:
            raise ValueError(f"ScaledMean: factor must be a real number, got {self.factor!r}")
        if not isinstance(self.noise, (int, float)) or isinstance(self.noise, bool) or not 0 <= self.noise < float("inf"):
            raise ValueError(f"ScaledMean: noise must be a finite number >= 0, got {self.noise!r}")

    def __call__(self, received: torch.Tensor, receiver: int, generator: torch.Generator) -> torch.Tensor | None:
        if received.shape[0] == 0:
            return None
        mean = received.to(torch.float64).mean(dim=0)
        drawn = torch.randn(mean.shape[0], generator=generator, dtype=torch.float64)
        return (self.factor * mean + self.noise * drawn).to(torch.float32)


@dataclass(frozen=True)
class LowestK:
    """Top-k by loss: the ``k`` candidates with the lowest score share the weight equally.

    ``v_i = 1/k`` for the ``k`` smallest finite scores (ties to the lower position), else 0;
    with fewer than ``k`` finite scores, all finite ones share it. Pair with the ``loss`` TPM.
    """

    k: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"LowestK: k must be an integer >= 1, got {self.k!r}")

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        values = torch.as_tensor(scores, dtype=torch.float64)
        weights = torch.zeros_like(values)
        finite = torch.isfinite(values)
        if not bool(finite.any()):
            return weights
        ranked = torch.where(finite, values, torch.full_like(values, float("inf")))
        order = ranked.argsort(stable=True)[: min(self.k, int(finite.sum()))]
        weights[order] = 1.0 / len(order)
        return weights
