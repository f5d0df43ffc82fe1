"""Data poisoning: the attacker trains on data it corrupted and sends the model it gets.

Unlike the model-crafting attacks, the message here is an honestly trained model, only on
poisoned labels: it moves the way a gradient step moves, so it looks like an honest client's
update far more than a scaled or noisy model does, while pulling the receivers toward a
classifier that confuses the classes it swapped.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dfedrw.peer.registry import check_choice, check_int, check_real
from dfedrw.peer.attacks.base import ATTACK_REGISTRY, AttackView, Crafted, ThreatModel
from dfedrw.peer.learning.data import Dataset
from dfedrw.peer.learning.models import get_vector, set_vector
from dfedrw.peer.learning.training import LocalTrainer
from dfedrw.peer.learning.model_matrix import VectorEvaluator

__all__ = ["FLIPS", "LabelFlip", "flip_labels"]

FLIPS = ("reverse", "shift")


def flip_labels(y: torch.Tensor, num_classes: int, flip: str) -> torch.Tensor:
    """The poisoned labels: ``"reverse"``: ``y -> C - 1 - y``; ``"shift"``: ``y -> (y + 1) mod C``.

    Example: ``flip_labels(torch.tensor([0, 1, 9]), 10, "reverse")`` is ``[9, 8, 0]``.
    """
    check_choice("flip_labels", "flip", flip, FLIPS)
    check_int("flip_labels", "num_classes", num_classes, minimum=2)
    return num_classes - 1 - y if flip == "reverse" else (y + 1) % num_classes


@ATTACK_REGISTRY.register("label_flip")
@dataclass(frozen=True)
class LabelFlip:
    """Label flipping: SGD from the known models' mean on its own sample with flipped labels.

    Each round, with ``mu`` the mean of the honest models it knows and ``(x, y)`` its own
    ``samples`` rows of the training set::

        w_0 = mu
        w_{s+1} = w_s - eta * grad CE(w_s; x_B, flip(y_B))     s = 0 .. steps - 1
        send w_steps to every receiver

    ``flip``: ``"reverse"`` (``y -> C - 1 - y``) or ``"shift"`` (``y -> (y + 1) mod C``);
    ``eta = lr_scale * lr`` (``lr``: the honest clients' learning rate, supplied by the running
    system; 0.01, the paper's, when built by hand); minibatches ``B`` of
    ``batch_size`` rows walk a permutation of the sample seeded from the round's ``generator``
    (so equal seeds replay exactly). The steps are the project's own local training
    (:class:`~dfedrw.peer.learning.training.LocalTrainer` on the scenario's model), so the message is
    what an honest client with those labels would send. The note keeps ``lr``, ``steps`` and
    the mean minibatch loss on the flipped labels. Nothing known: silent (None to every
    receiver).

    Source: Tolpegin, Truex, Gursoy and Liu, "Data Poisoning Attacks Against Federated
    Learning Systems", ESORICS 2020 (label flipping by malicious participants); Fang, Cao, Jia
    and Gong, "Local Model Poisoning Attacks to Byzantine-Robust Federated Learning", USENIX
    Security 2020, use ``C - 1 - y`` as their label-flipping baseline.

    THREAT MODEL: knows the models its honest neighbours sent it this round (the colluders'
    pool with ``attack.colluding``) and holds ``samples`` rows of the training set drawn by its
    own seed, plus the scenario's model architecture and learning rate; it does not know the
    defence. Every receiver gets the same message.

    Example::

        attack = LabelFlip(attacker_data=data, lr=0.01, steps=5, flip="shift")
        crafted = craft_round(attack, view, torch.Generator().manual_seed(0))
        crafted.messages[receiver]  # the model after 5 steps on shifted labels
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel(data="`samples` rows of the training set drawn by its own seed (setting samples)")
    attacker_data: Any = None
    lr: float = 0.01
    steps: int = 5
    lr_scale: float = 1.0
    batch_size: int = 32
    flip: str = "reverse"
    samples: int = 200

    def __post_init__(self) -> None:
        # None: not supplied yet (a class built by hand or listed); refused when it plans.
        if self.attacker_data is not None and not (
            callable(getattr(self.attacker_data, "samples", None)) and callable(getattr(self.attacker_data, "evaluate", None))
        ):
            raise ValueError(f"LabelFlip: attacker_data must offer samples(n) and evaluate(n) (an AttackerData), got {self.attacker_data!r}")
        object.__setattr__(self, "lr", check_real("LabelFlip", "lr", self.lr, positive=True))
        object.__setattr__(self, "steps", check_int("LabelFlip", "steps", self.steps, minimum=1))
        object.__setattr__(self, "lr_scale", check_real("LabelFlip", "lr_scale", self.lr_scale, positive=True))
        object.__setattr__(self, "batch_size", check_int("LabelFlip", "batch_size", self.batch_size, minimum=1))
        check_choice("LabelFlip", "flip", self.flip, FLIPS)
        object.__setattr__(self, "samples", check_int("LabelFlip", "samples", self.samples, minimum=1))

    def plan(self, view: AttackView, generator: torch.Generator) -> Crafted:
        if self.attacker_data is None:
            raise ValueError("LabelFlip: no attacker_data: the running system supplies the attacker's sample; give one when building it by hand")
        _, known = view.known()
        known = known[torch.isfinite(known).all(dim=1)]
        if len(known) == 0:
            return Crafted(dict.fromkeys(view.receivers), {"known": 0})
        evaluator = self.attacker_data.evaluate(self.samples)
        if not isinstance(evaluator, VectorEvaluator):
            # The model to train comes from the evaluator the running system built for the
            # sample: the scenario's architecture, not one this attack would have to guess.
            raise ValueError(f"LabelFlip: attacker_data.evaluate must give a VectorEvaluator (it holds the model), got {type(evaluator).__name__}")
        x, y = self.attacker_data.samples(self.samples)
        device = evaluator.data.x.device
        poisoned = Dataset(
            x=x.to(device), y=flip_labels(y, self.attacker_data.num_classes, self.flip).to(device),
            num_classes=self.attacker_data.num_classes,
        )
        model = copy.deepcopy(evaluator.model.module)
        set_vector(model, known.to(torch.float64).mean(dim=0))
        lr = self.lr_scale * self.lr
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        trainer = LocalTrainer(model, poisoned, lr=lr, batch_size=self.batch_size, local_steps=self.steps, seed=seed)
        loss = trainer.step()
        message = get_vector(model)
        return Crafted(dict.fromkeys(view.receivers, message), {"known": len(known), "lr": lr, "steps": self.steps, "flipped_loss": loss})
