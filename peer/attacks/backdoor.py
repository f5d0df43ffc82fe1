"""Backdoor attacks: models that answer a chosen class whenever an input carries a trigger.

A backdoor leaves clean accuracy where it was; its measure is the **attack success rate**: the
share of triggered test inputs, of a class other than the target, that a model puts in the target
class. An attack states what it plants in its ``backdoor`` property (a :class:`Backdoor`: the
trigger and the target class); the running system measures every honest client's success rate on
the shared test set triggered by :meth:`Backdoor.probe`, the code that poisons the attacker's
rows (:meth:`Backdoor.poison`), so the measure and the attack cannot drift apart.

Images reach this module flattened (``[n, features]``, pixels in [0, 1]); a trigger is placed on
them through the data set's ``input_shape`` (``(channels, height, width)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

import torch

from dfedrw.peer.registry import check_choice, check_int, check_real
from dfedrw.peer.attacks.base import ATTACK_REGISTRY, AttackView, Crafted, ThreatModel
from dfedrw.peer.attacks.poisoning import TrainsOnItsSample, known_models, require_attacker_data, sample_evaluator, train_from_mean
from dfedrw.peer.learning.data import Dataset

__all__ = ["CORNERS", "TRIGGER_SHAPES", "Backdoor", "BadNets", "PlantsBackdoor", "Trigger", "attack_success_rate"]

TRIGGER_SHAPES = ("square", "pattern")
CORNERS = ("bottom_right", "bottom_left", "top_right", "top_left")


@dataclass(frozen=True)
class Trigger:
    """A pixel trigger: a ``size`` x ``size`` patch ``margin`` pixels in from the image's
    ``corner``, in every channel. ``shape``: ``"square"`` sets every pixel of it to ``value``;
    ``"pattern"`` (BadNets' checkerboard) those whose row + column in it is even, the rest to 0.

    Example: ``Trigger(size=2, margin=0)`` on a 1x4x4 image sets pixels (2, 2), (2, 3), (3, 2),
    (3, 3), flat features 10, 11, 14, 15; its ``part(1, 2)`` the second row, 14 and 15."""

    shape: str = "square"
    corner: str = "bottom_right"
    size: int = 3
    margin: int = 1
    value: float = 1.0
    # (i, k): only part i of k of the patch, the band of its rows size*i//k .. size*(i+1)//k - 1
    # (a distributed backdoor's local trigger); (0, 1) is the whole patch.
    band: tuple[int, int] = (0, 1)

    def __post_init__(self) -> None:
        part, parts = self.band
        check_int("Trigger", "band parts", parts, minimum=1)
        if not 0 <= check_int("Trigger", "band part", part, minimum=0) < parts:
            raise ValueError(f"Trigger: band part {part} outside 0..{parts - 1}")
        check_choice("Trigger", "shape", self.shape, TRIGGER_SHAPES)
        check_choice("Trigger", "corner", self.corner, CORNERS)
        object.__setattr__(self, "size", check_int("Trigger", "size", self.size, minimum=1))
        object.__setattr__(self, "margin", check_int("Trigger", "margin", self.margin, minimum=0))
        value = check_real("Trigger", "value", self.value)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"Trigger: value must be a pixel value in [0, 1], got {self.value!r}")
        object.__setattr__(self, "value", value)
        if parts > self.size:
            raise ValueError(f"Trigger: a {self.size}-pixel patch cannot be split into {parts} bands of rows; use a size of at least {parts}")

    def part(self, i: int, k: int) -> "Trigger":
        """Part ``i`` of ``k`` of this trigger (see ``band``)."""
        return Trigger(self.shape, self.corner, self.size, self.margin, self.value, (i, k))

    def pixels(self, input_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The flat features the trigger sets, ascending, and the value it sets each to."""
        channels, height, width = _image_shape(input_shape)
        if self.size + self.margin > min(height, width):
            raise ValueError(
                f"Trigger: a {self.size}x{self.size} patch {self.margin} pixel(s) from the edge does not fit a "
                f"{height}x{width} image; use size + margin <= {min(height, width)}"
            )
        top = self.margin if self.corner.startswith("top") else height - self.margin - self.size
        left = self.margin if self.corner.endswith("left") else width - self.margin - self.size
        rows, cols = torch.meshgrid(torch.arange(self.size), torch.arange(self.size), indexing="ij")
        patch = torch.full((self.size, self.size), self.value)
        if self.shape == "pattern":
            patch = torch.where((rows + cols) % 2 == 0, patch, torch.zeros(()))
        part, parts = self.band
        band = slice(self.size * part // parts, self.size * (part + 1) // parts)
        flat = ((top + rows) * width + (left + cols))[band]  # within one channel
        index = torch.cat([c * height * width + flat.reshape(-1) for c in range(channels)])
        return index, patch[band].reshape(-1).repeat(channels)

    def apply(self, x: torch.Tensor, input_shape: tuple[int, ...]) -> torch.Tensor:
        """``x [n, features]`` with the trigger stamped on every row (a copy)."""
        index, values = self.pixels(input_shape)
        if x.dim() != 2 or x.shape[1] != _features(input_shape):
            raise ValueError(f"Trigger: rows must be [n, {_features(input_shape)}] for images of shape {tuple(input_shape)}, got {tuple(x.shape)}")
        out = x.clone()
        out[:, index.to(x.device)] = values.to(device=x.device, dtype=x.dtype)
        return out


def _image_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    shape = tuple(int(d) for d in input_shape)
    if len(shape) == 2:
        shape = (1, *shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"Trigger: a trigger needs images, (channels, height, width); the data set's input shape is {tuple(input_shape)}")
    return shape  # type: ignore[return-value]


def _features(input_shape: tuple[int, ...]) -> int:
    channels, height, width = _image_shape(input_shape)
    return channels * height * width


@dataclass(frozen=True)
class Backdoor:
    """What a backdoor attack plants: inputs carrying ``trigger`` answer ``target``."""

    trigger: Trigger
    target: int

    def poison(self, x: torch.Tensor, y: torch.Tensor, fraction: float, input_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the rows with ``count = round(fraction * n)`` of them, evenly spread
        (rows ``i * n // count``), triggered and relabelled ``target``."""
        n = len(y)
        count = round(fraction * n)
        x, y = x.clone(), y.clone()
        if count:
            rows = torch.arange(count) * n // count
            x[rows] = self.trigger.apply(x[rows], input_shape)
            y[rows] = self.target
        return x, y

    def probe(self, test: Dataset, input_shape: tuple[int, ...]) -> Dataset:
        """The test rows whose class is not ``target``, triggered and labelled ``target``: a
        model's accuracy on them is its attack success rate."""
        if not 0 <= self.target < test.num_classes:
            raise ValueError(f"Backdoor: target class {self.target} outside 0..{test.num_classes - 1}")
        keep = test.y != self.target
        return Dataset(
            x=self.trigger.apply(test.x[keep], input_shape), y=torch.full((int(keep.sum()),), self.target, dtype=test.y.dtype, device=test.y.device),
            num_classes=test.num_classes,
        )


def attack_success_rate(predicted: torch.Tensor, target: int) -> float:
    """The share of a probe's predictions (:meth:`Backdoor.probe`'s rows) that are ``target``."""
    if predicted.numel() == 0:
        raise ValueError("attack_success_rate: no probe rows (every test row is of the target class)")
    return float((predicted == target).float().mean())


@dataclass(frozen=True)
class PlantsBackdoor(TrainsOnItsSample):
    """What the backdoor attacks share: the target class, the share of the attacker's sample
    that carries the trigger, the trigger's settings (see :class:`Trigger`), and the round's
    poisoned training from the mean of the honest models it knows."""

    target: int = 0
    poisoned_fraction: float = 0.5
    trigger: str = "square"
    trigger_size: int = 3
    trigger_margin: int = 1
    trigger_corner: str = "bottom_right"
    trigger_value: float = 1.0

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        super().check_settings(s)
        owner = cls.__name__
        s.target = check_int(owner, "target", s.target, minimum=0)
        fraction = check_real(owner, "poisoned_fraction", s.poisoned_fraction)
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"{owner}: poisoned_fraction must be in (0, 1], got {s.poisoned_fraction!r}")
        s.poisoned_fraction = fraction
        Trigger(s.trigger, s.trigger_corner, s.trigger_size, s.trigger_margin, s.trigger_value)  # its own checks, now

    @property
    def backdoor(self) -> Backdoor:
        """What the attack plants (the whole trigger: what a success rate is measured with)."""
        trigger = Trigger(self.trigger, self.trigger_corner, self.trigger_size, self.trigger_margin, self.trigger_value)
        return Backdoor(trigger, self.target)

    def poisoned_step(self, view: AttackView, generator: torch.Generator, trigger: Trigger | None = None) -> tuple[torch.Tensor, torch.Tensor, dict] | None:
        """The mean ``G`` of the honest models it knows (float64), the model ``X`` of ``steps`` SGD
        steps from ``G`` on its sample with its trigger (or ``trigger``, e.g. a part of it) on
        ``poisoned_fraction`` of the rows, labelled ``target``, and a note; None: none known."""
        owner = type(self).__name__
        require_attacker_data(owner, self.attacker_data)
        data = self.attacker_data
        if self.target >= data.num_classes:
            raise ValueError(f"{owner}: target class {self.target} outside 0..{data.num_classes - 1}")
        known = known_models(view)
        if len(known) == 0:
            return None
        evaluator = sample_evaluator(owner, data, self.samples)
        backdoor = self.backdoor if trigger is None else Backdoor(trigger, self.target)
        x, y = backdoor.poison(*data.samples(self.samples), self.poisoned_fraction, data.input_shape)
        lr = self.lr_scale * self.lr
        centre = known.to(torch.float64).mean(dim=0)
        model, loss = train_from_mean(evaluator, centre, x, y, data.num_classes, lr=lr, batch_size=self.batch_size, steps=self.steps, generator=generator)
        return centre, model, {"known": len(known), "lr": lr, "steps": self.steps, "poisoned_loss": loss}

    def plan(self, view: AttackView, generator: torch.Generator) -> Crafted:
        """The round's message to every receiver: :meth:`poisoned_step` with
        :meth:`local_trigger`, shaped by :meth:`shape`; silent when it knows no model."""
        step = self.poisoned_step(view, generator, self.local_trigger(view))
        if step is None:
            return Crafted(dict.fromkeys(view.receivers), {"known": 0, **self.plan_note(view)})
        centre, model, note = step
        message, shaped = self.shape(centre, model, note, view)
        return Crafted(dict.fromkeys(view.receivers, message), {**note, **shaped, **self.plan_note(view)})

    def local_trigger(self, view: AttackView) -> Trigger | None:
        """The trigger it poisons its rows with this round (None: its whole one)."""
        return None

    def plan_note(self, view: AttackView) -> dict:
        """What its round record keeps besides the step's note, whether or not it sent."""
        return {}

    def shape(self, centre: torch.Tensor, model: torch.Tensor, note: dict, view: AttackView) -> tuple[torch.Tensor, dict]:
        """The message and a note from ``centre`` and the trained ``model`` (BadNets: the model)."""
        return model, {}


@ATTACK_REGISTRY.register("badnets")
@dataclass(frozen=True)
class BadNets(PlantsBackdoor):
    """BadNets: a pixel-pattern trigger in the attacker's own data, labelled the target class.

    Each round, with ``mu`` the mean of the honest models it knows and ``(x, y)`` its own
    ``samples`` rows of the training set, of which ``poisoned_fraction`` (evenly spread, see
    :meth:`Backdoor.poison`) carry the trigger and the label ``target``::

        w_0 = mu
        w_{s+1} = w_s - eta * grad CE(w_s; poisoned batch)     s = 0 .. steps - 1
        send w_steps to every receiver

    Training as :class:`~dfedrw.peer.attacks.poisoning.LabelFlip` trains (``eta = lr_scale *
    lr``, seeded minibatches). The trigger (:class:`Trigger`): ``trigger`` (``"square"`` or
    ``"pattern"``, a checkerboard), ``trigger_size`` pixels square, ``trigger_margin`` pixels in
    from ``trigger_corner``, set to ``trigger_value``. The clean rows keep clean accuracy near an
    honest model's while the trigger maps to ``target``. The note keeps the mean minibatch loss on
    the poisoned sample. Nothing known: silent.

    Source: Gu, Dolan-Gavitt and Garg, "BadNets: Identifying Vulnerabilities in the Machine
    Learning Model Supply Chain", 2017 (the pixel-pattern trigger); as a federated attack by
    data poisoning, e.g. Sun et al., "Can You Really Backdoor Federated Learning?", 2019.

    THREAT MODEL: as :class:`~dfedrw.peer.attacks.poisoning.LabelFlip`'s, and the input shape.
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel(
        data="`samples` rows of the training set drawn by its own seed (setting samples), `poisoned_fraction` of them triggered and labelled `target`"
    )
