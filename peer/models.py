"""Models the clients train. A model is also handled as one flat float32 vector (its
parameters in ``named_parameters`` order): that is what travels and what rules aggregate."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def softmax_regression(in_features: int, num_classes: int, hidden: int) -> nn.Module:
    """Multinomial logistic regression: one linear layer; cross-entropy supplies the softmax."""
    return nn.Sequential(nn.Linear(in_features, num_classes))


def mlp(in_features: int, num_classes: int, hidden: int) -> nn.Module:
    """One hidden ReLU layer."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


MODELS: dict[str, Callable[[int, int, int], nn.Module]] = {
    "softmax_regression": softmax_regression,
    "mlp": mlp,
}


def build_model(name: str, in_features: int, num_classes: int, *, hidden: int = 64, seed: int = 0) -> nn.Module:
    """Build a model with a seeded initialisation (the global RNG is left untouched)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[name](in_features, num_classes, hidden)


def get_vector(model: nn.Module) -> torch.Tensor:
    """A copy of the model's parameters as one flat vector, on the CPU wherever the model is."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().to("cpu", copy=True)


def set_vector(model: nn.Module, vector: torch.Tensor) -> None:
    """Load a flat vector into the model's parameters (moved to the model's device)."""
    device = next(model.parameters()).device
    torch.nn.utils.vector_to_parameters(vector.to(device=device, dtype=torch.float32), model.parameters())
