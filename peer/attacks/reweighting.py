"""Attacks that know DFedReweighting: they predict a receiver's TPM scores and CRS weights.

A receiver ``k`` scores every candidate (its own model, each neighbour's message) with the TPM
on its auxiliary data and weighs the scores with the CRS. An attacker that knows the rule
(``defence``) and holds a sample of the training set (``attacker_data``) plays the receiver: it
builds the candidate set it expects ``k`` to see, scores and weighs it the same way on its own
sample, and keeps the most harmful message still predicted to get weight. Against a rule without
a TPM and a CRS (multi-Krum, BALANCE, ClippedGossip, ...) it plays the whole rule instead, its
sample standing for the receiver's data.

The weakness they aim at: :class:`~dfedrw.peer.aggregation.crs.LossClippedAtMean` clips against
the *mean* loss of the candidates, and under the paper's weighting (``v_i = m_i / sum_kept m_j``)
a kept candidate weighs *more* the higher its loss: a model whose loss sits just under the mean
takes the largest share, and one huge loss (a decoy) raises the mean every other is compared to.

Each searches along ``message(lam) = centre + lam * d`` (``d`` of :func:`harmful_direction`) for
the largest ``lam`` in ``[0, lam_max]`` still predicted kept (:func:`bisect_kept`), then steps
back by ``margin``, since the receiver's own data, not the attacker's sample, decides the clip.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import torch

from dfedrw.peer.checked import Checked
from dfedrw.peer.registry import check_choice, check_int, check_real
from dfedrw.peer.aggregation.rules import RoundInputs
from dfedrw.peer.attacks.base import ATTACK_REGISTRY, AttackView, Crafted, ThreatModel
from dfedrw.peer.attacks.moments import column_std

__all__ = ["DIRECTIONS", "ColludingTwins", "DecoyStealth", "TPMAware", "bisect_kept", "harmful_direction"]

DIRECTIONS = ("reverse", "alie", "away")

_DATA = "`samples` rows of the training set drawn by its own seed (setting samples)"
_SHARED_DATA = "`samples` rows of the training set, one sample the colluders share (setting samples)"


def harmful_direction(direction: str, centre: torch.Tensor, known: torch.Tensor, reference: torch.Tensor | None) -> torch.Tensor:
    """The direction ``d`` (float64 [D]) a message moves along from ``centre``.

    * ``"reverse"``: ``d = -centre`` (``lam = 2`` is the sign-flipped centre);
    * ``"alie"``: ``d = -std(known)`` per coordinate (population std; 0 with one model);
    * ``"away"``: ``d = reference - mean(known)``, undoing the round's progress (``lam = 1``
      goes back to last round's mean); ``"reverse"`` when there is no reference yet.

    Example: ``harmful_direction("reverse", torch.tensor([1.0, -2.0]), known, None)``: ``[-1, 2]``.
    """
    check_choice("harmful_direction", "direction", direction, DIRECTIONS)
    centre = centre.to(torch.float64)
    if direction == "alie":
        return -column_std(known.to(torch.float64), correction=0)
    if direction == "away" and reference is not None:
        return reference.to(device=centre.device, dtype=torch.float64) - known.to(torch.float64).mean(dim=0)
    return -centre


def bisect_kept(kept: Callable[[float], bool], lam_max: float, steps: int) -> float:
    """The largest ``lam`` in ``[0, lam_max]`` for which ``kept(lam)``, by bisection.

    Assumes the kept ``lam`` form one interval (a loss convex along the line keeps
    ``{lam : L(lam) <= threshold}``): ``lam_max`` when ``kept(lam_max)``; otherwise from a kept
    ``lo`` (0, or when 0 is clipped the first kept point of the grid ``lam_max * i / steps``;
    none kept: 0) and ``hi = lam_max``, ``steps`` halvings of ``[lo, hi]`` keeping ``kept(lo)``
    and not ``kept(hi)``; returns ``lo``, within ``lam_max / 2**steps`` below the boundary.

    Example: ``bisect_kept(lambda lam: lam <= 0.3, 1.0, 3)``: 0.5 no, 0.25 yes, 0.375 no -> 0.25.
    """
    if kept(lam_max):
        return lam_max
    lo, hi = 0.0, lam_max
    if not kept(0.0):
        # The receiver may clip the centre itself (a tailored centre with a high loss, say)
        # while keeping a point further along.
        lo = next((lam_max * i / steps for i in range(1, steps) if kept(lam_max * i / steps)), None)
        if lo is None:
            return 0.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        if kept(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _defence_parts(owner: str, defence: Any) -> tuple[Callable, Callable] | None:
    """The defence's TPM and CRS when it scores candidates with them (DFedReweighting), None
    for any other rule (then the whole rule is played, see :meth:`_Tuned._predict`)."""
    tpm, crs = getattr(defence, "tpm", None), getattr(defence, "crs", None)
    # A rule with a stage before its TPM and CRS (``scores_decide`` false) is played whole.
    if callable(tpm) and callable(crs) and getattr(defence, "scores_decide", True):
        return tpm, crs
    if not callable(defence):
        raise ValueError(
            f"{owner}: defence must be an aggregation rule (RoundInputs -> Aggregate) or carry a TPM and a CRS, got {defence!r}"
        )
    return None


def _finite_known(view: AttackView) -> tuple[tuple[int, ...], torch.Tensor]:
    # A receiver never scores a non-finite row (DFedReweighting gives it NaN and weight 0), so
    # it would not be in the candidate set the CRS weighs: leave it out of the prediction too.
    senders, known = view.known()
    ok = torch.isfinite(known).all(dim=1).tolist()
    return tuple(s for s, good in zip(senders, ok) if good), known[[i for i, good in enumerate(ok) if good]]


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class _Prediction:
    lam: float
    weight: float
    score: float
    scores: list[float]


@dataclass(frozen=True)
class _Tuned(Checked):
    """What the attacks share: the defence, the sample, the search along ``centre + lam * d``."""

    defence: Any = None
    attacker_data: Any = None
    direction: str = "reverse"
    lam_max: float = 10.0
    steps: int = 30
    margin: float = 0.05
    samples: int = 200

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        owner = cls.__name__
        check_choice(owner, "direction", s.direction, DIRECTIONS)
        s.lam_max = check_real(owner, "lam_max", s.lam_max, positive=True)
        s.steps = check_int(owner, "steps", s.steps, minimum=1)
        margin = check_real(owner, "margin", s.margin, nonnegative=True)
        if not margin < 1:
            raise ValueError(f"{owner}: margin must be in [0, 1), got {s.margin!r}")
        s.margin = margin
        s.samples = check_int(owner, "samples", s.samples, minimum=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        # Supplied, checked once built; None: not supplied yet (a class built by hand or listed), refused when it plans.
        if self.defence is not None:
            _defence_parts(owner, self.defence)
        if self.attacker_data is not None and not callable(getattr(self.attacker_data, "evaluate", None)):
            raise ValueError(f"{owner}: attacker_data must offer evaluate(n) (an AttackerData), got {self.attacker_data!r}")

    def _check_supplied(self) -> None:
        owner = type(self).__name__
        _defence_parts(owner, self.defence)
        if self.attacker_data is None:
            raise ValueError(f"{owner}: no attacker_data: the running system supplies the attacker's sample; give one when building it by hand")

    def _predict(self, fixed: torch.Tensor, message: torch.Tensor, evaluate: Callable, copies: int = 1) -> tuple[float, list[float]]:
        """(weight of ``message``, every candidate's score) when a receiver weighs ``fixed``
        (float32 [m, D]) and ``copies`` copies of ``message`` (float64 [D], sent as float32:
        scored as sent; the weight is the last copy's)."""
        sent = message.to(torch.float32)
        if not bool(torch.isfinite(sent).all()):
            return 0.0, [math.nan] * (len(fixed) + copies)
        parts = _defence_parts(type(self).__name__, self.defence)
        candidates = torch.cat([fixed, sent[None].expand(copies, -1)])
        if parts is None:
            # Played whole, as a receiver whose own model is the first known one and whose data
            # is the attacker's sample; the round is unknown (a radius decaying in t/T sees t = 0).
            count = len(candidates)
            agg = self.defence(
                RoundInputs(own_id=0, round=0, ids=tuple(range(count)), vectors=candidates, num_samples=(1,) * count, evaluate=evaluate)
            )
            scores = [math.nan] * count if agg.scores is None else [float(agg.scores[i]) for i in range(count)]
            return float(agg.weights[count - 1]), scores
        tpm, crs = parts
        scores = torch.as_tensor(tpm(candidates, evaluate)).detach().to("cpu", torch.float64)
        weights = torch.as_tensor(crs(scores)).detach().to("cpu", torch.float64)
        return float(weights[-1]), scores.tolist()

    def _tune(self, fixed: torch.Tensor, centre: torch.Tensor, d: torch.Tensor, copies: int = 1) -> _Prediction:
        """The largest ``lam`` predicted kept beside ``fixed`` (with ``copies`` copies of the
        message), times ``1 - margin``."""
        evaluate = self.attacker_data.evaluate(self.samples)
        fixed = fixed.to(torch.float32)

        def kept(lam: float) -> bool:
            return self._predict(fixed, centre + lam * d, evaluate, copies)[0] > 0

        lam = bisect_kept(kept, self.lam_max, self.steps) * (1 - self.margin)
        weight, scores = self._predict(fixed, centre + lam * d, evaluate, copies)
        return _Prediction(lam, weight, scores[-1], scores)

    def _colluders(self, view: AttackView) -> tuple[tuple[int, ...], Crafted | None]:
        """The colluders, sorted, and with fewer than two the single-attacker plan to send
        instead (role "alone"): what every colluding attack does first."""
        self._check_supplied()
        colluders = tuple(sorted(view.colluders))
        if len(colluders) >= 2:
            return colluders, None
        messages, note = self._alone(view, tailored=False)
        return colluders, Crafted(messages, {"role": "alone", **note})

    def _alone(self, view: AttackView, tailored: bool) -> tuple[dict[int, torch.Tensor | None], dict[str, Any]]:
        """A lone attacker's plan: each receiver predicted to weigh the known models and it."""
        self._check_supplied()
        senders, known = _finite_known(view)
        if len(known) == 0:
            return dict.fromkeys(view.receivers), {"known": 0}
        known64 = known.to(torch.float64)
        mean = known64.mean(dim=0)
        if not tailored:
            d = harmful_direction(self.direction, mean, known, view.reference)
            best = self._tune(known, mean, d)
            message = (mean + best.lam * d).to(torch.float32)
            note = {"known": len(known), "lam": best.lam, "predicted_weight": best.weight, "predicted_score": _number(best.score)}
            return dict.fromkeys(view.receivers, message), note
        messages, per_receiver = {}, {}
        row = {s: i for i, s in enumerate(senders)}
        for k in view.receivers:
            centre = known64[row[k]] if k in row else mean
            d = harmful_direction(self.direction, centre, known, view.reference)
            best = self._tune(known, centre, d)
            messages[k] = (centre + best.lam * d).to(torch.float32)
            per_receiver[str(k)] = {
                "centre": "own" if k in row else "mean", "lam": best.lam,
                "predicted_weight": best.weight, "predicted_score": _number(best.score),
            }
        return messages, {"known": len(known), "per_receiver": per_receiver}


@ATTACK_REGISTRY.register("tpm_aware")
@dataclass(frozen=True)
class TPMAware(_Tuned):
    """TPM-aware attack: the most harmful model a DFedReweighting receiver is predicted to keep.

    Each round, with ``mu`` the mean of the honest models it knows ``W`` and ``d`` the harmful
    direction (:func:`harmful_direction`: ``-mu``, ``-std(W)``, or ``reference - mu``)::

        m(lam) = mu + lam * d
        v(lam) = CRS(TPM([W; m(lam)], A))[-1]       # A: its own sample, as a receiver's aux set
        lam*   = max {lam in [0, lam_max] : v(lam) > 0}   (bisection, ``steps`` halvings)
        send m(lam* * (1 - margin)) to every receiver

    Under the paper's loss clipping the weight grows with the loss up to the clip (see the
    module), so ``lam*`` is both the most harmful kept model and the one of largest weight; under
    inverse-loss weighting only the former. With ``tailored = true`` a receiver whose own
    model it knows gets ``w_k + lam_k * d_k``, ``lam_k`` predicted on that centre (``d_k = -w_k``
    for "reverse"). The note keeps ``lam``, the predicted weight and score. Nothing known:
    silent. No ``lam`` predicted kept (:func:`bisect_kept` tries 0 and a grid): it sends the
    centre (``lam = 0``) and notes the weight predicted for it.

    Source: the search for the largest scale of a fixed perturbation the known rule still accepts
    follows Shejwalkar and Houmansadr, "Manipulating the Byzantine: Optimizing Model Poisoning
    Attacks and Defenses for Federated Learning", NDSS 2021 (their AGR-tailored attack, with the
    inverse-unit, inverse-std and inverse-sign perturbations), and the full-knowledge setting of
    Fang, Cao, Jia and Gong, "Local Model Poisoning Attacks to Byzantine-Robust Federated Learning",
    USENIX Security 2020; the rule predicted is Zhang, Yin, Yang and Xu, "DFedReweighting: A Unified
    Framework for Objective-Oriented Reweighting in Decentralized Federated Learning", eq.
    (combination-loss).

    THREAT MODEL: the models its honest neighbours sent it this round (the pool when colluding),
    the defence (its TPM and CRS, or the whole rule) with its settings, and ``samples`` rows of
    the training set drawn by its own seed, on which it plays the receiver, whose auxiliary set
    and own model (unless sent) it does not know: hence ``margin``. Deterministic.

    Example: ``TPMAware(defence=build_rule("dfedreweighting", "loss", "loss_clip_mean"),
    attacker_data=data, direction="alie")``.
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel(data=_DATA, defence=True, tailored=True)
    tailored: bool = False

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        super().check_settings(s)
        if not isinstance(s.tailored, bool):
            raise ValueError(f"TPMAware: tailored must be true or false, got {s.tailored!r}")

    def plan(self, view: AttackView, generator: torch.Generator) -> Crafted:
        messages, note = self._alone(view, self.tailored)
        return Crafted(messages, {"direction": self.direction, **note})


@ATTACK_REGISTRY.register("decoy_stealth")
@dataclass(frozen=True)
class DecoyStealth(_Tuned):
    """Colluding decoy + stealth: one colluder's huge loss lifts the clip; the others slip under.

    Every round the colluders ``B`` (sorted) agree one plan from the pool ``W`` of honest models
    they received (``mu`` its mean), the same in each of them::

        decoy  = B[round % |B|]   (rotate = true)  or  B[0]
        m_dec  = -decoy_scale * mu                          # the sign-flipped mean, scaled
        m(lam) = mu + lam * d                               # d: harmful_direction
        lam*   = max {lam : CRS(TPM([W; m_dec; m(lam)], A))[-1] > 0} * (1 - margin)
        decoy sends m_dec, every other colluder (stealth) sends m(lam*)

    Under ``LossClippedAtMean`` the decoy is clipped but drags the mean loss up, so the stealth
    model is kept with a loss far above every honest one and, weighted in proportion to the loss,
    takes most of the weight. ``send_decoy = false`` is the control: the decoy stays silent while
    the stealth model is still tuned to the threshold it would have raised; a receiver clips it.

    The note of each colluder: ``role`` ("decoy" | "stealth"), ``decoy`` (its id), ``lam``,
    ``predicted_weight`` and ``predicted_score`` of the stealth model, ``decoy_score``, and
    ``plan``, a digest of (round, pool senders, decoy, lam): equal digests show the colluders
    agreed (no randomness, one shared sample). With one colluder (or ``attack.colluding`` unset)
    it acts as :class:`TPMAware` (role "alone"); with nothing known it is silent.

    Source: the attack on the mean threshold is this project's, against the DFedReweighting paper's
    eq. (combination-loss); the kept-scale search follows Shejwalkar and Houmansadr, NDSS 2021
    (both cited in :class:`TPMAware`); the decoy is the paper's sign-flipping attack (local model
    weights x -10) scaled by 100 by default: the larger its loss, the higher the mean it lifts
    (``decoy_scale = 10`` is the paper's).

    THREAT MODEL: colluders that pool every honest model any of them received this round, know the
    defence (its TPM and CRS, or the whole rule) with its settings, and share a sample of
    ``samples`` training rows (drawn by the colluders' seed, so each computes the same plan); a
    receiver's candidates are predicted as the pool, the decoy and the stealth model (its own data
    and model are unknown, hence ``margin``). A colluder's receivers all get the same message.
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel(
        models="pooled", data=_SHARED_DATA, defence=True, colludes=True
    )
    decoy_scale: float = 100.0
    rotate: bool = True
    send_decoy: bool = True

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        super().check_settings(s)
        s.decoy_scale = check_real("DecoyStealth", "decoy_scale", s.decoy_scale, positive=True)
        for name in ("rotate", "send_decoy"):
            if not isinstance(getattr(s, name), bool):
                raise ValueError(f"DecoyStealth: {name} must be true or false, got {getattr(s, name)!r}")

    def plan(self, view: AttackView, generator: torch.Generator) -> Crafted:
        colluders, alone = self._colluders(view)
        if alone is not None:
            return alone
        decoy = colluders[view.round % len(colluders)] if self.rotate else colluders[0]
        role = "decoy" if view.attacker == decoy else "stealth"
        senders, known = _finite_known(view)
        if len(known) == 0:
            return Crafted(dict.fromkeys(view.receivers), {"role": role, "decoy": decoy, "known": 0})
        mean = known.to(torch.float64).mean(dim=0)
        decoy_model = -self.decoy_scale * mean
        d = harmful_direction(self.direction, mean, known, view.reference)
        # Predicted with the decoy in the candidate set whether or not it is sent: the control
        # (send_decoy = false) shows what the same stealth model meets without it.
        best = self._tune(torch.cat([known.to(torch.float32), decoy_model.to(torch.float32)[None]]), mean, d)
        digest = hashlib.sha256(
            json.dumps({"round": view.round, "pool": list(senders), "decoy": decoy, "lam": best.lam.hex()}).encode()
        ).hexdigest()[:16]
        if role == "decoy":
            message = decoy_model.to(torch.float32) if self.send_decoy else None
        else:
            message = (mean + best.lam * d).to(torch.float32)
        note = {
            "role": role, "decoy": decoy, "lam": best.lam, "predicted_weight": best.weight,
            "predicted_score": _number(best.score), "decoy_score": _number(best.scores[-2]), "plan": digest,
            "sent_decoy": self.send_decoy, "known": len(known),
        }
        return Crafted(dict.fromkeys(view.receivers, message), note)


@ATTACK_REGISTRY.register("colluding_twins")
@dataclass(frozen=True)
class ColludingTwins(_Tuned):
    """Colluding twins: every colluder sends one model, tuned with its copies in the candidates.

    Every round the colluders ``B`` agree one plan from the pool ``W`` of honest models they
    received (``mu`` its mean, ``d`` the harmful direction of :func:`harmful_direction`)::

        m(lam) = mu + lam * d
        lam*   = max {lam : RULE([W; m(lam) x |B|])[-1] > 0} * (1 - margin)
        every colluder sends m(lam*)

    ``RULE`` is the defence played whole (or its TPM and CRS), the first pooled model standing
    for the receiver's own, the shared sample for its data. Aimed at a distance stage
    (:class:`~dfedrw.peer.aggregation.screened.ScreenedReweighting`, multi-Krum): Krum's score sums
    a candidate's distances to its nearest others, and ``|B|`` equal copies are each other's
    nearest at distance 0, so each counts ``|B| - 1`` honest distances fewer and they go further
    before the screen drops them (optimistic where a receiver sees one copy: hence ``margin``).

    The note of each colluder: ``role`` ("twin"), ``copies``, ``lam``, ``predicted_weight``,
    ``predicted_score`` and ``plan``, a digest of (round, pool senders, lam) as
    :class:`DecoyStealth`'s. No randomness. With one colluder (or ``attack.colluding`` unset) it
    acts as :class:`TPMAware` (role "alone"); with nothing known it is silent.

    Source: this project's, against the Krum screen; the copies that lower each other's Krum
    scores are the "omniscient" colluders of Blanchard et al., NeurIPS 2017 and El Mhamdi,
    Guerraoui and Rouault, ICML 2018, and the kept-scale search is Shejwalkar and
    Houmansadr's, NDSS 2021 (see :class:`TPMAware`).

    THREAT MODEL: as :class:`DecoyStealth`'s (the pool, the defence with its settings, one shared
    sample). Every receiver of a colluder gets the same message.

    Example: ``ColludingTwins(defence=build_rule("multi_krum", rule_params={"num_byzantine": 2}),
    attacker_data=data, direction="alie")``.
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel(
        models="pooled", data=_SHARED_DATA, defence=True, colludes=True
    )

    def plan(self, view: AttackView, generator: torch.Generator) -> Crafted:
        colluders, alone = self._colluders(view)
        if alone is not None:
            return alone
        senders, known = _finite_known(view)
        if len(known) == 0:
            return Crafted(dict.fromkeys(view.receivers), {"role": "twin", "known": 0})
        mean = known.to(torch.float64).mean(dim=0)
        d = harmful_direction(self.direction, mean, known, view.reference)
        best = self._tune(known, mean, d, copies=len(colluders))
        digest = hashlib.sha256(json.dumps({"round": view.round, "pool": list(senders), "lam": best.lam.hex()}).encode()).hexdigest()[:16]
        note = {
            "role": "twin", "copies": len(colluders), "lam": best.lam, "predicted_weight": best.weight,
            "predicted_score": _number(best.score), "plan": digest, "known": len(known),
        }
        return Crafted(dict.fromkeys(view.receivers, (mean + best.lam * d).to(torch.float32)), note)
