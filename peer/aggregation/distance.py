"""Distance-based rules: Krum and multi-Krum (Blanchard et al., NeurIPS 2017) and the geometric
median (Pillutla et al., 2022) (conventions: :mod:`peer.aggregation.robust`).

Krum's and multi-Krum's ``batched`` (the batched engine's path) give every client exactly what
``rule(batch.one(c))`` gives, bit for bit. What they share is the squared distance of each pair
of pooled rows, computed once for all the clients holding both: each is the sum of one row of
squared differences, which torch sums row by row the same way whatever the number of rows (one
row alone is summed in two passes only with several threads and a model of at least
``_ONE_PASS`` coordinates; there the batched path is not taken), and ``(a - b)^2`` and
``(b - a)^2`` are the same numbers. Scores, choices and the weighted sum are each client's own,
on tensors of the shapes ``__call__`` uses.
"""

from __future__ import annotations
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
import torch
from dfedrw.peer.registry import check_int, check_real
from dfedrw.peer.aggregation.rules import RULE_REGISTRY, Aggregate, RoundBatch, RoundInputs
from dfedrw.peer.aggregation.candidates import (
    FiniteCandidates, PooledOrder, by_id, combine_rows, finite_by_id, keep_own, keep_own_pooled, package_aggregate, package_for,
    pooled_order,
)


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


# torch sums a reduction with a single output in two passes (a part per thread) when it has
# at least this many elements and torch runs several threads (TensorIterator's GRAIN_SIZE).
_ONE_PASS = 32768


# Rows of a pool already widened to float64: (position of each pooled row, the rows), the
# positions increasing with the pooled row.
Widened = tuple[Mapping[int, int], torch.Tensor]


def _pair_rows(vectors: torch.Tensor, pairs: Sequence[tuple[int, int]], widened: Widened | None = None):
    """The rows paired with each row ``a`` (pairs ``a < b``), and every row of a pair widened
    to float64 once (or as the caller ``widened`` them): (partners, their positions, the
    widened rows)."""
    partners: dict[int, list[int]] = {}
    for a, b in sorted(pairs):
        partners.setdefault(a, []).append(b)
    if widened is not None:
        return partners, widened[0], widened[1]
    used = sorted(set(partners) | {b for bs in partners.values() for b in bs})
    position = {row: i for i, row in enumerate(used)}
    return partners, position, vectors.index_select(0, torch.tensor(used, dtype=torch.long)).to(torch.float64)


def pooled_squared_distances(vectors: torch.Tensor, pairs: Sequence[tuple[int, int]], widened: Widened | None = None) -> dict[tuple[int, int], float]:
    """``||v_a - v_b||^2`` of the rows ``a < b`` of ``vectors`` for every pair ``(a, b)``, as
    :func:`pairwise_squared_distances` computes each entry (float64 differences squared, each
    row summed on its own): the rows paired with ``a`` against row ``a`` at once, as the rows
    after ``a`` (a few unwanted among them) where they are most of those. ``widened``: every
    row of a pair already in float64, when the caller has them."""
    partners, position, rows = _pair_rows(vectors, pairs, widened)
    out: dict[tuple[int, int], float] = {}
    for a, bs in partners.items():
        first, wanted = position[a], [position[b] for b in bs]
        if 2 * (wanted[-1] - first) <= 3 * len(wanted):
            differences = rows[first + 1 : wanted[-1] + 1] - rows[first]
            places = [at - first - 1 for at in wanted]
        else:
            differences = rows.index_select(0, torch.tensor(wanted, dtype=torch.long)).sub_(rows[first])
            places = list(range(len(wanted)))
        # x * x: the very numbers x ** 2 gives (torch squares by multiplying).
        values = differences.mul_(differences).sum(dim=1).tolist()
        out.update(((a, b), values[place]) for b, place in zip(bs, places, strict=True))
    return out


def pooled_dot_products(vectors: torch.Tensor, pairs: Sequence[tuple[int, int]], widened: Widened | None = None) -> dict[tuple[int, int], float]:
    """``v_a . v_b`` in float64 for every pair ``(a, b)`` of rows of ``vectors``, ``a <= b``
    (``(a, a)``: the squared norm): each the sum of one row of products, summed on its own,
    so the same number whichever other pairs are computed beside it (one thread; see the
    module docstring). ``widened``: every row of a pair already in float64, when the caller
    has them."""
    partners, position, rows = _pair_rows(vectors, pairs, widened)
    out: dict[tuple[int, int], float] = {}
    for a, bs in partners.items():
        wanted = [position[b] for b in bs]
        first = position[a]
        if wanted[-1] - wanted[0] + 1 == len(wanted):
            products = rows[wanted[0] : wanted[-1] + 1] * rows[first]
        else:
            products = rows.index_select(0, torch.tensor(wanted, dtype=torch.long)).mul_(rows[first])
        out.update(zip(((a, b) for b in bs), products.sum(dim=1).tolist()))
    return out


