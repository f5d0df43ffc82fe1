"""Distance-based rules: Krum and multi-Krum (Blanchard et al., NeurIPS 2017) and the geometric
median (Pillutla et al., 2022) (conventions: :mod:`peer.aggregation.baselines`).

A client's squared distances come from the Gram matrix of its finite candidates (float64,
:func:`pairwise_squared_distances`): one matrix product, not a pass over each pair's differences.
Krum and multi-Krum are written once, over a batch (a client's call is a batch of one), and give
every client what ``rule(batch.one(c))`` gives, bit for bit: each client's product, scores,
choices and weighted sum are taken on its own rows, in the order and shape a batch of one has
them, so nothing else in the batch enters its arithmetic."""

from __future__ import annotations
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
import torch
from dfedrw.peer.checked import Checked
from dfedrw.peer.registry import check_int, check_real
from dfedrw.peer.aggregation.rules import RULE_REGISTRY, ToleratesByzantine, Aggregate, BatchOfOne, RoundBatch, RoundInputs
from dfedrw.peer.aggregation.candidates import (
    FiniteCandidates, by_id, combine_rows, finite_by_id, keep_own, keep_own_pooled, package_aggregate, package_for, pooled_order,
)

# A pair whose squared distance from the Gram matrix is at most this share of the rows' squared
# norms is measured from its difference: the product's rounding, about D * 2^-53 of the norms,
# would be a large part of it (and could leave identical models a hair apart, or below zero).
_NEAR = 1e-9


def gram(rows: torch.Tensor) -> list[list[float]]:
    """``g[i][j] = w_i . w_j`` of ``rows`` (float64 [F, D]) as Python floats, from one matrix
    product; read it for ``i <= j`` (the upper triangle: a product need not be exactly
    symmetric). The product of two float32 values widened to float64 is exact, so each entry is
    off only by its sum's rounding, about ``D * 2^-53 |w_i| |w_j|``."""
    return (rows @ rows.t()).tolist()


def pairwise_squared_distances(rows: torch.Tensor, origin: int | None = None) -> torch.Tensor:
    """``d[i, j] = ||w_i - w_j||^2`` (float64 [F, F] on the CPU) as ``|x_i|^2 + |x_j|^2 - 2 x_i .
    x_j`` from the :func:`gram` of ``x_i = w_i - w_origin`` (``origin``: the index of a row to
    measure from, such as the client's own model; None: from 0): exactly symmetric, a zero
    diagonal, never negative. A pair the product leaves within ``_NEAR`` of the two squared
    norms is measured from its difference instead: exactly 0 for two identical rows. The others
    are off by about ``D * 2^-53`` of ``|x_i|^2 + |x_j|^2``, under ``1e-9`` of the distance.

    For ``rows = [[0, 0], [3, 4]]``: ``[[0, 25], [25, 0]]``."""
    distances = _squared_distances(rows, origin)
    return torch.tensor(distances, dtype=torch.float64).view(len(distances), len(distances))


def _squared_distances(rows: torch.Tensor, origin: int | None) -> list[list[float]]:
    """:func:`pairwise_squared_distances` as rows of Python floats: a few dozen pairs, for which
    Python's floats (IEEE doubles, as float64 tensors) beat a dozen tensor calls."""
    shifted = rows if origin is None else rows - rows[origin]
    products = gram(shifted)
    count = len(products)
    distances = [[0.0] * count for _ in range(count)]
    for i in range(count):
        row, norm = products[i], products[i][i]
        for j in range(i + 1, count):
            other = products[j][j]
            value = norm + other - 2.0 * row[j]
            if value <= _NEAR * (norm + other):
                if torch.equal(rows[i], rows[j]):
                    value = 0.0
                else:
                    difference = shifted[i] - shifted[j]
                    value = float(difference @ difference)
            distances[i][j] = distances[j][i] = value
    return distances


def krum_scores(finite: FiniteCandidates, num_byzantine: int) -> list[float]:
    """Krum's score of each row of ``finite`` (at least two rows): the sum of its squared distances
    to its ``C - f - 2`` nearest others (at least one, at most ``C - 1``: all scores 0 would make
    the choice arbitrary), exactly rounded (``math.fsum``: no order of terms enters it); distances
    measured from the own model (where not finite, the first finite candidate)."""
    count = len(finite.ids)
    distances = _squared_distances(finite.rows, 0 if finite.own is None else finite.own)
    neighbours = min(max(count - num_byzantine - 2, 1), count - 1)
    return [math.fsum(sorted(row[:i] + row[i + 1 :])[:neighbours]) for i, row in enumerate(distances)]


def _lowest_scores(finite: FiniteCandidates, num_byzantine: int, keep: int) -> torch.Tensor:
    """Uniform weights (CPU [F]) on the ``keep`` lowest :func:`krum_scores` (ties: lower id)."""
    count = len(finite.ids)
    if count == 1:
        return torch.ones(1, dtype=torch.float64)
    scores = krum_scores(finite, num_byzantine)
    chosen = set(sorted(range(count), key=lambda i: (scores[i], i))[:keep])
    return torch.tensor([1.0 / keep if i in chosen else 0.0 for i in range(count)], dtype=torch.float64)


