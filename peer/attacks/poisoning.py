"""Data poisoning: the attacker trains on data it corrupted and sends the model it gets.

Unlike the crafted attacks, the message is a model honestly trained on poisoned labels: it moves
as a gradient step moves, so it looks far more like an honest update than a scaled or noisy model
does, while pulling the receivers toward a classifier that confuses the classes it swapped.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import torch

from dfedrw.peer.checked import Checked
from dfedrw.peer.registry import check_choice, check_int, check_real
from dfedrw.peer.attacks.base import ATTACK_REGISTRY, AttackView, Crafted, ThreatModel
from dfedrw.peer.learning.data import Dataset
from dfedrw.peer.learning.models import get_vector, set_vector
from dfedrw.peer.learning.training import LocalTrainer
from dfedrw.peer.learning.model_matrix import VectorEvaluator

__all__ = ["FLIPS", "LabelFlip", "flip_labels", "known_models", "require_attacker_data", "sample_evaluator", "train_from_mean", "TrainsOnItsSample"]

FLIPS = ("reverse", "shift")


def flip_labels(y: torch.Tensor, num_classes: int, flip: str) -> torch.Tensor:
    """The poisoned labels: ``"reverse"``: ``y -> C - 1 - y``; ``"shift"``: ``y -> (y + 1) mod C``.

    Example: ``flip_labels(torch.tensor([0, 1, 9]), 10, "reverse")`` is ``[9, 8, 0]``.
    """
    check_choice("flip_labels", "flip", flip, FLIPS)
    check_int("flip_labels", "num_classes", num_classes, minimum=2)
    return num_classes - 1 - y if flip == "reverse" else (y + 1) % num_classes


@dataclass(frozen=True)
class TrainsOnItsSample(Checked):
    """What the data-poisoning attacks share: the attacker's sample (``attacker_data``, supplied
    by the running system; None when a class is built by hand or listed, refused when it plans),
    ``samples`` rows of it, and the local training they run on it: ``steps`` SGD steps of
    ``batch_size`` rows at ``lr_scale * lr`` (``lr``: the honest clients' learning rate)."""

    attacker_data: Any = None
    lr: float = 0.01
    steps: int = 5
    lr_scale: float = 1.0
    batch_size: int = 32
    samples: int = 200

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        owner = cls.__name__
        s.lr = check_real(owner, "lr", s.lr, positive=True)
        s.steps = check_int(owner, "steps", s.steps, minimum=1)
        s.lr_scale = check_real(owner, "lr_scale", s.lr_scale, positive=True)
        s.batch_size = check_int(owner, "batch_size", s.batch_size, minimum=1)
        s.samples = check_int(owner, "samples", s.samples, minimum=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        data = self.attacker_data  # supplied: checked once built
        if data is not None and not (callable(getattr(data, "samples", None)) and callable(getattr(data, "evaluate", None))):
            raise ValueError(f"{type(self).__name__}: attacker_data must offer samples(n) and evaluate(n) (an AttackerData), got {data!r}")


@ATTACK_REGISTRY.register("label_flip")
@dataclass(frozen=True)
class LabelFlip(TrainsOnItsSample):
    """Label flipping: SGD from the known models' mean on its own sample with flipped labels.

    Each round, with ``mu`` the mean of the honest models it knows and ``(x, y)`` its own
    ``samples`` rows of the training set::

        w_0 = mu
        w_{s+1} = w_s - eta * grad CE(w_s; x_B, flip(y_B))     s = 0 .. steps - 1
        send w_steps to every receiver

    ``flip``: ``"reverse"`` (``y -> C - 1 - y``) or ``"shift"`` (``y -> (y + 1) mod C``);
    ``eta = lr_scale * lr`` (``lr``: the honest clients' learning rate, supplied by the running
    system; 0.01, the paper's, when built by hand); minibatches ``B`` of ``batch_size`` rows walk
    a permutation of the sample seeded from the round's ``generator`` (equal seeds replay
    exactly). The steps are the project's own local training
    (:class:`~dfedrw.peer.learning.training.LocalTrainer` on the scenario's model), so the message
    is what an honest client with those labels would send. The note keeps ``lr``, ``steps`` and
    the mean minibatch loss on the flipped labels. Nothing known: silent.

    Source: Tolpegin, Truex, Gursoy and Liu, "Data Poisoning Attacks Against Federated
    Learning Systems", ESORICS 2020 (label flipping by malicious participants); Fang, Cao, Jia
    and Gong, "Local Model Poisoning Attacks to Byzantine-Robust Federated Learning", USENIX
    Security 2020, use ``C - 1 - y`` as their label-flipping baseline.

    THREAT MODEL: knows the models its honest neighbours sent it this round (the colluders' pool
    with ``attack.colluding``), ``samples`` rows of the training set drawn by its own seed, and
    the scenario's model and learning rate; not the defence. Every receiver gets the same message.
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel(data="`samples` rows of the training set drawn by its own seed (setting samples)")
    flip: str = "reverse"

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        super().check_settings(s)
        check_choice("LabelFlip", "flip", s.flip, FLIPS)

    def plan(self, view: AttackView, generator: torch.Generator) -> Crafted:
        require_attacker_data("LabelFlip", self.attacker_data)
        known = known_models(view)
        if len(known) == 0:
            return Crafted(dict.fromkeys(view.receivers), {"known": 0})
        evaluator = sample_evaluator("LabelFlip", self.attacker_data, self.samples)
        x, y = self.attacker_data.samples(self.samples)
        lr = self.lr_scale * self.lr
        message, loss = train_from_mean(
            evaluator, known.to(torch.float64).mean(dim=0), x, flip_labels(y, self.attacker_data.num_classes, self.flip), self.attacker_data.num_classes,
            lr=lr, batch_size=self.batch_size, steps=self.steps, generator=generator,
        )
        return Crafted(dict.fromkeys(view.receivers, message), {"known": len(known), "lr": lr, "steps": self.steps, "flipped_loss": loss})


def known_models(view: AttackView) -> torch.Tensor:
    """The finite honest models the attacker knows this round (rows)."""
    _, known = view.known()
    return known[torch.isfinite(known).all(dim=1)]


def require_attacker_data(owner: str, attacker_data: Any) -> None:
    """Refuse to plan without the attacker's sample (None: a class built by hand or listed)."""
    if attacker_data is None:
        raise ValueError(f"{owner}: no attacker_data: the running system supplies the attacker's sample; give one when building it by hand")


def sample_evaluator(owner: str, attacker_data: Any, samples: int) -> VectorEvaluator:
    """The evaluator the running system built for the attacker's sample: it holds the
    scenario's model, which the poisoning attacks train (not one they would have to guess)."""
    evaluator = attacker_data.evaluate(samples)
    if not isinstance(evaluator, VectorEvaluator):
        raise ValueError(f"{owner}: attacker_data.evaluate must give a VectorEvaluator (it holds the model), got {type(evaluator).__name__}")
    return evaluator


def train_from_mean(
    evaluator: VectorEvaluator, centre: torch.Tensor, x: torch.Tensor, y: torch.Tensor, num_classes: int,
    *, lr: float, batch_size: int, steps: int, generator: torch.Generator,
) -> tuple[torch.Tensor, float]:
    """The model ``steps`` SGD steps of the project's local training make from ``centre`` (float64)
    on ``(x, y)`` (minibatches walk a permutation seeded from ``generator``), and the mean loss."""
    device = evaluator.data.x.device
    model = copy.deepcopy(evaluator.model.module)
    set_vector(model, centre)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    trainer = LocalTrainer(model, Dataset(x=x.to(device), y=y.to(device), num_classes=num_classes), lr=lr, batch_size=batch_size, local_steps=steps, seed=seed)
    loss = trainer.step()
    return get_vector(model), loss
