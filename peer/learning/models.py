"""Models the clients train. A model is also handled as one flat float32 vector (its
parameters in ``named_parameters`` order): that is what travels and what rules aggregate."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from dfedrw.peer.checked import checked_by
from dfedrw.peer.quote import shown
from dfedrw.peer.registry import Registry


MODEL_REGISTRY = Registry(
    "model", "dfedrw.models", required=(), supplied=("in_features", "num_classes", "input_shape", "hidden"), functions=True
)
"""The models by name: a builder function or an ``nn.Module`` class whose keyword parameters
are its settings (``[train.NAME]``). ``in_features``, ``num_classes`` and ``input_shape`` (the
data set's ``(channels, height, width)``, or ``(in_features,)`` for a set that declares no
image shape) come from the data set, ``hidden`` from ``train.hidden``, each to a builder that
takes it. A model receives its inputs flat, ``[n, in_features]`` (what a data set holds), and
shapes them itself (the built-in image models start with an ``nn.Unflatten``)."""


def _fits_any(**_: Any) -> None:
    """A builder's check where every data set fits it (flat rows of any width)."""


@MODEL_REGISTRY.register("softmax_regression")
@checked_by(_fits_any)
def softmax_regression(in_features: int, num_classes: int) -> nn.Module:
    """Multinomial logistic regression: one linear layer; cross-entropy supplies the softmax."""
    return nn.Sequential(nn.Linear(in_features, num_classes))


