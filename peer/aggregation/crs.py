"""Customized reweighting strategies (CRS): performance scores -> aggregation weights.

A CRS is step 3 of DFedReweighting (paper, section "DFedReweighting", Algorithm 1): client k
has a score ``m_i`` for every candidate model (its own and each neighbour's) and turns the
score set ``M_k`` into weights ``v_i = s(m_i, M_k)``::

    weights = crs(scores)      # scores: float tensor [C]  ->  weights: float64 tensor [C]

The weights are non-negative and sum to 1, so ``sum_i v_i w_i`` is a convex combination.

Edge-case contract (every CRS here, implemented once in :func:`apply_crs_contract`)
-----------------------------------------------------------------------------------
1. A non-finite score (NaN, +Inf, -Inf) gets weight exactly 0 and is left out of every statistic
   the CRS computes (e.g. a mean clipping threshold): a failed evaluation or an overflowing or
   adversarial model never receives weight, and one NaN cannot make the threshold NaN for all.
2. No finite score at all -> all-zero weights. This is the one output that does not sum to 1:
   there is nothing to trust, and the caller decides (the rules keep the client's own model).
3. One finite score -> that candidate gets 1.0. All finite scores equal -> uniform over them.
   Both are decided before the strategy runs, which could divide by zero there (proportional on
   all-zero scores) or clip everything (a mean threshold hit by rounding).
4. If the strategy gives total weight 0 to the finite candidates (e.g. all scores <= 0 under
   :class:`Proportional`) -> uniform over the finite candidates.
5. Raw strategy weights are divided by their maximum before being summed, so huge finite
   scores cannot overflow the normalisation.

The output is float64 on the CPU whatever the input dtype/device (weights are tiny, and float64
keeps "sums to 1" at the 1e-15 level); exactly rounded sums make it independent of their order.

Adding a strategy: subclass :class:`ReweightingStrategy`, implement ``weigh_values`` on floats (or
``weigh`` on a float64 tensor; either sees only >= 2 finite, not-all-equal scores) and register it
with ``@CRS_REGISTRY.register("name")``; its dataclass fields are its scenario settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Protocol, runtime_checkable

import torch

from dfedrw.peer.checked import Checked
from dfedrw.peer.registry import Registry, check_choice, check_int, check_real

__all__ = [
    "CRS",
    "CRS_REGISTRY",
    "AccuracyClippedAtMean",
    "Clip",
    "LossClippedAtMean",
    "Proportional",
    "Rank",
    "ReweightingStrategy",
    "Softmax",
    "apply_crs_contract",
    "contract_values",
    "make_crs",
]


CRS_REGISTRY = Registry("crs", "dfedrw.crs", calls={"__call__": ("scores",)})
"""The CRSs by name; settings in a scenario's ``[aggregation.crs_params.NAME]``."""


@runtime_checkable
class CRS(Protocol):
    """Anything mapping a score vector [C] to non-negative weights [C] summing to 1."""

    def __call__(self, scores: torch.Tensor) -> torch.Tensor: ...


def _as_score_vector(scores: torch.Tensor) -> torch.Tensor:
    tensor = torch.as_tensor(scores)
    if tensor.dim() != 1:
        raise ValueError(
            f"scores must be a 1-D tensor [C], got shape {tuple(tensor.shape)}"
        )
    return tensor.detach().to(device="cpu", dtype=torch.float64)


def _mean(items: Sequence[float]) -> float:
    """Order-independent mean of finite values that cannot overflow: ``math.fsum`` is exactly
    rounded, so permuting the candidates cannot move a threshold by one ulp and flip a keep/clip
    decision; dividing by the largest magnitude first keeps the partial sums finite."""
    magnitude = max(abs(v) for v in items)
    if magnitude == 0.0:
        return 0.0
    return math.fsum(v / magnitude for v in items) / len(items) * magnitude