def _krum_scores(rows: torch.Tensor, num_byzantine: int, distances: torch.Tensor | None = None) -> torch.Tensor:
    """Krum score per row: sum of squared distances to its ``C - f - 2`` nearest others.
    ``distances``: :func:`pairwise_squared_distances` of ``rows`` when the caller has it."""
    count = rows.shape[0]
    # At least one neighbour (a score of 0 for everybody would make the choice arbitrary),
    # and no more than there are other candidates.
    neighbours = min(max(count - num_byzantine - 2, 1), count - 1)
    distances = pairwise_squared_distances(rows) if distances is None else distances
    distances.fill_diagonal_(math.inf)
    return distances.sort(dim=1).values[:, :neighbours].sum(dim=1)


def _lowest_scores(finite: FiniteCandidates, num_byzantine: int, keep: int, distances: torch.Tensor | None = None) -> torch.Tensor:
    """Uniform weights (CPU [F]) on the ``keep`` lowest Krum scores, ties to the lower id."""
    count = len(finite.ids)
    weights = torch.zeros(count, dtype=torch.float64)
    if count == 1:
        weights[0] = 1.0
        return weights
    scores = _krum_scores(finite.rows, num_byzantine, distances)
    chosen = scores.sort(stable=True).indices[:keep]
    weights[chosen] = 1.0 / keep
    return weights


def _krum_batched(batch: RoundBatch, settings: Callable[[int, int], tuple[int, int]]) -> list[Aggregate] | None:
    """Krum's or multi-Krum's round for every client of ``batch`` (``settings(c, count)``:
    client ``c``'s ``num_byzantine`` and how many to average of its ``count`` finite
    candidates), each pair of pooled rows measured once; None where the batched path is not
    taken (a model not on the CPU, or summed in two passes alone)."""
    vectors = batch.vectors
    if vectors.device.type != "cpu" or (torch.get_num_threads() > 1 and vectors.shape[1] >= _ONE_PASS):
        return None
    finite = batch.finite().tolist()
    orders = [pooled_order(batch, c, finite) for c in range(len(batch))]
    pairs = {(min(a, b), max(a, b)) for order in orders for i, a in enumerate(order.pooled) for b in order.pooled[i + 1 :]}
    # Every row a client holds, widened to float64 once: for the distances and each client's rows.
    used = sorted({row for order in orders for row in order.pooled})
    place = {row: i for i, row in enumerate(used)}
    wide = vectors.index_select(0, torch.tensor(used, dtype=torch.long)).to(torch.float64)
    measured = pooled_squared_distances(vectors, sorted(pairs), (place, wide))
    out = []
    for c, order in enumerate(orders):
        count = len(order.ids)
        if count == 0:
            out.append(keep_own_pooled(batch, c))
            continue
        rows = wide.index_select(0, torch.tensor([place[row] for row in order.pooled], dtype=torch.long))
        finite_c = FiniteCandidates(ids=order.ids, rows=rows, own=order.own, positions=order.positions)
        num_byzantine, keep = settings(c, count)
        weights = _lowest_scores(finite_c, num_byzantine, keep, _distance_matrix(order, measured, finite_c.rows.dtype))
        out.append(package_for(batch.ids[c], combine_rows(finite_c, weights), by_id(finite_c, weights)))
    return out


def _distance_matrix(order: PooledOrder, measured: dict[tuple[int, int], float], dtype: torch.dtype) -> torch.Tensor:
    """The [F, F] matrix :func:`pairwise_squared_distances` gives for a client's finite rows,
    from the measured pooled pairs."""
    pooled = order.pooled
    count = len(pooled)
    values = [0.0] * (count * count)
    for i, a in enumerate(pooled):
        for j in range(i + 1, count):
            b = pooled[j]
            values[i * count + j] = values[j * count + i] = measured[(a, b) if a < b else (b, a)]
    return torch.tensor(values, dtype=dtype).view(count, count)


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

    def batch_group(self) -> tuple:
        """What :meth:`batched` needs equal across its clients: nothing (each client's
        ``num_byzantine`` is read from its own rule, ``RoundBatch.rules``)."""
        return ()

    def batched(self, batch: RoundBatch) -> list[Aggregate]:
        """Every client's Krum at once, bit for bit its own rule's call on ``batch.one(c)``
        (module notes)."""
        rules = batch.rules or (self,) * len(batch)
        out = _krum_batched(batch, lambda c, count: (rules[c].num_byzantine, 1))
        return [rules[c](batch.one(c)) for c in range(len(batch))] if out is None else out


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
        weights = _lowest_scores(finite, self.num_byzantine, keep=self._keep(count))
        return package_aggregate(inputs, combine_rows(finite, weights), by_id(finite, weights))

    def _keep(self, count: int) -> int:
        keep = count - self.num_byzantine if self.m is None else self.m
        return min(max(keep, 1), count)

    def batch_group(self) -> tuple:
        """As :meth:`Krum.batch_group`: every setting but ``num_byzantine``."""
        return (self.m,)

    def batched(self, batch: RoundBatch) -> list[Aggregate]:
        """Every client's multi-Krum at once, bit for bit its own rule's call on
        ``batch.one(c)`` (module notes)."""
        rules = batch.rules or (self,) * len(batch)
        out = _krum_batched(batch, lambda c, count: (rules[c].num_byzantine, rules[c]._keep(count)))
        return [rules[c](batch.one(c)) for c in range(len(batch))] if out is None else out


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
