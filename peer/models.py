"""Models the clients train. A model is also handled as one flat float32 vector (its
parameters in ``named_parameters`` order): that is what travels and what rules aggregate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from dfedrw.peer.registry import Registry


MODEL_REGISTRY = Registry(
    "model", "dfedrw.models", required=(), supplied=("in_features", "num_classes", "hidden"), functions=True
)
"""The models by name: a builder function or an ``nn.Module`` class whose keyword parameters
are its settings (``[train.NAME]``). ``in_features`` and ``num_classes`` come from the data set,
``hidden`` from ``train.hidden``, each to a builder that takes it."""


@MODEL_REGISTRY.register("softmax_regression")
def softmax_regression(in_features: int, num_classes: int) -> nn.Module:
    """Multinomial logistic regression: one linear layer; cross-entropy supplies the softmax."""
    return nn.Sequential(nn.Linear(in_features, num_classes))


@MODEL_REGISTRY.register("mlp")
def mlp(in_features: int, num_classes: int, hidden: int) -> nn.Module:
    """One hidden ReLU layer of ``train.hidden`` units."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


def make_model(name: str, in_features: int, num_classes: int, *, hidden: int = 64, params: Mapping[str, Any] | None = None) -> nn.Module:
    """The model ``name`` built with its settings, its parameters as the builder initialised
    them (the global RNG's draws). Raises ``ValueError`` for an unknown name, a bad setting, or
    a builder that gives no ``nn.Module`` with parameters."""
    supplied = {"in_features": in_features, "num_classes": num_classes, "hidden": hidden}
    model = MODEL_REGISTRY.build(name, params, supplied)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model {name!r}: the builder returned {type(model).__name__}, not a torch.nn.Module")
    if not any(True for _ in model.parameters()):
        raise ValueError(f"model {name!r} has no parameters to train")
    return model


def build_model(
    name: str, in_features: int, num_classes: int, *, hidden: int = 64, seed: int = 0, params: Mapping[str, Any] | None = None
) -> nn.Module:
    """Build a model with a seeded initialisation (the global RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make_model(name, in_features, num_classes, hidden=hidden, params=params)


def get_vector(model: nn.Module) -> torch.Tensor:
    """A copy of the model's parameters as one flat vector, on the CPU wherever the model is
    (one copy: the concatenation is a new tensor, moved only from another device)."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu()


def set_vector(model: nn.Module, vector: torch.Tensor) -> None:
    """Load a flat vector into the model's parameters (moved to the model's device)."""
    device = next(model.parameters()).device
    torch.nn.utils.vector_to_parameters(vector.to(device=device, dtype=torch.float32), model.parameters())