def contract_values(
    values: Sequence[float],
    weigh: Callable[[list[float]], Sequence[float]],
    *,
    owner: str = "CRS",
) -> list[float]:
    """The module's edge-case contract around a raw weighting function, on Python floats: ``weigh``
    receives only the finite scores (at least two, not all equal) and returns raw non-negative
    finite weights, one per score. For a handful of candidates plain floats are faster than
    tensors, and each value is computed alike whatever batch it is in."""
    finite = [math.isfinite(v) for v in values]
    kept = [v for v, ok in zip(values, finite, strict=True) if ok]
    count = len(kept)
    if count == 0:
        return [0.0] * len(values)
    if count == 1 or all(v == kept[0] for v in kept):
        return [1.0 / count if ok else 0.0 for ok in finite]
    raw = [float(x) for x in weigh(kept)]
    if len(raw) != count:
        raise ValueError(f"{owner}: weigh returned shape ({len(raw)},), expected ({count},)")
    if not all(math.isfinite(x) and x >= 0 for x in raw):
        raise ValueError(f"{owner}: weigh returned negative or non-finite weights {raw}")
    top = max(raw)
    raw = [1.0] * count if top <= 0 else [x / top for x in raw]
    total = math.fsum(raw)
    shares = iter([x / total for x in raw])
    return [next(shares) if ok else 0.0 for ok in finite]


def apply_crs_contract(
    scores: torch.Tensor,
    weigh: Callable[[torch.Tensor], torch.Tensor],
    *,
    owner: str = "CRS",
) -> torch.Tensor:
    """:func:`contract_values` around a raw weighting function of tensors: ``weigh`` receives
    the finite scores as a float64 tensor and returns a tensor of raw weights."""

    def weigh_values(kept: list[float]) -> list[float]:
        raw = torch.as_tensor(weigh(torch.tensor(kept, dtype=torch.float64)), dtype=torch.float64)
        if raw.shape != (len(kept),):
            raise ValueError(f"{owner}: weigh returned shape {tuple(raw.shape)}, expected ({len(kept)},)")
        return raw.tolist()

    return torch.tensor(contract_values(_as_score_vector(scores).tolist(), weigh_values, owner=owner), dtype=torch.float64)


class ReweightingStrategy(Checked):
    """Base class of the built-in CRSs: ``v = normalise(weigh(m[finite]))`` with the module's edge
    cases. Subclasses implement ``weigh_values(finite_scores: list[float]) -> raw non-negative
    weights`` (or, written against tensors, ``weigh(finite_scores: Tensor) -> Tensor``)."""

    def weigh_values(self, scores: list[float]) -> Sequence[float]:
        raise NotImplementedError

    def weigh(self, scores: torch.Tensor) -> torch.Tensor:
        """:meth:`weigh_values` of a float64 tensor, as a tensor."""
        return torch.tensor(self.weigh_values(scores.tolist()), dtype=torch.float64)

    def values(self, scores: Sequence[float]) -> list[float]:
        """The weights of ``scores`` (Python floats, NaN/Inf allowed) as Python floats: what
        ``__call__`` returns, without tensors (the batched engine's path)."""
        owner = type(self).__name__
        if type(self).weigh is not ReweightingStrategy.weigh:  # a strategy written against tensors
            return apply_crs_contract(torch.tensor(scores, dtype=torch.float64), self.weigh, owner=owner).tolist()
        return contract_values(scores, self.weigh_values, owner=owner)

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.tensor(self.values(_as_score_vector(scores).tolist()), dtype=torch.float64)