def _krum_batched(batch: RoundBatch, settings: Callable[[int, int], tuple[int, int]]) -> list[Aggregate]:
    """Krum's or multi-Krum's round for every client of ``batch`` (``settings(c, count)``: client
    ``c``'s ``num_byzantine`` and how many of its ``count`` finite candidates to average), each on
    its own rows as in a batch of one, widened to float64 once for all (exact)."""
    finite = batch.finite().tolist()
    orders = [pooled_order(batch, c, finite) for c in range(len(batch))]
    used = sorted({row for order in orders for row in order.pooled})
    place = {row: i for i, row in enumerate(used)}
    device = batch.vectors.device
    wide = batch.vectors.index_select(0, torch.tensor(used, dtype=torch.long, device=device)).to(torch.float64) if used else None
    out = []
    for c, order in enumerate(orders):
        count = len(order.ids)
        if count == 0:
            out.append(keep_own_pooled(batch, c))
            continue
        rows = wide.index_select(0, torch.tensor([place[row] for row in order.pooled], dtype=torch.long, device=device))
        finite_c = FiniteCandidates(ids=order.ids, rows=rows, own=order.own, positions=order.positions)
        num_byzantine, keep = settings(c, count)
        weights = _lowest_scores(finite_c, num_byzantine, keep)
        out.append(package_for(batch.ids[c], combine_rows(finite_c, weights), by_id(finite_c, weights)))
    return out


@RULE_REGISTRY.register("krum")
@dataclass(frozen=True)
class Krum(BatchOfOne, ToleratesByzantine):
    """Krum: keep the one candidate closest to its nearest neighbours.

    ``s_i = sum_{j in N_i} ||w_i - w_j||^2`` over the ``C - f - 2`` candidates nearest to
    ``w_i`` (``f = num_byzantine``);  ``w_k^{t+1} = w_{argmin_i s_i}``.

    With few finite candidates (``C - f - 2 < 1``) one neighbour is used, so the scores still
    say something; ties go to the lower id. Weight 1 on the chosen candidate.

    Source: Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient
    Descent", NeurIPS 2017.

    Written once, over a batch (:class:`BatchOfOne`; module notes): 1.69x faster than a batch of
    one per client (``python bench/rules_batched.py``, this machine).
    """


    def batch_group(self) -> tuple:
        """What :meth:`batched` needs equal across its clients: nothing (each client's
        ``num_byzantine`` is read from its own rule, ``RoundBatch.rules``)."""
        return ()

    def batched(self, batch: RoundBatch) -> list[Aggregate]:
        """Every client's Krum at once, bit for bit as in a batch of one (module notes)."""
        rules = batch.rules or (self,) * len(batch)
        return _krum_batched(batch, lambda c, count: (rules[c].num_byzantine, 1))


@RULE_REGISTRY.register("multi_krum")
@dataclass(frozen=True)
class MultiKrum(BatchOfOne, ToleratesByzantine):
    """Multi-Krum: average the ``m`` candidates with the lowest Krum scores.

    ``s_i`` as in :class:`Krum`;  ``w_k^{t+1} = 1/m * sum_{i in S} w_i`` with ``S`` the ``m``
    lowest scores. ``m`` defaults to ``C - f``, clamped to ``[1, C]`` (C = finite candidates this
    round). Neighbour count clamp and tie-break as in :class:`Krum`; weight ``1/m`` on each chosen.

    Source: Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient
    Descent", NeurIPS 2017 (Multi-Krum, El Mhamdi et al. 2018 naming).

    Written once, over a batch (:class:`BatchOfOne`), as :class:`Krum`: 1.62x faster than a
    batch of one per client (``python bench/rules_batched.py``, this machine).
    """

    m: int | None = None

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        super().check_settings(s)
        if s.m is not None:
            check_int("MultiKrum", "m", s.m, minimum=1)

    def _keep(self, count: int) -> int:
        keep = count - self.num_byzantine if self.m is None else self.m
        return min(max(keep, 1), count)

    def batch_group(self) -> tuple:
        """As :meth:`Krum.batch_group`: every setting but ``num_byzantine``."""
        return (self.m,)

    def batched(self, batch: RoundBatch) -> list[Aggregate]:
        """Every client's multi-Krum at once, bit for bit as in a batch of one (module notes)."""
        rules = batch.rules or (self,) * len(batch)
        return _krum_batched(batch, lambda c, count: (rules[c].num_byzantine, rules[c]._keep(count)))


@RULE_REGISTRY.register("geometric_median")
@dataclass(frozen=True)
class GeometricMedian(Checked):
    """Geometric median by smoothed Weiszfeld iterations (RFA).

    ``z = argmin_z sum_i ||z - w_i||``, iterated from the mean as
    ``beta_i = 1 / max(eps, ||z - w_i||)``,  ``c_i = beta_i / sum_j beta_j``,
    ``z <- sum_i c_i w_i``, for at most ``max_iter`` steps, until the objective changes by at most
    ``tol`` times its value; ``eps`` keeps a candidate at ``z`` from dividing by zero. Reported
    weights: the final ``c_i`` (a convex combination); the model is exactly ``sum_i c_i w_i``.

    Source: Pillutla, Kakade and Harchaoui, "Robust Aggregation for Federated Learning",
    IEEE Trans. Signal Processing 2022 (RFA), with uniform candidate weights.
    """

    max_iter: int = 100
    tol: float = 1e-6
    eps: float = 1e-8

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        check_int("GeometricMedian", "max_iter", s.max_iter, minimum=1)
        s.tol = check_real("GeometricMedian", "tol", s.tol, nonnegative=True)
        s.eps = check_real("GeometricMedian", "eps", s.eps, positive=True)

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
