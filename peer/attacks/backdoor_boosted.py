"""Backdoor attacks beyond plain data poisoning: a boosted update that replaces the receivers'
average (and its form under a norm bound), a trigger split among colluders, and an update kept
off the coordinates the honest clients change most, so that it lasts.

Each trains as :class:`~dfedrw.peer.attacks.backdoor.BadNets` does (from the mean ``G`` of the
honest models it knows to a model ``X``), then shapes the update ``X - G`` it sends; each plants
one backdoor, measured with the whole trigger (:attr:`PlantsBackdoor.backdoor`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

import torch

from dfedrw.peer.registry import check_real
from dfedrw.peer.attacks.base import ATTACK_REGISTRY, AttackView, ThreatModel
from dfedrw.peer.attacks.backdoor import PlantsBackdoor, Trigger

__all__ = ["DistributedBackdoor", "ModelReplacement", "Neurotoxin", "bounded", "top_changed"]

_DATA = "`samples` rows of the training set drawn by its own seed (setting samples), `poisoned_fraction` of them triggered and labelled `target`"


def bounded(update: torch.Tensor, norm_bound: float) -> torch.Tensor:
    """``update`` scaled down to Euclidean norm ``norm_bound`` when longer (0: unbounded).

    Example: ``bounded(torch.tensor([3.0, 4.0]), 1.0)`` is ``[0.6, 0.8]``."""
    if norm_bound <= 0:
        return update
    norm = float(torch.linalg.vector_norm(update))
    return update * (norm_bound / norm) if norm > norm_bound else update


def top_changed(change: torch.Tensor, fraction: float) -> torch.Tensor:
    """Mask of the ``ceil(fraction * D)`` coordinates of largest ``|change|`` (ties: lower index).

    Example: ``top_changed(torch.tensor([0.1, -3.0, 2.0, 0.0]), 0.5)`` is
    ``[False, True, True, False]``."""
    count = min(change.numel(), int(torch.ceil(torch.tensor(fraction * change.numel())).item()))
    mask = torch.zeros(change.numel(), dtype=torch.bool)
    if count:
        # A stable sort of -|change|: equal magnitudes keep index order.
        order = torch.sort(-change.abs().cpu(), stable=True).indices[:count]
        mask[order] = True
    return mask


def _boost(setting: float, known: int) -> float:
    """The boost in use: the setting, or (0) ``known + 1`` (see :class:`ModelReplacement`)."""
    return setting if setting > 0 else float(known + 1)


@ATTACK_REGISTRY.register("model_replacement")
@dataclass(frozen=True)
class ModelReplacement(PlantsBackdoor):
    """Model replacement: the backdoored model's update boosted so that it replaces the average.

    ``L = G + clip(gamma * (X - G))``: ``X`` its poisoned step from the mean ``G`` of the honest
    models it knows (as BadNets'); ``gamma = boost`` (0: the number of models it knows + 1, what a
    receiver that heard the same neighbours averages, so its average lands near ``X``); ``clip``
    scales the update down to norm ``norm_bound`` when longer (0: none), the constrain-and-scale
    form under a defence's norm bound (give it the defence's bound: the attack does not read it).
    The note keeps the boost and the update's norm before and after the bound.

    Source: Bagdasaryan, Veit, Hua, Estrin and Shmatikov, "How To Backdoor Federated
    Learning", AISTATS 2020 (model replacement, constrain-and-scale); Sun, Kairouz, Suresh and
    McMahan, "Can You Really Backdoor Federated Learning?", 2019, and Wang et al., "Attack of
    the Tails", NeurIPS 2020 (the update projected into the norm ball).

    THREAT MODEL: as :class:`~dfedrw.peer.attacks.backdoor.BadNets` (the models it received,
    its own sample; not the defence: a norm bound is a setting). The same message to all.
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel(data=_DATA)
    boost: float = 0.0
    norm_bound: float = 0.0

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        super().check_settings(s)
        s.boost = check_real("ModelReplacement", "boost", s.boost, nonnegative=True)
        s.norm_bound = check_real("ModelReplacement", "norm_bound", s.norm_bound, nonnegative=True)

    def shape(self, centre: torch.Tensor, model: torch.Tensor, note: dict, view: AttackView) -> tuple[torch.Tensor, dict]:
        gamma = _boost(self.boost, note["known"])
        update = gamma * (model.to(torch.float64) - centre)
        sent = bounded(update, self.norm_bound)
        norms = {"update_norm": float(torch.linalg.vector_norm(update)), "sent_norm": float(torch.linalg.vector_norm(sent))}
        return (centre + sent).to(torch.float32), {"boost": gamma, **norms}


