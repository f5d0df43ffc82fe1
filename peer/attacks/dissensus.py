"""The dissensus attack on gossip: push each receiver away from its neighbours instead of
towards one bad point, so that the honest clients stop agreeing.

Pure tensor code (no transport); maths in float64, messages float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

import torch

from dfedrw.peer.checked import Checked
from dfedrw.peer.registry import check_choice, check_real
from dfedrw.peer.attacks.base import ATTACK_REGISTRY, AttackView, Crafted, ThreatModel

__all__ = ["Dissensus"]

_SCALES = ("neighbour_counts", "none")


@ATTACK_REGISTRY.register("dissensus")
@dataclass(frozen=True)
class Dissensus(Checked):
    """Dissensus: to each receiver, its own model pushed away from the other honest models.

    For receiver ``k`` with model ``x_k`` (the model ``k`` sent the attacker this round)::

        message_k = x_k + epsilon * r_k * (x_k - mean_{j in O_k} x_j)

    ``O_k``: every other honest model the attacker knows (:meth:`AttackView.known` without
    ``k``), its stand-in for ``k``'s honest neighbours, whom it cannot see. ``r_k`` by ``scale``:
    ``"neighbour_counts"`` (default): ``|O_k| / |C|``, ``C`` the colluders (itself when alone),
    its estimate of (``k``'s honest neighbours) / (``k``'s Byzantine neighbours); ``"none"``: 1.
    Attackers acting alone each count only themselves, so a receiver next to two of them is
    pushed twice as hard as the formula below says; colluders divide it.

    Why: He, Karimireddy and Jaggi's attacker sends good worker ``i`` the value
    ``x_i - epsilon * sum_{k in H_i} W_ik (x_k - x_i) / sum_{b in B_i} W_ib`` (``H_i``/``B_i``:
    ``i``'s honest/Byzantine neighbours, ``W`` the gossip weights), so that ``i``'s gossip step
    becomes ``x_i + (1 - epsilon) sum_{k in H_i} W_ik (x_k - x_i)``: ``epsilon = 1`` cancels the
    pull towards the neighbours, ``epsilon > 1`` reverses it. With ``W`` uniform over ``i``'s
    candidates that is ``x_i + epsilon * |H_i| / |B_i| * (x_i - mean_{H_i} x_k)``, the formula
    above with exact estimates; with ``scale="none"`` ``epsilon`` carries ``|H_k| / |B_k|``.

    Fallbacks: silent (None) to a receiver whose model it did not get (it cannot tailor the
    push); ``x_k`` itself when it knows no other honest model. The note lists those ``pushed``.

    Sources: He, Karimireddy and Jaggi, "Byzantine-robust Decentralized Learning via
    ClippedGossip", 2022 (the dissensus attack; ``epsilon = 1.5`` in their experiments); Gaucher,
    Dieuleveut and Hendrikx, "Unified Breakdown Analysis for Byzantine Robust Gossip", ICML 2025.

    THREAT MODEL: the models its neighbours sent it this round (the pool when colluding), so each
    receiver's own; not the receiver's neighbourhood or gossip weights (estimated as above), nor the
    defence. Tailored, deterministic; the paper's attacker knows the whole graph and every model.
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel(tailored=True)
    epsilon: float = 1.5
    scale: str = "neighbour_counts"

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        s.epsilon = check_real("Dissensus", "epsilon", s.epsilon, positive=True)
        check_choice("Dissensus", "scale", s.scale, _SCALES)

    def plan(self, view: AttackView, generator: torch.Generator) -> Crafted:
        senders, known = view.known()
        models = known.to(torch.float64)
        row = {sender: i for i, sender in enumerate(senders)}
        count = len(senders)
        total = models.sum(dim=0)
        byzantine = max(len(view.colluders), 1)
        messages: dict[int, torch.Tensor | None] = {}
        for k in view.receivers:
            if k not in row:
                messages[k] = None
                continue
            own = models[row[k]]
            if count == 1:
                messages[k] = own.to(torch.float32)
                continue
            others = (total - own) / (count - 1)
            ratio = (count - 1) / byzantine if self.scale == "neighbour_counts" else 1.0
            messages[k] = (own + self.epsilon * ratio * (own - others)).to(torch.float32)
        pushed = sorted(k for k in view.receivers if k in row and count > 1)
        note = {"epsilon": self.epsilon, "scale": self.scale, "pushed": pushed}
        return Crafted(messages, note)