@CRS_REGISTRY.register("softmax")
@dataclass(frozen=True)
class Softmax(ReweightingStrategy):
    """Temperature-scaled softmax over the scores (client fairness).

    ``v_i = exp(scale * m_i / T) / sum_j exp(scale * m_j / T)``

    Source: paper, eq. (combination-fairness-acc), TPM = accuracy, T in {0.01, 0.1, 0.5}. A
    smaller T concentrates the weight on the best candidates. The paper does not say whether
    accuracy is a fraction or a percentage; ``scale`` allows both (1 for a fraction in [0, 1], 100
    for percent: ``scale=100, T=10`` equals ``scale=1, T=0.1``). The defaults, ``T = 0.1`` and
    ``scale = 100``, reproduce the paper's fairness table (docs/results). A negative ``scale``
    prefers low scores, e.g. a softmax over losses.

    Computed as ``exp(factor * (m_i - m_ref))`` with ``m_ref`` the best score (log-sum-exp
    shift), so it never overflows; a vanishing T tends to a uniform split over the arg-max.
    """

    temperature: float = 0.1
    scale: float = 100.0

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        temperature = check_real("Softmax", "temperature", s.temperature, positive=True)
        s.temperature = temperature
        scale = check_real("Softmax", "scale", s.scale)
        if scale == 0.0:
            raise ValueError("Softmax: scale must be nonzero (0 would ignore the scores), got 0")
        s.scale = scale

    def weigh_values(self, scores: list[float]) -> list[float]:
        factor = self.scale / self.temperature  # may be +-inf for a tiny T: handled below
        if factor == 0.0:  # underflow of a tiny scale over a huge T: scores do not matter
            return [1.0] * len(scores)
        reference = max(scores) if factor > 0 else min(scores)
        # factor * diff <= 0 always; diff == 0 is special-cased because inf * 0 is NaN.
        return [1.0 if s == reference else math.exp((s - reference) * factor) for s in scores]


_LOSS_CLIP_WEIGHTINGS = ("proportional", "inverse", "uniform")


@CRS_REGISTRY.register("loss_clip_mean")
@dataclass(frozen=True)
class LossClippedAtMean(ReweightingStrategy):
    """Loss clipping at the mean (Byzantine robustness; TPM = loss).

    ``mu = mean_j m_j``; ``v_i = 0`` if ``m_i > mu``; the kept candidates (``m_i <= mu``) are
    weighted by ``weighting``:

    * ``"proportional"`` (default): ``v_i = m_i / sum_{kept} m_j``, paper eq. (combination-loss)
      as written, behind the paper's Byzantine table: it gives a *higher* loss *more* weight.
    * ``"inverse"``: ``v_i = (1/m_i) / sum_{kept} 1/m_j`` -- lower loss, more weight. If a
      kept loss is 0, the zero-loss candidates share all the weight uniformly.
    * ``"uniform"``: ``v_i = 1 / |kept|``.

    Negative scores (impossible for cross-entropy, possible for a custom TPM) are clamped to 0 so
    weights stay non-negative. If the kept scores sum to 0 under "proportional" they share the
    weight uniformly; the clipped ones stay at 0.
    """

    weighting: str = "proportional"

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        check_choice("LossClippedAtMean", "weighting", s.weighting, _LOSS_CLIP_WEIGHTINGS)

    def weigh_values(self, scores: list[float]) -> list[float]:
        # The mean lies in [min, max]: max(mean, min) only undoes rounding, and keeps the best.
        threshold = max(_mean(scores), min(scores))
        return _weigh_kept(scores, [s <= threshold for s in scores], self.weighting)


def _weigh_kept(scores: list[float], kept: list[bool], weighting: str) -> list[float]:
    """The raw weights of the ``kept`` candidates under a loss clip's ``weighting``
    (``proportional``, ``inverse``, ``uniform``: see :class:`LossClippedAtMean`), 0 elsewhere."""
    if weighting == "uniform":
        return [float(k) for k in kept]
    losses = [max(s, 0.0) for s in scores]
    if weighting == "proportional":
        raw = [x if k else 0.0 for x, k in zip(losses, kept, strict=True)]
        return raw if any(x > 0 for x in raw) else [float(k) for k in kept]
    perfect = [k and x == 0 for x, k in zip(losses, kept, strict=True)]
    if any(perfect):
        return [float(p) for p in perfect]
    # min/m_i lies in (0, 1]: no overflow even for denormal losses.
    smallest = min(x for x, k in zip(losses, kept, strict=True) if k)
    return [smallest / x if k else 0.0 for x, k in zip(losses, kept, strict=True)]


