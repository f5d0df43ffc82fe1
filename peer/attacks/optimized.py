"""Optimised model poisoning: messages pushed as far from the benign models as a robust rule allows.

* :class:`MinMax` and :class:`MinSum` (Shejwalkar and Houmansadr, NDSS 2021): the benign mean
  moved along a chosen perturbation by the largest step that keeps the message no farther from
  the benign models than they are from each other (AGR-agnostic attacks).
* :class:`FangTrimmedMean` and :class:`FangMedian` (Fang, Cao, Jia and Gong, USENIX Security
  2020): per coordinate, values just beyond the benign extreme, against the benign models' move.

All are per-round attacks (``plan`` on an :class:`~dfedrw.peer.attacks.base.AttackView`) whose
benign set ``B`` is :meth:`AttackView.known` (the colluders' pool with ``attack.colluding``). The
papers work on gradients (updates); a model-space attacker reads "update" as the models' move
from ``view.reference`` (the mean of what it knew last round), the nearest benign update it can
observe. Pure tensor code (no transport); maths in float64, messages float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

import torch

from dfedrw.peer.checked import Checked
from dfedrw.peer.registry import check_choice, check_real
from dfedrw.peer.attacks.base import ATTACK_REGISTRY, AttackView, Crafted, ThreatModel
from dfedrw.peer.attacks.moments import column_std

__all__ = [
    "FangMedian",
    "FangTrimmedMean",
    "MinMax",
    "MinSum",
    "colluder_generator",
    "search_gamma",
]


def colluder_generator(view: AttackView, generator: torch.Generator) -> torch.Generator:
    """The generator for draws that must be this attacker's own.

    Alone, ``generator`` itself. Colluding, every colluder gets the same round generator (so they
    can agree a plan); its own draws come from a child seeded by the ``i``-th of
    ``len(colluders)`` seeds drawn from it, ``i`` its place among the sorted colluders. Each
    colluder draws the same seeds, so any of them can compute the group's plan."""
    if not view.colluders:
        return generator
    colluders = sorted(view.colluders)
    seeds = torch.randint(0, 2**62, (len(colluders),), generator=generator, dtype=torch.int64)
    return torch.Generator().manual_seed(int(seeds[colluders.index(view.attacker)]))


def _direction(view: AttackView, mean: torch.Tensor, relative_to: str) -> tuple[torch.Tensor, str]:
    """The benign "update" the attacks oppose, and what it was measured from."""
    if relative_to == "reference" and view.reference is not None:
        return mean - view.reference.to(torch.float64).reshape(-1), "reference"
    return mean, "zero"


# At most this many halvings: the search's step shrinks by 2 each time, so a tolerance the
# floating-point step can never reach must not loop forever (50 / 2^200 is far below any tau).
_MAX_HALVINGS = 200


def search_gamma(fits, gamma_init: float, tau: float) -> float:
    """The largest scale ``gamma`` that ``fits(gamma)`` accepts, by the search of
    Shejwalkar and Houmansadr (NDSS 2021, Algorithm 1).

    From ``gamma = step = gamma_init``: on success keep ``gamma`` as the best so far and move up
    by ``step / 2``, else down by ``step / 2``; halve ``step``; stop when the last success and
    ``gamma`` are within ``tau``. The search covers ``(0, 2 * gamma_init)``; 0 if nothing fits.

    Example: ``search_gamma(lambda g: g <= 1.0, 50.0, 1e-5)`` is within 1e-5 below 1.0.
    """
    gamma, step, success = gamma_init, gamma_init, 0.0
    for _ in range(_MAX_HALVINGS):
        if abs(success - gamma) <= tau:
            break
        if fits(gamma):
            success = gamma
            gamma += step / 2
        else:
            gamma -= step / 2
        step /= 2
    return success


_PERTURBATIONS = ("unit_vector", "std", "sign")
_RELATIVE_TO = ("reference", "zero")
_MIN_SUM_BOUNDS = ("max", "min")


