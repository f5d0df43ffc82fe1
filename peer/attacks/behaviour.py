"""Behavioural attacks: what a faulty or sly client does with its messages rather than with
their values, such as going silent in some rounds.

Pure tensor code (no transport); maths in float64, messages float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dfedrw.peer.aggregation.registry import check_choice, check_int, check_real
from dfedrw.peer.attacks.base import ATTACK_REGISTRY, AttackView, Crafted, ThreatModel
from dfedrw.peer.attacks.optimized import colluder_generator

__all__ = ["Omission"]

_OTHERWISE = ("mean", "gaussian")


@ATTACK_REGISTRY.register("omission")
@dataclass(frozen=True)
class Omission:
    """Omission: silent to every receiver in chosen rounds, a benign-looking model otherwise.

    Round ``t`` is silent when ``start <= t`` (and ``t < stop`` when ``stop`` is set) and
    ``t % every == phase``. In the other rounds every receiver gets the same message, by
    ``otherwise``: ``"mean"``: ``mean(B)``; ``"gaussian"``: ``mean(B) + std * z``,
    ``z ~ N(0, I_D)`` drawn once per round; ``B`` = :meth:`AttackView.known` (the colluders'
    pool with ``attack.colluding``). It is silent too when it knows no model (nothing to
    imitate). The note records ``silent`` (and, when silent without being scheduled, why).

    Defaults (``every = 2``, ``phase = 0``): silent in even rounds, the mean in odd ones,
    which a deadline-based round protocol must ride out without stalling; ``every = 1`` is
    silent in every round of the window, a crash between ``start`` and ``stop``.

    Source: the omission failure (a process that fails to send some of its messages), the
    mildest fault in the hierarchy below Byzantine behaviour: Perry and Toueg, "Distributed
    Agreement in the Presence of Processor and Communication Faults", IEEE Transactions on
    Software Engineering, 1986. Not from the DFedReweighting paper.

    THREAT MODEL: knows the models its neighbours sent it this round (the pool when
    colluding) and the round number; does not know the defence; the same message to every
    receiver. Colluding, each colluder draws its own noise (:func:`colluder_generator`).

    Example::

        attack = Omission(every=3, phase=1, otherwise="gaussian", std=0.01)
        crafted = attack.plan(view, torch.Generator().manual_seed(0))
        crafted.note["silent"]  # True in rounds 1, 4, 7, ...
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel()
    every: int = 2
    phase: int = 0
    start: int = 0
    stop: int | None = None
    otherwise: str = "mean"
    std: float = 0.01

    def __post_init__(self) -> None:
        every = check_int("Omission", "every", self.every, minimum=1)
        phase = check_int("Omission", "phase", self.phase, minimum=0)
        if phase >= every:
            raise ValueError(f"Omission: phase must be < every ({every}), got {self.phase!r}")
        start = check_int("Omission", "start", self.start, minimum=0)
        if self.stop is not None:
            stop = check_int("Omission", "stop", self.stop, minimum=0)
            if stop <= start:
                raise ValueError(f"Omission: stop must be > start ({start}) or None, got {self.stop!r}")
            object.__setattr__(self, "stop", stop)
        check_choice("Omission", "otherwise", self.otherwise, _OTHERWISE)
        object.__setattr__(self, "std", check_real("Omission", "std", self.std, positive=True))
        object.__setattr__(self, "every", every)
        object.__setattr__(self, "phase", phase)
        object.__setattr__(self, "start", start)

    def silent_in(self, t: int) -> bool:
        """Whether round ``t`` is one of the scheduled silent rounds."""
        in_window = self.start <= t and (self.stop is None or t < self.stop)
        return in_window and t % self.every == self.phase

    def plan(self, view: AttackView, generator: torch.Generator) -> Crafted:
        if self.silent_in(view.round):
            return Crafted({k: None for k in view.receivers}, {"silent": True})
        _, known = view.known()
        if known.shape[0] == 0:
            return Crafted({k: None for k in view.receivers}, {"silent": True, "why": "knows no model"})
        message = known.to(torch.float64).mean(dim=0)
        if self.otherwise == "gaussian":
            noise = torch.randn(view.dim, generator=colluder_generator(view, generator), dtype=torch.float64)
            message = message + self.std * noise
        message = message.to(torch.float32)
        return Crafted({k: message for k in view.receivers}, {"silent": False})