@CRS_REGISTRY.register("loss_clip_median")
@dataclass(frozen=True)
class LossClippedAtMedian(ReweightingStrategy):
    """Loss clipping at the median (Byzantine robustness; TPM = loss): a threshold that a few
    extreme candidates cannot move.

    ``mu = median_low_j m_j`` (the lower middle score: one candidate's own); ``v_i = 0`` if
    ``m_i > mu * (1 + margin)``; the kept candidates are weighted by ``weighting`` as in
    :class:`LossClippedAtMean` (``"inverse"`` by default: a lower loss, more weight).

    Unlike the threshold of :class:`LossClippedAtMean`, which one huge loss lifts at will (the
    colluding decoy of :class:`~dfedrw.peer.attacks.reweighting.DecoyStealth`), the median moves
    at most one place per outlier: with ``b`` Byzantine candidates among ``n`` it stays within the
    honest scores while ``b < n / 2``, and a kept model must score as well as about half the
    candidates. It clips about half the candidates every round, honest ones too (on non-IID shards
    those whose data differ most): ``margin`` keeps those within a share of the threshold.

    Source: this project's, against the decoy on the mean threshold; the median as a statistic of
    breakdown point 1/2 follows the coordinate-wise median of Yin et al., ICML 2018, on the scores.
    """

    weighting: str = "inverse"
    margin: float = 0.0

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        check_choice("LossClippedAtMedian", "weighting", s.weighting, _LOSS_CLIP_WEIGHTINGS)
        s.margin = check_real("LossClippedAtMedian", "margin", s.margin, nonnegative=True)

    def weigh_values(self, scores: list[float]) -> list[float]:
        ordered = sorted(scores)
        median = ordered[(len(ordered) - 1) // 2]
        threshold = median * (1.0 + self.margin) if median > 0 else median
        return _weigh_kept(scores, [s <= threshold for s in scores], self.weighting)


@CRS_REGISTRY.register("loss_drop_highest")
@dataclass(frozen=True)
class LossDropHighest(ReweightingStrategy):
    """Drop the ``num_byzantine`` highest losses (Byzantine robustness; TPM = loss), weigh the
    rest by ``weighting`` as :class:`LossClippedAtMean` does (``"uniform"`` by default).

    ``b = num_byzantine`` (what the client is told of its Byzantine neighbours); of the
    neighbours' candidates the ``b`` with the highest scores get 0, and so do those equal to the
    ``b``-th highest (no order of the neighbours decides); the first candidate (the own model, when
    finite) is never dropped. Told 0, it keeps every candidate: without attackers it is the average
    of every neighbour, as DFedAvg's, whatever the shards, where a threshold on the losses (the
    mean, the median) clips the honest neighbours whose data differ from the client's, every round.

    An attacker kept must score better than ``b`` candidates; one extreme loss lifts nothing.
    Source: this project's; the trimming of the ``b`` worst follows the trimmed mean's (Yin et al.,
    ICML 2018) and Multi-Krum's ``n - b`` kept (Blanchard et al., NeurIPS 2017), on the scores.
    """

    num_byzantine: int = 0
    weighting: str = "uniform"

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        check_int("LossDropHighest", "num_byzantine", s.num_byzantine, minimum=0)
        check_choice("LossDropHighest", "weighting", s.weighting, _LOSS_CLIP_WEIGHTINGS)

    def values(self, scores: Sequence[float]) -> list[float]:
        # The first score is the own model's only when it is finite: a non-finite one is left
        # out before the weighing, and then no candidate is kept whatever its score.
        own = bool(len(scores)) and math.isfinite(scores[0])
        return contract_values(scores, lambda finite: self._weigh(finite, own), owner=type(self).__name__)

    def weigh_values(self, scores: list[float]) -> list[float]:
        return self._weigh(scores, True)

    def _weigh(self, scores: list[float], own: bool) -> list[float]:
        first = 1 if own else 0  # the own model stays
        others = sorted(scores[first:], reverse=True)
        if not self.num_byzantine or not others:
            return _weigh_kept(scores, [True] * len(scores), self.weighting)
        # The b-th highest neighbour score: it and every one above it go (equal ones alike).
        bound = others[min(self.num_byzantine, len(others)) - 1]
        return _weigh_kept(scores, [i < first or s < bound for i, s in enumerate(scores)], self.weighting)


@CRS_REGISTRY.register("acc_clip_mean")
@dataclass(frozen=True)
class AccuracyClippedAtMean(ReweightingStrategy):
    """Accuracy clipping at the mean (alternative Byzantine-robust pair; TPM = accuracy).

    ``mu = mean_j m_j``; ``v_i = m_i / sum_{m_j >= mu} m_j`` if ``m_i >= mu``, else 0.

    Source: paper, eq. (strategy2inbzt). Negative scores are clamped to 0; if the kept scores
    sum to 0 they share the weight uniformly (the clipped ones stay at 0).
    """

    def weigh_values(self, scores: list[float]) -> list[float]:
        threshold = min(_mean(scores), max(scores))  # undo rounding; keep the best
        kept = [s >= threshold for s in scores]
        raw = [max(s, 0.0) if k else 0.0 for s, k in zip(scores, kept, strict=True)]
        return raw if any(x > 0 for x in raw) else [float(k) for k in kept]


@CRS_REGISTRY.register("proportional")
@dataclass(frozen=True)
class Proportional(ReweightingStrategy):
    """Weights proportional to the scores (group fairness with TPM = accuracy).

    ``v_i = max(m_i, 0) / sum_j max(m_j, 0)``

    Source: paper, table "multi-objective task across clients" (clients 2 and 3). Negative scores
    are clamped to 0, not rejected: a weight cannot be negative, but a custom TPM may give negative
    values; if every score is <= 0 the contract's uniform fallback applies.
    """

    def weigh_values(self, scores: list[float]) -> list[float]:
        return [max(s, 0.0) for s in scores]


@CRS_REGISTRY.register("clip")
@dataclass(frozen=True)
class Clip(ReweightingStrategy):
    """Weights proportional to the scores clipped to ``[0, threshold]`` (fast convergence).

    ``v_i = clip(m_i, 0, t) / sum_j clip(m_j, 0, t)``, ``t > 0``

    Source: paper, table "multi-objective task across clients" (client 4, TPM = loss). All
    candidates scoring >= t tie, so no single very high score can take all the weight.
    """

    threshold: float = 1.0

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        s.threshold = check_real("Clip", "threshold", s.threshold, positive=True)

    def weigh_values(self, scores: list[float]) -> list[float]:
        return [min(max(s, 0.0), self.threshold) for s in scores]


_RANK_PREFERENCES = ("low", "high")


@CRS_REGISTRY.register("rank")
@dataclass(frozen=True)
class Rank(ReweightingStrategy):
    """Rank-based weights: the best score gets C, the next C - 1, ..., the worst 1.

    ``r_i = |{j : m_j better than m_i}| + (|{j != i : m_j = m_i}|) / 2`` (0 for the best, ties
    share their mean rank), ``v_i = (C - r_i) / sum_j (C - r_j)`` over the C finite scores;
    ``prefer="low"`` (default: loss) ranks low scores best, ``"high"`` (accuracy) high ones. Only
    the order counts: no extreme score takes all the weight, and the worst keeps 1 / sum.

    Source: rank weighting as in Borda count aggregation; here a CRS in the sense of the
    paper's eq. (agg), ``v_i = s(m_i, M_k)``.
    """

    prefer: str = "low"

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        check_choice("Rank", "prefer", s.prefer, _RANK_PREFERENCES)

    def weigh_values(self, scores: list[float]) -> list[float]:
        values = scores if self.prefer == "low" else [-s for s in scores]
        count = len(values)
        return [
            count - (sum(1 for w in values if w < v) + (sum(1 for w in values if w == v) - 1) / 2) for v in values
        ]

def make_crs(name: str, **params: object) -> CRS:
    """Build the CRS registered as ``name`` with keyword ``params`` (checked, see registry)."""
    return CRS_REGISTRY.create(name, **params)
