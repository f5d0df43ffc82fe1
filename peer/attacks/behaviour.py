"""Behavioural attacks: what a faulty or sly client does with its messages rather than with
their values, such as going silent in some rounds.

Pure tensor code (no transport); maths in float64, messages float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

import torch

from dfedrw.peer.checked import Checked
from dfedrw.peer.registry import check_choice, check_int, check_real
from dfedrw.peer.attacks.base import ATTACK_REGISTRY, AttackView, Crafted, ThreatModel
from dfedrw.peer.attacks.optimized import colluder_generator

__all__ = ["Flood", "Omission"]

_OTHERWISE = ("mean", "gaussian")


@ATTACK_REGISTRY.register("omission")
@dataclass(frozen=True)
class Omission(Checked):
    """Omission: silent to every receiver in chosen rounds, a benign-looking model otherwise.

    Round ``t`` is silent when ``start <= t`` (and ``t < stop`` when ``stop`` is set) and
    ``t % every == phase``, or when it knows no model (nothing to imitate). Otherwise every
    receiver gets, by ``otherwise``, ``"mean"``: ``mean(B)``; ``"gaussian"``: ``mean(B) + std *
    z``, ``z ~ N(0, I_D)`` drawn once per round; ``B`` = :meth:`AttackView.known`. The note
    records ``silent`` (and, when silent without being scheduled, why).

    Defaults (``every = 2``, ``phase = 0``): silent in even rounds, the mean in odd ones, which a
    deadline-based round protocol must ride out without stalling; ``every = 3, phase = 1``: silent
    in rounds 1, 4, 7, ...; ``every = 1``: a crash between ``start`` and ``stop``.

    Source: the omission failure (a process that fails to send some of its messages), the
    mildest fault in the hierarchy below Byzantine behaviour: Perry and Toueg, "Distributed
    Agreement in the Presence of Processor and Communication Faults", IEEE Transactions on
    Software Engineering, 1986. Not from the DFedReweighting paper.

    THREAT MODEL: knows the models its neighbours sent it this round (the pool when
    colluding) and the round number; does not know the defence; the same message to every
    receiver. Colluding, each colluder draws its own noise (:func:`colluder_generator`).
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel()
    every: int = 2
    phase: int = 0
    start: int = 0
    stop: int | None = None
    otherwise: str = "mean"
    std: float = 0.01

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        every = check_int("Omission", "every", s.every, minimum=1)
        phase = check_int("Omission", "phase", s.phase, minimum=0)
        if phase >= every:
            raise ValueError(f"Omission: phase must be < every ({every}), got {s.phase!r}")
        start = check_int("Omission", "start", s.start, minimum=0)
        if s.stop is not None:
            stop = check_int("Omission", "stop", s.stop, minimum=0)
            if stop <= start:
                raise ValueError(f"Omission: stop must be > start ({start}) or None, got {s.stop!r}")
            s.stop = stop
        check_choice("Omission", "otherwise", s.otherwise, _OTHERWISE)
        s.std = check_real("Omission", "std", s.std, positive=True)
        s.every = every
        s.phase = phase
        s.start = start

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


_FLOODS = ("stale", "future", "both")


@ATTACK_REGISTRY.register("flood")
@dataclass(frozen=True)
class Flood(Checked):
    """Round flooding: besides a benign-looking model, messages labelled with rounds a receiver
    must not use.

    Each round ``t`` every receiver gets ``mean(B)`` (``B`` = :meth:`AttackView.known`) for round
    ``t`` and, by ``kind``, ``copies`` more copies of it labelled

    * ``"stale"``: ``t - lag``, a round every receiver has passed (skipped while ``t < lag``);
    * ``"future"``: ``t + round_window + 2 + lead``, beyond the rounds any receiver buffers (it
      is in round ``t`` or ``t + 1`` when it gets them, and keeps ``round_window`` ahead);
    * ``"both"``: ``copies`` of each (one copy, ``round_window = 2``: ``((t - 1, m), (t + 4, m))``).

    A receiver's intake drops the stale ones (counted as stale) and refuses the future ones
    (``future_round``): neither is ever aggregated. The attack makes these bounds reproducible:
    with ``copies`` within a sender's per-round allowance (``round_window + 2`` messages, the
    real one included) every copy reaches the intake; past it the gRPC server refuses the excess
    as ``rate_limited`` and shuts the sender out for a while, which depends on timing. Silent
    when it knows no model. The note records how many copies of each kind it sent.

    Source: the replay and flooding behaviour a deadline-based round protocol must bound
    (DESIGN: "messages for future rounds are buffered, stale ones dropped"); the intake that
    bounds it is :class:`~dfedrw.peer.transport.inbox.Inbox` with the gRPC server's call limits.

    THREAT MODEL: the models its honest neighbours sent it this round (the pool when colluding) and
    the receivers' round window; no data; not the defence; the same messages to every receiver.
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel()
    kind: str = "both"
    copies: int = 1
    lag: int = 1
    lead: int = 0
    round_window: int = 2

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        check_choice("Flood", "kind", s.kind, _FLOODS)
        check_int("Flood", "copies", s.copies, minimum=1)
        check_int("Flood", "lag", s.lag, minimum=1)
        check_int("Flood", "lead", s.lead, minimum=0)
        check_int("Flood", "round_window", s.round_window, minimum=1)

    def labels(self, t: int) -> list[int]:
        """The round labels of round ``t``'s extra copies, stale ones first."""
        stale = [t - self.lag] * self.copies if self.kind in ("stale", "both") and t >= self.lag else []
        future = [t + self.round_window + 2 + self.lead] * self.copies if self.kind in ("future", "both") else []
        return stale + future

    def plan(self, view: AttackView, generator: torch.Generator) -> Crafted:
        _, known = view.known()
        if known.shape[0] == 0:
            return Crafted(dict.fromkeys(view.receivers), {"stale": 0, "future": 0, "why": "knows no model"})
        message = known.to(torch.float64).mean(dim=0).to(torch.float32)
        labels = self.labels(view.round)
        extra = {k: tuple((r, message) for r in labels) for k in view.receivers}
        stale = sum(1 for r in labels if r < view.round)
        return Crafted(dict.fromkeys(view.receivers, message), {"stale": stale, "future": len(labels) - stale}, extra)