@dataclass(frozen=True)
class _Optimised(Checked):
    """The shared settings and search of :class:`MinMax` and :class:`MinSum`."""

    threat_model: ClassVar[ThreatModel] = ThreatModel()
    perturbation: str = "std"
    relative_to: str = "reference"
    gamma_init: float = 50.0
    tau: float = 1e-5

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        owner = cls.__name__
        check_choice(owner, "perturbation", s.perturbation, _PERTURBATIONS)
        check_choice(owner, "relative_to", s.relative_to, _RELATIVE_TO)
        s.gamma_init = check_real(owner, "gamma_init", s.gamma_init, positive=True)
        s.tau = check_real(owner, "tau", s.tau, positive=True)

    def _perturbation(self, benign: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        if self.perturbation == "unit_vector":
            norm = torch.linalg.vector_norm(update)
            return -update / norm if norm > 0 else torch.zeros_like(update)
        if self.perturbation == "sign":
            return -torch.sign(update)
        # Sample std (correction 1), as the authors' code has it; one model has no spread.
        if benign.shape[0] < 2:
            return torch.zeros_like(update)
        return -column_std(benign, correction=1)

    def plan(self, view: AttackView, generator: torch.Generator) -> Crafted:
        _, known = view.known()
        if known.shape[0] == 0:
            return Crafted({k: None for k in view.receivers}, {"silent": True})
        benign = known.to(torch.float64)
        mean = benign.mean(dim=0)
        update, measured_from = _direction(view, mean, self.relative_to)
        p = self._perturbation(benign, update)
        if torch.linalg.vector_norm(p) > 0:
            # ||mean + g p - b_i||^2 = ||d_i||^2 + 2 g <d_i, p> + g^2 ||p||^2 with d_i = mean - b_i:
            # three numbers per benign model, so each step of the search is O(n), not O(n D).
            offsets = mean - benign
            pairwise = torch.cdist(benign, benign).pow(2)
            fits = self._fits(offsets, p, pairwise)
            gamma = search_gamma(fits, self.gamma_init, self.tau)
        else:
            gamma = 0.0
        message = (mean + gamma * p).to(torch.float32)
        note = {"gamma": gamma, "perturbation": self.perturbation, "relative_to": measured_from}
        return Crafted({k: message for k in view.receivers}, note)


def _squared_distances(offsets: torch.Tensor, p: torch.Tensor):
    """gamma -> ||offsets_i + gamma p||^2 for every row i."""
    square = offsets.pow(2).sum(dim=1)
    cross = 2.0 * (offsets @ p)
    norm = float(p.pow(2).sum())
    return lambda gamma: square + gamma * cross + gamma * gamma * norm


@ATTACK_REGISTRY.register("min_max")
@dataclass(frozen=True)
class MinMax(_Optimised):
    """Min-Max: the benign mean moved along ``p`` as far as the benign models' own spread allows.

    ``message = mean(B) + gamma * p`` with ``gamma`` the largest (:func:`search_gamma` from
    ``gamma_init`` to tolerance ``tau``) such that ``max_i ||message - b_i|| <= max_{i,j}
    ||b_i - b_j||``: no farther from any benign model than the two most distant benign ones are
    from each other. ``p`` by ``perturbation``, from the benign update ``u = mean(B) - reference``
    (``relative_to="reference"``; ``u = mean(B)`` with ``relative_to="zero"`` or in the first
    round, with no reference): ``"unit_vector"``: ``-u / ||u||``; ``"sign"``: ``-sign(u)``;
    ``"std"``: ``-std(B)`` per coordinate (sample std; whatever ``relative_to``). A zero ``p``
    (one benign model with ``"std"``, ``u = 0``) gives ``gamma = 0``, the mean; silent (None)
    when it knows no model. The note records ``gamma``, ``perturbation`` and what ``u`` is from.

    ``relative_to="reference"`` is the default because reversing the benign update is the
    paper's attack (see the module); ``"zero"`` reverses the models themselves, which shrinks
    the message towards 0 rather than undoing the round's progress.

    Source: Shejwalkar and Houmansadr, "Manipulating the Byzantine: Optimizing Model Poisoning
    Attacks and Defenses for Federated Learning", NDSS 2021 (AGR-agnostic Min-Max attack;
    search: Algorithm 1; paper and code: ``gamma_init = 50``, ``tau = 1e-5``).

    THREAT MODEL: the models its neighbours sent it this round (the pool when colluding) and last
    round's mean, where the paper's attacker knows every benign update; not the defence (the
    attack is rule-agnostic); deterministic, the same message to every receiver.
    """

    def _fits(self, offsets, p, pairwise):
        bound = float(pairwise.max())
        distances = _squared_distances(offsets, p)
        return lambda gamma: float(distances(gamma).max()) <= bound


@ATTACK_REGISTRY.register("min_sum")
@dataclass(frozen=True)
class MinSum(_Optimised):
    """Min-Sum: the benign mean moved along ``p`` while its summed squared distances stay benign.

    ``message = mean(B) + gamma * p`` with ``gamma`` the largest (found by
    :func:`search_gamma`) such that ``sum_i ||message - b_i||^2 <= max_i sum_j ||b_i - b_j||^2``:
    its summed squared distance to the benign models is no larger than a benign model's.
    ``p``, ``relative_to``, the fallbacks and the note as for :class:`MinMax`.

    ``bound``: ``"max"`` (default) is the bound above, as the paper writes it; ``"min"`` takes
    ``min_i`` instead, as the authors' released code (and the libraries built from it) does:
    no larger than the *least* outlying benign model's sum, a smaller ``gamma``.

    Source: Shejwalkar and Houmansadr, "Manipulating the Byzantine: Optimizing Model Poisoning
    Attacks and Defenses for Federated Learning", NDSS 2021 (AGR-agnostic Min-Sum; Algorithm 1).

    THREAT MODEL: as :class:`MinMax`'s.
    """

    bound: str = "max"

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        super().check_settings(s)
        check_choice("MinSum", "bound", s.bound, _MIN_SUM_BOUNDS)

    def _fits(self, offsets, p, pairwise):
        sums = pairwise.sum(dim=1)
        bound = float(sums.max() if self.bound == "max" else sums.min())
        distances = _squared_distances(offsets, p)
        return lambda gamma: float(distances(gamma).sum()) <= bound


def _fang_bounds(benign: torch.Tensor, direction: torch.Tensor, b: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per coordinate, the interval :class:`FangTrimmedMean` draws from (the mean where s_j = 0)."""
    high, low = benign.max(dim=0).values, benign.min(dim=0).values
    s = torch.sign(direction)
    # s_j = -1: [w_max, b w_max] if w_max > 0, else [w_max, w_max / b].
    up_lo = high
    up_hi = torch.where(high > 0, b * high, high / b)
    # s_j = +1: [w_min / b, w_min] if w_min > 0, else [b w_min, w_min].
    down_lo = torch.where(low > 0, low / b, b * low)
    down_hi = low
    mean = benign.mean(dim=0)
    lower = torch.where(s < 0, up_lo, torch.where(s > 0, down_lo, mean))
    upper = torch.where(s < 0, up_hi, torch.where(s > 0, down_hi, mean))
    return lower, upper


@ATTACK_REGISTRY.register("fang_trimmed_mean")
@dataclass(frozen=True)
class FangTrimmedMean(Checked):
    """Fang et al.'s full-knowledge attack on the trimmed mean: values beyond the benign extremes.

    Per coordinate, beyond the benign extreme on the side the benign models are not moving to:
    ``s_j = sign(mean_j(B) - reference_j)`` (``sign(mean_j(B))`` in the first round, with no
    reference) is the way they move coordinate ``j``. For ``s_j = -1`` the coordinate is drawn
    uniformly from ``[w_max_j, b * w_max_j]`` when ``w_max_j > 0``, else from
    ``[w_max_j, w_max_j / b]``; for ``s_j = +1`` from ``[w_min_j / b, w_min_j]`` when
    ``w_min_j > 0``, else from ``[b * w_min_j, w_min_j]``; ``w_max_j``/``w_min_j`` the
    largest/smallest benign value of coordinate ``j``. Where ``s_j = 0`` (no move to oppose) it
    is the benign mean. ``b > 1`` (paper: 2). Silent (None) when it knows no model. The note
    counts the coordinates ``moving_up`` and ``moving_down`` (the way the benign models move).

    Draws: one uniform vector per receiver (in ``view.receivers`` order; uniform in value, where the
    paper only says it samples the interval). Colluders draw from :func:`colluder_generator` (each
    its own child of the round generator), so two never send a shared receiver the same values.

    Source: Fang, Cao, Jia and Gong, "Local Model Poisoning Attacks to Byzantine-Robust Federated
    Learning", USENIX Security 2020, section 4 (attack on trimmed mean, full knowledge; paper:
    ``b = 2``). There ``s_j`` is the sign of the global model's change without attack; a
    decentralised attacker estimates it from the benign mean's move since the previous round.

    THREAT MODEL: the paper's "full knowledge" is every benign model; here the models its
    neighbours sent it this round (the pool when colluding) and last round's mean. Built against
    the trimmed mean but reads none of the defence's settings. A fresh draw per receiver.
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel(tailored=True)
    b: float = 2.0

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        owner = cls.__name__
        b = check_real(owner, "b", s.b, positive=True)
        if not b > 1.0:
            raise ValueError(f"{owner}: b must be > 1 (the interval's far end), got {s.b!r}")
        s.b = b

    def plan(self, view: AttackView, generator: torch.Generator) -> Crafted:
        _, known = view.known()
        if known.shape[0] == 0:
            return Crafted({k: None for k in view.receivers}, {"silent": True})
        benign = known.to(torch.float64)
        direction, measured_from = _direction(view, benign.mean(dim=0), "reference")
        lower, upper = _fang_bounds(benign, direction, self.b)
        own = colluder_generator(view, generator)
        messages = {}
        for k in view.receivers:
            u = torch.rand(view.dim, generator=own, dtype=torch.float64)
            messages[k] = (lower + u * (upper - lower)).to(torch.float32)
        note = {
            "b": self.b,
            "relative_to": measured_from,
            "moving_up": int((direction > 0).sum()),
            "moving_down": int((direction < 0).sum()),
        }
        return Crafted(messages, note)


@ATTACK_REGISTRY.register("fang_median")
@dataclass(frozen=True)
class FangMedian(FangTrimmedMean):
    """Fang et al.'s full-knowledge attack on the median: the trimmed-mean attack's values.

    The paper attacks the median with its trimmed-mean construction (section 4, "Attacking median"):
    per coordinate ``j``, values drawn beyond the benign maximum where the benign models move down
    and beyond the minimum where they move up, the intervals, ``s_j``, the draws and the fallbacks
    as :class:`FangTrimmedMean`'s. A name of its own so a scenario says which rule it targets.

    Source: Fang, Cao, Jia and Gong, "Local Model Poisoning Attacks to Byzantine-Robust
    Federated Learning", USENIX Security 2020, section 4 (paper: ``b = 2``).

    THREAT MODEL: as :class:`FangTrimmedMean`'s.
    """
