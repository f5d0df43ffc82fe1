"""Distance-based rules: Krum and multi-Krum (Blanchard et al., NeurIPS 2017) and the geometric
median (Pillutla et al., 2022) (conventions: :mod:`peer.aggregation.robust`)."""

from __future__ import annotations
import math
from dataclasses import dataclass
import torch
from dfedrw.peer.registry import check_int, check_real
from dfedrw.peer.aggregation.rules import RULE_REGISTRY, Aggregate, RoundInputs
from dfedrw.peer.aggregation.candidates import FiniteCandidates, by_id, combine_rows, finite_by_id, keep_own, package_aggregate


def pairwise_squared_distances(rows: torch.Tensor) -> torch.Tensor:
    """``d[i, j] = ||w_i - w_j||^2`` (float64 [F, F] on the CPU).

    One row at a time keeps memory at [F, D] instead of [F, F, D]; computing each entry from
    the difference (not ``|a|^2 + |b|^2 - 2ab``) keeps it exact for identical models. Each
    pair is computed once, row ``i`` against the rows after it, and mirrored (``(a - b)^2`` and
    ``(b - a)^2`` are the same numbers): exactly symmetric, in half the arithmetic.
    """
    count = rows.shape[0]
    distances = torch.zeros(count, count, dtype=rows.dtype)
    for i in range(count - 1):
        after = ((rows[i + 1 :] - rows[i]) ** 2).sum(dim=1).cpu()
        distances[i, i + 1 :] = after
        distances[i + 1 :, i] = after
    return distances


def _krum_scores(rows: torch.Tensor, num_byzantine: int) -> torch.Tensor:
    """Krum score per row: sum of squared distances to its ``C - f - 2`` nearest others."""
    count = rows.shape[0]
    # At least one neighbour (a score of 0 for everybody would make the choice arbitrary),
    # and no more than there are other candidates.
    neighbours = min(max(count - num_byzantine - 2, 1), count - 1)
    distances = pairwise_squared_distances(rows)
    distances.fill_diagonal_(math.inf)
    return distances.sort(dim=1).values[:, :neighbours].sum(dim=1)


def _lowest_scores(finite: FiniteCandidates, num_byzantine: int, keep: int) -> torch.Tensor:
    """Uniform weights (CPU [F]) on the ``keep`` lowest Krum scores, ties to the lower id."""
    count = len(finite.ids)
    weights = torch.zeros(count, dtype=torch.float64)
    if count == 1:
        weights[0] = 1.0
        return weights
    scores = _krum_scores(finite.rows, num_byzantine)
    chosen = scores.sort(stable=True).indices[:keep]
    weights[chosen] = 1.0 / keep
    return weights


@RULE_REGISTRY.register("krum")
@dataclass(frozen=True)
class Krum:
    """Krum: keep the one candidate closest to its nearest neighbours.

    ``s_i = sum_{j in N_i} ||w_i - w_j||^2`` over the ``C - f - 2`` candidates nearest to
    ``w_i`` (``f = num_byzantine``);  ``w_k^{t+1} = w_{argmin_i s_i}``.

    With few finite candidates (``C - f - 2 < 1``) one neighbour is used, so the scores still
    say something; ties go to the lower id. Weight 1 on the chosen candidate.

    Source: Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient
    Descent", NeurIPS 2017.
    """

    num_byzantine: int

    def __post_init__(self) -> None:
        check_int("Krum", "num_byzantine", self.num_byzantine, minimum=0)

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        finite = finite_by_id(inputs)
        if not finite.ids:
            return keep_own(inputs)
        weights = _lowest_scores(finite, self.num_byzantine, keep=1)
        return package_aggregate(inputs, combine_rows(finite, weights), by_id(finite, weights))


@RULE_REGISTRY.register("multi_krum")
@dataclass(frozen=True)
class MultiKrum:
    """Multi-Krum: average the ``m`` candidates with the lowest Krum scores.

    ``s_i`` as in :class:`Krum`;  ``w_k^{t+1} = 1/m * sum_{i in S} w_i`` with ``S`` the ``m``
    lowest scores. ``m`` defaults to ``C - f`` and is clamped to ``[1, C]`` (C = finite
    candidates this round). Neighbour count clamp and tie-break as in :class:`Krum`; weight
    ``1/m`` on each chosen candidate.

    Source: Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient
    Descent", NeurIPS 2017 (Multi-Krum, El Mhamdi et al. 2018 naming).
    """

    num_byzantine: int
    m: int | None = None

    def __post_init__(self) -> None:
        check_int("MultiKrum", "num_byzantine", self.num_byzantine, minimum=0)
        if self.m is not None:
            check_int("MultiKrum", "m", self.m, minimum=1)

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        finite = finite_by_id(inputs)
        count = len(finite.ids)
        if count == 0:
            return keep_own(inputs)
        keep = count - self.num_byzantine if self.m is None else self.m
        keep = min(max(keep, 1), count)
        weights = _lowest_scores(finite, self.num_byzantine, keep=keep)
        return package_aggregate(inputs, combine_rows(finite, weights), by_id(finite, weights))


@RULE_REGISTRY.register("geometric_median")
@dataclass(frozen=True)
class GeometricMedian:
    """Geometric median by smoothed Weiszfeld iterations (RFA).

    ``z = argmin_z sum_i ||z - w_i||``, iterated from the mean as
    ``beta_i = 1 / max(eps, ||z - w_i||)``,  ``c_i = beta_i / sum_j beta_j``,
    ``z <- sum_i c_i w_i``, for at most ``max_iter`` steps, stopping once the objective
    changes by at most ``tol`` times its value. ``eps`` keeps a candidate that coincides with
    ``z`` from dividing by zero. Reported weights are the final ``c_i`` (a convex
    combination), and the model is exactly ``sum_i c_i w_i``.

    Source: Pillutla, Kakade and Harchaoui, "Robust Aggregation for Federated Learning",
    IEEE Trans. Signal Processing 2022 (RFA), with uniform candidate weights.
    """

    max_iter: int = 100
    tol: float = 1e-6
    eps: float = 1e-8

    def __post_init__(self) -> None:
        check_int("GeometricMedian", "max_iter", self.max_iter, minimum=1)
        object.__setattr__(
            self, "tol", check_real("GeometricMedian", "tol", self.tol, nonnegative=True)
        )
        object.__setattr__(
            self, "eps", check_real("GeometricMedian", "eps", self.eps, positive=True)
        )

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        finite = finite_by_id(inputs)
        count = len(finite.ids)
        if count == 0:
            return keep_own(inputs)
        coefficients = torch.full((count,), 1.0 / count, dtype=torch.float64)
        median = combine_rows(finite, coefficients)
        objective = float(torch.linalg.vector_norm(finite.rows - median, dim=1).sum())
        for _ in range(self.max_iter):
            distances = torch.linalg.vector_norm(finite.rows - median, dim=1).cpu()
            inverse = 1.0 / distances.clamp(min=self.eps)
            coefficients = inverse / inverse.sum()
            median = combine_rows(finite, coefficients)
            previous = objective
            objective = float(torch.linalg.vector_norm(finite.rows - median, dim=1).sum())
            if abs(previous - objective) <= self.tol * objective:
                break
        return package_aggregate(inputs, median, by_id(finite, coefficients))