@MODEL_REGISTRY.register("mlp")
@checked_by(_fits_any)
def mlp(in_features: int, num_classes: int, hidden: int) -> nn.Module:
    """One hidden ReLU layer of ``train.hidden`` units."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


def _image_shape(model: str, input_shape: tuple[int, ...], *, channels: int | None = None, least: int = 1) -> tuple[int, int, int]:
    """``input_shape`` as (channels, height, width) for an image model, or one line saying why not."""
    shape = tuple(int(n) for n in input_shape)
    if len(shape) != 3:
        raise ValueError(
            f"{model} needs images (channels, height, width); the data set declares input_shape = {shape} "
            "(a data set names its image shape in its input_shape)"
        )
    if channels is not None and shape[0] != channels:
        raise ValueError(f"{model} is built for {channels}-channel images; the data set's are {shape[0]}-channel ({shape})")
    if min(shape[1:]) < least:
        raise ValueError(f"{model} needs images at least {least}x{least}; the data set's are {shape[1]}x{shape[2]}")
    return shape  # type: ignore[return-value]


def _norm(kind: str, channels: int, groups: int) -> nn.Module:
    """The normalisation layer of the built-in residual networks: GroupNorm (statistics of each
    sample alone, so nothing but its weight and bias to average) or none."""
    if kind == "group":
        return nn.GroupNorm(math.gcd(groups, channels), channels)
    return nn.Identity()


def _check_norm(model: str, norm: str, groups: int) -> None:
    if norm not in ("group", "none"):
        raise ValueError(f"{model}: norm={shown(norm)} is not valid; choose one of: group, none")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{model}: groups must be an integer >= 1, got {groups!r}")


class MaxPool2x2(nn.Module):
    """``nn.MaxPool2d(2)``'s values (the largest of each 2x2 window, a trailing odd row or column
    left out) as two elementwise maxima, of row pairs then of column pairs: on the CPU, for the
    small channel counts of LeNet-5 and the FEMNIST CNN, about 8x faster than ``max_pool2d``
    (measured on LeNet-5's activations: docs/batched-speed.md). The gradient is the same where a
    window's maximum is unique; where it is tied, it is shared among the tied entries."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2], x.shape[-1]
        x = x[..., : h - h % 2, : w - w % 2]
        rows = torch.maximum(x[..., 0::2, :], x[..., 1::2, :])
        return torch.maximum(rows[..., 0::2], rows[..., 1::2])


@MODEL_REGISTRY.register("lenet5")
@checked_by(lambda input_shape, **_: _image_shape("lenet5", input_shape, least=12))
def lenet5(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """LeNet-5 (LeCun et al. 1998) as usually trained on 28x28 greyscale images: 5x5
    convolutions of 6 (padded by 2) and 16 channels, each followed by ReLU and 2x2 max pooling,
    then fully connected layers of 120 and 84 units and the classes. 61,706 parameters for
    Fashion-MNIST's 1x28x28 and 10 classes; any image shape of at least 12x12 works (the first
    linear layer takes what the convolutions leave). The pooling comes before the ReLU (the
    same values: the ReLU is monotone, so the largest of four rectified values is the rectified
    largest), which rectifies a quarter as many values."""
    c, h, w = lenet5.check_arguments(input_shape)
    flat = 16 * ((h // 2 - 4) // 2) * ((w // 2 - 4) // 2)
    return nn.Sequential(
        nn.Unflatten(1, (c, h, w)),
        nn.Conv2d(c, 6, 5, padding=2), MaxPool2x2(), nn.ReLU(),
        nn.Conv2d(6, 16, 5), MaxPool2x2(), nn.ReLU(),
        nn.Flatten(), nn.Linear(flat, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, num_classes),
    )


def _check_femnist_cnn(input_shape: tuple[int, ...], width: int = 2048, **_: Any) -> tuple[int, int, int]:
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= 65_536:
        raise ValueError(f"femnist_cnn: width must be an integer in [1, 65536], got {width!r}")
    return _image_shape("femnist_cnn", input_shape, least=4)


@MODEL_REGISTRY.register("femnist_cnn")
@checked_by(_check_femnist_cnn)
def femnist_cnn(input_shape: tuple[int, ...], num_classes: int, width: int = 2048) -> nn.Module:
    """The CNN of the FedAvg paper (McMahan et al. 2017) and LEAF's FEMNIST baseline (Caldas
    et al. 2018): 5x5 convolutions of 32 and 64 channels (padded to keep the size), each with
    ReLU and 2x2 max pooling (pooled first, as in :func:`lenet5`), a fully connected layer of
    ``width`` units (ReLU), then the classes. 6,603,710 parameters for FEMNIST's 1x28x28 and 62 classes at the default width."""
    c, h, w = _check_femnist_cnn(input_shape, width)
    return nn.Sequential(
        nn.Unflatten(1, (c, h, w)),
        nn.Conv2d(c, 32, 5, padding=2), MaxPool2x2(), nn.ReLU(),
        nn.Conv2d(32, 64, 5, padding=2), MaxPool2x2(), nn.ReLU(),
        nn.Flatten(), nn.Linear(64 * (h // 4) * (w // 4), width), nn.ReLU(), nn.Linear(width, num_classes),
    )


class BasicBlock(nn.Module):
    """A residual block of two 3x3 convolutions, each normalised, ReLU after the first and
    after the sum with the shortcut. ``shortcut``: ``"pad"`` (He et al.'s option A for CIFAR:
    the input subsampled and its extra channels zero, no parameters) or ``"conv"`` (a 1x1
    convolution and its normalisation, option B) when the shape changes; identity otherwise."""

    def __init__(self, inp: int, out: int, stride: int, *, shortcut: str, norm: str, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inp, out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _norm(norm, out, groups)
        self.conv2 = nn.Conv2d(out, out, 3, padding=1, bias=False)
        self.norm2 = _norm(norm, out, groups)
        self.pad = 0
        self.stride = stride
        self.project: nn.Module | None = None
        if stride != 1 or inp != out:
            if shortcut == "conv":
                self.project = nn.Sequential(nn.Conv2d(inp, out, 1, stride=stride, bias=False), _norm(norm, out, groups))
            else:
                self.pad = out - inp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm2(self.conv2(F.relu(self.norm1(self.conv1(x)))))
        if self.project is not None:
            short = self.project(x)
        elif self.pad or self.stride != 1:
            short = x[:, :, :: self.stride, :: self.stride]
            if self.pad:
                short = F.pad(short, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        else:
            short = x
        return F.relu(y + short)


class ResNet(nn.Module):
    """A residual network for small images (CIFAR's 32x32): a 3x3 stem convolution, stages of
    :class:`BasicBlock` (the first block of each stage after the first halves the size), global
    average pooling and one linear layer. Flat inputs are unflattened to ``input_shape``."""

    def __init__(
        self, input_shape: tuple[int, int, int], num_classes: int, *, widths: tuple[int, ...], blocks: tuple[int, ...],
        shortcut: str, norm: str, groups: int,
    ) -> None:
        super().__init__()
        c = input_shape[0]
        self.unflatten = nn.Unflatten(1, tuple(input_shape))
        self.stem = nn.Conv2d(c, widths[0], 3, padding=1, bias=False)
        self.stem_norm = _norm(norm, widths[0], groups)
        layers: list[nn.Module] = []
        inp = widths[0]
        for i, (width, count) in enumerate(zip(widths, blocks, strict=True)):
            for j in range(count):
                layers.append(BasicBlock(inp, width, 2 if i and not j else 1, shortcut=shortcut, norm=norm, groups=groups))
                inp = width
        self.blocks = nn.Sequential(*layers)
        self.head = nn.Linear(inp, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.stem_norm(self.stem(self.unflatten(x))))
        h = self.blocks(h)
        return self.head(h.mean(dim=(2, 3)))


def _check_resnet(model: str, least: int) -> Any:
    """A residual network's check: its normalisation settings, and images of at least ``least``."""

    def check(input_shape: tuple[int, ...], norm: str = "group", groups: int = 2, **_: Any) -> tuple[int, int, int]:
        _check_norm(model, norm, groups)
        return _image_shape(model, input_shape, least=least)

    return check


@MODEL_REGISTRY.register("resnet20")
@checked_by(_check_resnet("resnet20", least=4))
def resnet20(input_shape: tuple[int, ...], num_classes: int, norm: str = "group", groups: int = 2) -> nn.Module:
    """ResNet-20 for CIFAR (He et al. 2016, section 4.2): three stages of three basic blocks at 16,
    32 and 64 channels, parameter-free shortcuts (option A). ``norm = "group"``: GroupNorm of
    ``groups`` groups after every convolution (Wu and He 2018; 2 groups as in Hsieh et al. 2020 for
    non-IID federated training), in place of BatchNorm, whose running statistics do not average
    across clients; ``"none"``: no normalisation. 269,722 parameters for 3x32x32 and 10 classes."""
    shape = resnet20.check_arguments(input_shape, norm, groups)
    return ResNet(shape, num_classes, widths=(16, 32, 64), blocks=(3, 3, 3), shortcut="pad", norm=norm, groups=groups)


@MODEL_REGISTRY.register("resnet18")
@checked_by(_check_resnet("resnet18", least=8))
def resnet18(input_shape: tuple[int, ...], num_classes: int, norm: str = "group", groups: int = 2) -> nn.Module:
    """ResNet-18 (He et al. 2016) in its CIFAR form: a 3x3 stem without max pooling, four
    stages of two basic blocks at 64, 128, 256 and 512 channels, 1x1 projection shortcuts
    (option B). Normalisation as :func:`resnet20`'s. 11,173,962 parameters for 3x32x32 and 10
    classes (44.7 MB a model)."""
    shape = resnet18.check_arguments(input_shape, norm, groups)
    return ResNet(shape, num_classes, widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2), shortcut="conv", norm=norm, groups=groups)


def _running_statistics(model: nn.Module) -> str | None:
    """The first layer of ``model`` that keeps running statistics (BatchNorm's), by name."""
    for name, layer in model.named_modules():
        if isinstance(layer, (nn.modules.batchnorm._NormBase)) and layer.track_running_stats:
            return f"{type(layer).__name__} {name!r}"
    return None


def make_model(
    name: str, in_features: int, num_classes: int, *, hidden: int = 64, input_shape: tuple[int, ...] | None = None,
    params: Mapping[str, Any] | None = None,
) -> nn.Module:
    """The model ``name`` built with its settings, its parameters as the builder initialised
    them (the global RNG's draws). ``input_shape`` defaults to ``(in_features,)``. Raises
    ``ValueError`` for an unknown name, a bad setting, a builder that gives no ``nn.Module``
    with parameters, or a model with running statistics (BatchNorm's): only parameters travel
    and are averaged, so each client would keep statistics of its own data under averaged
    weights, and the batched engine's clients would share one set."""
    shape = tuple(input_shape) if input_shape is not None else (in_features,)
    supplied = {"in_features": in_features, "num_classes": num_classes, "hidden": hidden, "input_shape": shape}
    model = MODEL_REGISTRY.build(name, params, supplied)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model {name!r}: the builder returned {type(model).__name__}, not a torch.nn.Module")
    if not any(True for _ in model.parameters()):
        raise ValueError(f"model {name!r} has no parameters to train")
    running = _running_statistics(model)
    if running is not None:
        raise ValueError(
            f"model {name!r}: {running} keeps running statistics, which are not model parameters and so are neither sent nor "
            "averaged; use GroupNorm (as the built-in resnet20 and resnet18 do) or BatchNorm with track_running_stats=False"
        )
    return model


def check_model_fits(
    name: str, in_features: int, num_classes: int, *, hidden: int = 64, input_shape: tuple[int, ...] | None = None,
    params: Mapping[str, Any] | None = None,
) -> None:
    """What :func:`make_model` refuses, refused (``ValueError``): a built-in builder's own check
    (:func:`~dfedrw.peer.checked.checked_by`), nothing built; any other model built on the meta
    device (no memory) and checked as :func:`make_model` checks it."""
    shape = tuple(input_shape) if input_shape is not None else (in_features,)
    if callable(getattr(MODEL_REGISTRY.resolve(name), "check_arguments", None)):
        MODEL_REGISTRY.check(name, params, {"in_features": in_features, "num_classes": num_classes, "hidden": hidden, "input_shape": shape})
        return
    with torch.device("meta"):
        make_model(name, in_features, num_classes, hidden=hidden, input_shape=shape, params=params)


def build_model(
    name: str, in_features: int, num_classes: int, *, hidden: int = 64, input_shape: tuple[int, ...] | None = None, seed: int = 0,
    params: Mapping[str, Any] | None = None,
) -> nn.Module:
    """Build a model with a seeded initialisation (the global RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make_model(name, in_features, num_classes, hidden=hidden, input_shape=input_shape, params=params)


def get_vector(model: nn.Module) -> torch.Tensor:
    """A copy of the model's parameters as one flat vector, on the CPU wherever the model is
    (one copy: the concatenation is a new tensor, moved only from another device)."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu()


def set_vector(model: nn.Module, vector: torch.Tensor) -> None:
    """Load a flat vector into the model's parameters (moved to the model's device)."""
    device = next(model.parameters()).device
    torch.nn.utils.vector_to_parameters(vector.to(device=device, dtype=torch.float32), model.parameters())