@ATTACK_REGISTRY.register("dba")
@dataclass(frozen=True)
class DistributedBackdoor(PlantsBackdoor):
    """Distributed backdoor (DBA): each colluder plants one part of the trigger.

    The trigger's patch is cut into one band of rows per colluder
    (:meth:`~dfedrw.peer.attacks.backdoor.Trigger.part`); colluder ``i`` (its place among the
    sorted colluders) poisons its rows with band ``i`` only, trains as BadNets does and sends
    ``G + gamma * (X - G)`` (``boost`` ``gamma``; 1: none). The honest clients are measured with
    the whole trigger, which no colluder sent: the parts add up in the models. Every colluder
    computes the same split from the colluders' list (its note keeps its part and the
    colluders); ``trigger_size`` must be at least the number of colluders.

    Source: Xie, Huang, Chen and Li, "DBA: Distributed Backdoor Attacks against Federated
    Learning", ICLR 2020.

    THREAT MODEL: as :class:`~dfedrw.peer.attacks.backdoor.BadNets`, colluding
    (``attack.colluding = true``: the colluders pool the honest models they received and share
    one data sample). Every receiver gets the same message.
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel(models="pooled", data=_DATA, colludes=True)
    boost: float = 1.0

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        super().check_settings(s)
        s.boost = check_real("DistributedBackdoor", "boost", s.boost, positive=True)

    @staticmethod
    def _split(view: AttackView) -> tuple[int, tuple[int, ...]]:
        """Its part and the colluders, sorted (alone: the one part)."""
        colluders = tuple(sorted(view.colluders)) or (view.attacker,)
        return colluders.index(view.attacker), colluders

    def local_trigger(self, view: AttackView) -> Trigger:
        part, colluders = self._split(view)
        return self.backdoor.trigger.part(part, len(colluders))

    def plan_note(self, view: AttackView) -> dict:
        part, colluders = self._split(view)
        return {"part": part, "colluders": list(colluders)}

    def shape(self, centre: torch.Tensor, model: torch.Tensor, note: dict, view: AttackView) -> tuple[torch.Tensor, dict]:
        return (centre + self.boost * (model.to(torch.float64) - centre)).to(torch.float32), {}


@ATTACK_REGISTRY.register("neurotoxin")
@dataclass(frozen=True)
class Neurotoxin(PlantsBackdoor):
    """Neurotoxin: the backdoor's update kept off the coordinates the honest models change most.

    The honest clients' last change is estimated as ``G - G_prev`` (the mean of the models it
    knows now and in its previous round, the view's ``reference``); its ``mask_fraction``
    largest coordinates by magnitude are those honest training keeps rewriting. The attacker's
    update ``X - G`` (its poisoned step, as BadNets') is zeroed there and sent as
    ``G + gamma * masked`` (``boost`` ``gamma``): written where the honest clients seldom write,
    the backdoor outlasts the attack. In its first round (no reference) nothing is masked. The
    mask is applied to the whole update once, not to each SGD step (the same for one local
    step). The note keeps how many coordinates were masked.

    Source: Zhang, Panda, Song, Yang, Mahoney, Gonzalez, Ramchandran and Mahoney, "Neurotoxin:
    Durable Backdoors in Federated Learning", ICML 2022.

    THREAT MODEL: as :class:`~dfedrw.peer.attacks.backdoor.BadNets`, and the models it knew last
    round; it does not know the defence. Every receiver gets the same message.
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel(data=_DATA)
    mask_fraction: float = 0.1
    boost: float = 1.0

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        super().check_settings(s)
        fraction = check_real("Neurotoxin", "mask_fraction", s.mask_fraction, nonnegative=True)
        if fraction >= 1.0:
            raise ValueError(f"Neurotoxin: mask_fraction must be in [0, 1), got {s.mask_fraction!r}")
        s.mask_fraction = fraction
        s.boost = check_real("Neurotoxin", "boost", s.boost, positive=True)

    def shape(self, centre: torch.Tensor, model: torch.Tensor, note: dict, view: AttackView) -> tuple[torch.Tensor, dict]:
        update = model.to(torch.float64) - centre
        masked = 0
        if view.reference is not None:
            mask = top_changed(centre - view.reference.to(torch.float64), self.mask_fraction).to(update.device)
            update = update.masked_fill(mask, 0.0)
            masked = int(mask.sum())
        return (centre + self.boost * update).to(torch.float32), {"masked": masked}
