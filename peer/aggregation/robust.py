"""Baseline aggregation rules the paper compares DFedReweighting with, and the conventions they
all follow.

Each rule runs at one client over its own half-step model (row 0 of ``inputs.vectors``) and
the models its neighbours sent, and returns an :class:`~peer.aggregation.rules.Aggregate`
exactly like the rules in :mod:`peer.aggregation.rules`:

* Byzantine-robust rules: the coordinate-wise ``Median`` and ``TrimmedMean`` (Yin et al. 2018;
  :mod:`peer.aggregation.coordinate`), the distance-based ``Krum``, ``MultiKrum`` (Blanchard et
  al. 2017) and ``GeometricMedian`` (Pillutla et al. 2022; :mod:`peer.aggregation.distance`),
  and here :class:`Flame` (Nguyen et al. 2022), :class:`Balance` (Fang et al. 2024) and
  :class:`CenteredClipping`;
* fairness baseline: :class:`QFDFL` (q-FFL of Li et al. 2020, applied per client);
* :class:`AccuracyAboveMean`, the selection rule of the authors' earlier code.

Conventions shared with :mod:`peer.aggregation.rules`:

* A row containing NaN/Inf is dropped before any statistic is computed (a median, a distance,
  a cluster) and gets weight 0; the counts a rule uses (``C`` in the formulas below) are the
  counts of *finite* candidates. A hyper-parameter such as ``num_byzantine`` is not reduced
  for dropped rows: nothing says the broken rows were the Byzantine ones.
* If nothing can be weighted the client keeps its own model (weight 1 on ``ids[0]``), even
  when that row is itself non-finite (the client decides what to do then).
* Every rule first puts the finite candidates in increasing id order and computes in that
  order, so the result does not depend on the order of rows 1.. down to the last bit, and
  ties (Krum scores, equal values in a trimmed coordinate, equally large Flame clusters) are
  broken towards the lower id.
* Computation is float64, the model is returned as float32 on the input device, and
  ``weights`` holds every candidate id and sums to 1.

Reported weights: for rules whose model is ``sum_i v_i w_i`` (Krum, multi-Krum, geometric
median, BALANCE, q-FDFL, accuracy-above-mean) they are exactly the ``v_i``. Coordinate-wise
rules (median, trimmed mean) pick a different subset per coordinate, so their weights are the
share of coordinates each candidate contributed; Flame adds clipping and noise on top of the
weighted mean its weights describe. Each docstring says which.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from dataclasses import dataclass

import numpy as np
import torch

from dfedrw.peer.registry import check_choice, check_int, check_real
from dfedrw.peer.aggregation.rules import RULE_REGISTRY, Aggregate, RoundBatch, RoundInputs, finite_rows
from dfedrw.peer.aggregation.tpm import Accuracy
from dfedrw.peer.aggregation.candidates import (
    FiniteCandidates, by_id, combine_rows, finite_by_id, keep_own, keep_own_pooled, package_aggregate, package_for, pooled_finite,
    pooled_order,
)
from dfedrw.peer.aggregation.distance import pooled_dot_products

__all__ = [
    "AccuracyAboveMean",
    "Balance",
    "CenteredClipping",
    "Flame",
    "QFDFL",
]


# ---------------------------------------------------------------- shared helpers


# ---------------------------------------------------------------- coordinate-wise rules


# ---------------------------------------------------------------- distance-based rules


# ---------------------------------------------------------------- Flame


FLAME_CLUSTER_ON = ("updates", "models")


def _noise_seed(seed: int, own_id: int, round_: int) -> int:
    # A digest rather than ``hash()`` so the stream is the same on every platform and Python
    # version; each client and round gets its own stream without any shared RNG state.
    digest = hashlib.blake2b(f"flame/{seed}/{own_id}/{round_}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") & (2**63 - 1)


def cosine_distances(count: int, dots: Callable[[int, int], float]) -> list[list[float]]:
    """The cosine distances ``1 - x_i . x_j / (|x_i| |x_j|)`` of ``count`` rows, clamped to
    [0, 2], from their float64 dot products (``dots(i, j)`` for ``i <= j``; ``dots(i, i)`` the
    squared norm): a symmetric ``count x count`` matrix of Python floats (rows as lists: what
    the clustering reads) with a zero diagonal. A zero row has no direction: distance 1
    (orthogonal) to every other row."""
    norms = [math.sqrt(dots(i, i)) for i in range(count)]
    distances = [[0.0] * count for _ in range(count)]
    for i in range(count):
        row, norm = distances[i], norms[i]
        for j in range(i + 1, count):
            scale = norm * norms[j]
            value = 1.0 - dots(i, j) / scale if scale > 0 else 1.0
            row[j] = distances[j][i] = min(max(value, 0.0), 2.0)
    return distances


def _largest_cluster(distances: list[list[float]], min_cluster_size: int) -> list[bool]:
    """Which rows form the largest HDBSCAN cluster on their cosine ``distances``."""
    count = len(distances)
    labels = hdbscan_labels(distances, min(min_cluster_size, count)).tolist()
    clusters = sorted({label for label in labels if label >= 0})
    if not clusters:
        # HDBSCAN found no structure at all: nothing stands out as an outlier either.
        return [True] * count
    # Largest cluster; equal sizes go to the cluster holding the lowest id (rows are in id
    # order and labels are compared by first occurrence).
    best = min(clusters, key=lambda label: (-labels.count(label), labels.index(label)))
    return [label == best for label in labels]


def hdbscan_labels(distances: np.ndarray | list[list[float]], min_cluster_size: int) -> np.ndarray:
    """The labels ``HDBSCAN(metric="precomputed", min_cluster_size=min_cluster_size,
    min_samples=1, allow_single_cluster=True).fit(distances).labels_`` (-1: noise) of a finite,
    symmetric float64 [n, n] matrix with a zero diagonal (an array, or its rows as lists of
    floats), ``2 <= min_cluster_size <= n``.

    The estimator's fit checks its parameters and its input, then runs four steps of
    scikit-learn's own (mutual reachability, minimum spanning tree, single-linkage tree, labels
    from the condensed tree). Called here directly, on what those checks would pass unchanged,
    they take about half the estimator's time on a dozen candidates. They are private to
    scikit-learn: tests/unit/test_batched_robust_rules.py checks that their labels are the
    estimator's, and where they cannot be imported the estimator itself runs.

    Up to ``_SMALL`` points whose pairwise distances are all different (Flame's dozen
    candidates, except when two of them are the same model), the same four steps run as
    :func:`_small_hdbscan_labels`, in Python on lists: a few times faster at that size, where
    scikit-learn's cost is its calls rather than its arithmetic. With distinct distances
    every choice the steps make (the nearest point, the order of the tree's edges) is
    unique, so the labels are those of the estimator (the same test checks both ways)."""
    count = len(distances)
    if count <= _SMALL:
        values = distances.tolist() if isinstance(distances, np.ndarray) else distances
        upper = [v for i, row in enumerate(values) for v in row[i + 1 :]]
        if len(set(upper)) == len(upper):
            labels = _small_hdbscan_labels(values, min_cluster_size)
            if labels is not None:
                return np.array(labels, dtype=np.intp)
    distances = np.asarray(distances, dtype=np.float64)
    steps = _hdbscan_steps()
    if steps is None:
        # Imported here: scikit-learn is slow to import and only this rule needs it.
        from sklearn import config_context
        from sklearn.cluster import HDBSCAN

        # The parameters are fixed here and the distances finite by construction: scikit-learn's
        # own checks of both are skipped.
        with config_context(assume_finite=True, skip_parameter_validation=True):
            return HDBSCAN(
                metric="precomputed", min_cluster_size=min_cluster_size, min_samples=1, allow_single_cluster=True, copy=True,
            ).fit(distances).labels_
    reachability, spanning_tree, single_linkage, tree_to_labels = steps
    # As the estimator's fit with alpha = 1 and min_samples = 1 (the estimator's defaults for
    # the rest): a copy (copy=True) divided by alpha = 1, mutual reachability at min_samples = 1
    # (core distance 0: the distances themselves), the tree, the labels by excess of mass.
    graph = distances.astype(np.float64, copy=True)
    graph /= 1.0
    graph = reachability(graph, min_samples=1, max_distance=0.0)
    tree = single_linkage(spanning_tree(graph))
    return tree_to_labels(tree, min_cluster_size, "eom", True, 0.0, None)[0]


_SMALL = 32  # points up to which hdbscan_labels runs the steps itself


def _small_hdbscan_labels(distances: list[list[float]], min_cluster_size: int) -> list[int] | None:
    """HDBSCAN's labels (min_samples = 1, excess of mass, a single cluster allowed) of the
    symmetric ``distances`` (lists, zero diagonal, every off-diagonal value different), by the
    steps scikit-learn 1.9 takes; None where its labelling would fail (a point left with no
    label to take), for the caller to hand to scikit-learn. With min_samples = 1 a point's core
    distance is 0, so the mutual reachability graph is the distances themselves."""
    n = len(distances)
    inf = math.inf
    # 1. Minimum spanning tree by Prim's algorithm from point 0; each edge is recorded as
    #    (the point added last, the point added now, the distance at which it joins).
    outside = list(range(1, n))
    best = [inf] * (n - 1)
    edges = []
    current = 0
    for _ in range(n - 1):
        row = distances[current]
        best = [b if b <= row[j] else row[j] for b, j in zip(best, outside)]
        at = min(range(len(best)), key=best.__getitem__)
        new = outside[at]
        edges.append((best[at], current, new))
        del outside[at], best[at]
        current = new
    # 2. Single-linkage tree: the edges by distance (all different), each joining the
    #    clusters of its two ends into cluster n + i.
    parent = [-1] * (2 * n - 1)
    size = [1] * n + [0] * (n - 1)

    def find(x: int) -> int:
        top = x
        while parent[top] != -1:
            top = parent[top]
        while x != top:
            x, parent[x] = parent[x], top
        return top

    linkage = []
    for i, (distance, a, b) in enumerate(sorted(edges)):
        left, right = find(a), find(b)
        merged = n + i
        size[merged] = size[left] + size[right]
        parent[left] = parent[right] = merged
        linkage.append((left, right, distance, size[merged]))

    def levels(node: int):
        """The nodes below ``node`` (itself first), level by level: scikit-learn's breadth-first order."""
        queue = [node]
        while queue:
            yield queue
            queue = [c for x in queue if x >= n for c in linkage[x - n][:2]]

    # 3. Condensed tree: (parent, child, lambda, child size) rows; a split is kept only where
    #    both sides have min_cluster_size points, else the smaller side's points fall out.
    root = 2 * n - 2
    relabel = {root: n}
    next_label = n + 1
    condensed = []
    order = [x for level in levels(root) for x in level]
    ignored = set()
    for node in order:
        if node < n or node in ignored:
            continue
        left, right, distance, _ = linkage[node - n]
        value = 1.0 / distance if distance > 0.0 else inf
        left_count = linkage[left - n][3] if left >= n else 1
        right_count = linkage[right - n][3] if right >= n else 1
        big_left, big_right = left_count >= min_cluster_size, right_count >= min_cluster_size
        if big_left and big_right:
            for child, count in ((left, left_count), (right, right_count)):
                relabel[child] = next_label
                next_label += 1
                condensed.append((relabel[node], relabel[child], value, count))
            continue
        if big_right:
            relabel[right] = relabel[node]
        if big_left:
            relabel[left] = relabel[node]
        for side, big in ((left, big_left), (right, big_right)):
            if big:
                continue
            for level in levels(side):
                ignored.update(level)
                condensed.extend((relabel[node], x, value, 1) for x in level if x < n)
    # 4. Stability of each cluster, then the excess-of-mass selection (the root may be the
    #    one cluster) and the labels.
    birth = {child: value for _, child, value, _ in condensed}
    birth[n] = 0.0
    clusters_found = sorted({p for p, _, _, _ in condensed})
    stability = dict.fromkeys(range(n, max(clusters_found) + 1), 0.0)
    for p, _, value, count in condensed:
        stability[p] += (value - birth[p]) * count
    tree = [(p, c, count) for p, c, _, count in condensed if count > 1]
    children = {}
    for p, c, _ in tree:
        children.setdefault(p, []).append(c)
    selected = dict.fromkeys(sorted(stability, reverse=True), True)
    for node in selected:
        below = children.get(node, [])
        subtree = 0.0
        for c in below:
            subtree += stability[c]
        if subtree > stability[node]:
            selected[node] = False
            stability[node] = subtree
        else:
            queue = list(below)
            while queue:
                for c in queue:
                    selected[c] = False
                queue = [g for c in queue for g in children.get(c, [])]
    clusters = sorted(c for c, keep in selected.items() if keep)
    label_of = {c: i for i, c in enumerate(clusters)}
    up = {c: p for p, c, _, _ in condensed}
    left_at = {c: value for _, c, value, _ in condensed}
    threshold = max((value for p, _, value, _ in condensed if p == n), default=-inf)
    labels = []
    for point in range(n):
        top = up[point]
        while top not in label_of and top != n:
            top = up[top]
        if top != n:
            labels.append(label_of[top])
        elif len(clusters) == 1 and left_at[point] >= threshold:
            if n not in label_of:
                return None
            labels.append(label_of[n])
        else:
            labels.append(-1)
    return labels


@functools.lru_cache(maxsize=1)
def _hdbscan_steps() -> tuple[Callable, ...] | None:
    """The scikit-learn HDBSCAN steps :func:`hdbscan_labels` calls, or None where this
    scikit-learn does not have them where 1.9 has them."""
    try:
        from sklearn.cluster._hdbscan._linkage import mst_from_mutual_reachability
        from sklearn.cluster._hdbscan._reachability import mutual_reachability_graph
        from sklearn.cluster._hdbscan._tree import tree_to_labels
        from sklearn.cluster._hdbscan.hdbscan import _process_mst
    except ImportError:
        return None
    return mutual_reachability_graph, mst_from_mutual_reachability, _process_mst, tree_to_labels


@RULE_REGISTRY.register("flame")
@dataclass(frozen=True)
class Flame:
    """FLAME adapted to decentralized FL: cluster updates, clip to the median norm, add noise.

    Updates are measured from the client's start-of-round model:
    ``u_i = w_i - w_k^t`` (``inputs.reference``; if it is None, the own half-step model row 0
    stands in, making the own update 0, which is cosine distance 1 to every other update).

    1. HDBSCAN (``metric="precomputed"``, ``min_samples=1``, ``allow_single_cluster=True``,
       ``min_cluster_size`` default ``C // 2 + 1``, clamped to ``C``) on the pairwise cosine
       distances ``1 - cos(x_i, x_j)``, where ``x_i`` is the update ``u_i``
       (``cluster_on="updates"``) or the model ``w_i`` (``"models"``, as FLAME's algorithm
       writes it for the clients' local models; in decentralized FL with non-IID data the
       neighbours' updates from the own model point in unrelated directions, their models
       much less so). The largest cluster is accepted, noise points and other clusters
       rejected. If every point is labelled noise, all are accepted; with fewer than 3
       finite candidates clustering is skipped and all are accepted.
    2. ``S_t = median_i ||u_i||`` over all finite updates (mean of the two middle values for
       an even count); ``u_i <- u_i * min(1, S_t / ||u_i||)``.
    3. ``w_k^{t+1} = w_k^t + mean_{i accepted} u_i + N(0, (noise * S_t)^2 I)``, the noise
       drawn (in float32) from a ``torch.Generator`` seeded from ``(seed, own_id, round)``:
       deterministic, different per client and round, no global RNG state.

    Reported weights are ``1/|accepted|`` on the accepted ids and 0 elsewhere: they describe
    the accepted mean; clipping and noise are applied on top, so the model is not
    ``sum_i v_i w_i``. If the reference is non-finite the client keeps its own model.

    Source: Nguyen et al., "FLAME: Taming Backdoors in Federated Learning", USENIX Security
    2022.
    """

    noise: float = 0.001
    seed: int = 0
    min_cluster_size: int | None = None
    cluster_on: str = "updates"

    def __post_init__(self) -> None:
        check_choice("Flame", "cluster_on", self.cluster_on, FLAME_CLUSTER_ON)
        noise = check_real("Flame", "noise", self.noise, nonnegative=True)
        object.__setattr__(self, "noise", noise)
        check_int("Flame", "seed", self.seed)
        if self.min_cluster_size is not None:
            # HDBSCAN itself refuses clusters of one point.
            check_int("Flame", "min_cluster_size", self.min_cluster_size, minimum=2)

    def batch_group(self) -> tuple:
        """What :meth:`batched` needs equal across its clients: every setting but the seed, which
        each client's noise draws from (``RoundBatch.rules``)."""
        return (self.noise, self.min_cluster_size, self.cluster_on)

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        reference = inputs.vectors[0] if inputs.reference is None else inputs.reference
        finite = finite_by_id(inputs)
        model_dots = None
        if self.cluster_on == "models":
            count = len(finite.ids)
            model_dots = pooled_dot_products(finite.rows, [(i, j) for i in range(count) for j in range(i, count)])
        aggregate = self._aggregate(finite, inputs.ids, reference, inputs.round, None, model_dots, tuple(range(len(finite.ids))))
        return keep_own(inputs) if aggregate is None else aggregate

    def batched(self, batch: RoundBatch) -> list[Aggregate]:
        """Every client's round as its own rule's :meth:`__call__` takes it (``batch.rules``:
        Flames of one :meth:`batch_group`, each with its seed), bit for bit: the same arithmetic
        on tensors of the same shapes (each dot product of two models summed on its own, so
        computed once for all the clients holding both), the rows widened to float64 once, the
        pool checked for finite rows once and no per-client inputs built."""
        finite = batch.finite().tolist()
        references_finite = None if batch.references is None else finite_rows(batch.references).tolist()
        orders = [pooled_order(batch, c, finite) for c in range(len(batch))]
        used = sorted({row for order in orders for row in order.pooled})
        place = {row: i for i, row in enumerate(used)}
        wide = batch.vectors.index_select(0, torch.tensor(used, dtype=torch.long, device=batch.vectors.device)).to(torch.float64) if used else None
        model_dots = None
        if self.cluster_on == "models":
            pairs = {(min(a, b), max(a, b)) for order in orders for a in order.pooled for b in order.pooled}
            model_dots = pooled_dot_products(batch.vectors, sorted(pairs), (place, wide)) if pairs else {}
        out = []
        for c, (rows, order) in enumerate(zip(batch.rows, orders, strict=True)):
            if batch.references is None:
                reference, reference_finite = batch.vectors[rows[0]], finite[rows[0]]
            else:
                reference, reference_finite = batch.references[c], references_finite[c]
            picked = wide.index_select(0, torch.tensor([place[r] for r in order.pooled], dtype=torch.long, device=wide.device)) if order.pooled else batch.vectors.new_empty(0, batch.vectors.shape[1], dtype=torch.float64)
            candidates = FiniteCandidates(ids=order.ids, rows=picked, own=order.own, positions=order.positions)
            rule = self if batch.rules is None else batch.rules[c]
            aggregate = rule._aggregate(candidates, batch.ids[c], reference, batch.round, reference_finite, model_dots, order.pooled)
            out.append(keep_own_pooled(batch, c) if aggregate is None else aggregate)
        return out

    def _aggregate(
        self, finite: FiniteCandidates, ids: Sequence[int], reference: torch.Tensor, round_: int, reference_finite: bool | None,
        model_dots: Mapping[tuple[int, int], float] | None, keys: Sequence[int],
    ) -> Aggregate | None:
        """The client's aggregate (``ids``: its candidates' senders, own first); None when it
        keeps its own model. ``reference_finite``: whether ``reference`` is, when the caller
        knows; ``model_dots``: the candidates' dot products (clustering on models), by
        ``keys[i]`` of candidate ``i``, the smaller key first."""
        count = len(finite.ids)
        reference = reference.to(device=finite.rows.device, dtype=torch.float64)
        if reference_finite is None:
            reference_finite = count > 0 and bool(torch.isfinite(reference).all())
        if count == 0 or not reference_finite:
            return None
        updates = finite.rows - reference
        # Each update's squared norm, and (clustering on updates) each pair's product, summed
        # row by row as the models' are.
        update_dots = pooled_dot_products(updates, [(i, j) for i in range(count) for j in range(i, count)]) if (
            self.cluster_on == "updates" and count >= 3) else {(i, i): v for i, v in enumerate((updates * updates).sum(dim=1).tolist())}
        norms = [math.sqrt(update_dots[(i, i)]) for i in range(count)]
        if count < 3:
            accepted = [True] * count
        else:
            default = count // 2 + 1
            size = default if self.min_cluster_size is None else self.min_cluster_size
            if self.cluster_on == "updates" or model_dots is None:
                distances = cosine_distances(count, lambda i, j: update_dots[(i, j)])
            else:
                distances = cosine_distances(count, lambda i, j: model_dots[(min(keys[i], keys[j]), max(keys[i], keys[j]))])
            accepted = _largest_cluster(distances, size)

        ordered = sorted(norms)
        bound = (ordered[(count - 1) // 2] + ordered[count // 2]) / 2  # the median (two middle values: their mean)
        kept = sum(accepted)
        coefficients = [(bound / n if n > bound else 1.0) / kept if ok else 0.0 for n, ok in zip(norms, accepted, strict=True)]
        model = reference + torch.tensor(coefficients, dtype=torch.float64, device=updates.device) @ updates
        scale = self.noise * bound
        if scale > 0:
            generator = torch.Generator().manual_seed(_noise_seed(self.seed, ids[0], round_))
            # Drawn in float32 (torch's float64 normal draw is about five times slower on the
            # CPU), widened exactly; the sum is float64 as the rest.
            drawn = torch.randn(model.shape[0], generator=generator, dtype=torch.float32).to(torch.float64)
            model = model + scale * drawn.to(model.device)
        return package_for(ids, model, {i: 1.0 / kept if ok else 0.0 for i, ok in zip(finite.ids, accepted, strict=True)})


# ---------------------------------------------------------------- BALANCE


@RULE_REGISTRY.register("balance")
@dataclass(frozen=True)
class Balance:
    """BALANCE: accept neighbours close to the own model, then mix them with it.

    Neighbour ``j`` is accepted if
    ``||w_k - w_j|| <= gamma * exp(-kappa * t / T) * ||w_k||``  (``t = round``,
    ``T = total_rounds``; with ``T = 0``, i.e. unknown, the factor is ``exp(0) = 1``), and
    ``w_k^{t+1} = alpha * w_k + (1 - alpha) * mean_{j accepted} w_j``, or ``w_k`` if none is.

    ``w_k`` is the own half-step model (row 0). ``alpha`` is the weight of the own model, as
    in the design brief's ``w_k = a*w_k + (1-a)*mean(accepted)`` with the paper's tuned
    ``a = 0.1, gamma = 2, kappa = 1``. Weights: ``alpha`` on the own id and
    ``(1 - alpha)/|accepted|`` on each accepted neighbour (1 on the own id if none is). With a
    non-finite own model there is no radius to measure, so the client keeps its own model.

    Source: Fang et al., "Byzantine-Robust Decentralized Federated Learning", ACM CCS 2024.
    """

    gamma: float = 2.0
    kappa: float = 1.0
    alpha: float = 0.1

    def __post_init__(self) -> None:
        # gamma = 0 would accept only exact copies of the own model: never what is meant.
        gamma = check_real("Balance", "gamma", self.gamma, positive=True)
        kappa = check_real("Balance", "kappa", self.kappa, nonnegative=True)
        object.__setattr__(self, "gamma", gamma)
        object.__setattr__(self, "kappa", kappa)
        alpha = check_real("Balance", "alpha", self.alpha, nonnegative=True)
        if alpha > 1.0:
            raise ValueError(f"Balance: alpha must be in [0, 1], got {self.alpha!r}")
        object.__setattr__(self, "alpha", alpha)

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        aggregate = self._aggregate(finite_by_id(inputs), inputs.ids, inputs.round, inputs.total_rounds)
        return keep_own(inputs) if aggregate is None else aggregate

    def batched(self, batch: RoundBatch) -> list[Aggregate]:
        """As :meth:`Flame.batched`: each client's own arithmetic, bit for bit :meth:`__call__`."""
        finite = batch.finite().tolist()
        out = []
        for c in range(len(batch)):
            aggregate = self._aggregate(pooled_finite(batch, c, finite), batch.ids[c], batch.round, batch.total_rounds)
            out.append(keep_own_pooled(batch, c) if aggregate is None else aggregate)
        return out

    def _aggregate(self, finite: FiniteCandidates, ids: Sequence[int], round_: int, total_rounds: int) -> Aggregate | None:
        """The client's aggregate (``ids``: its candidates' senders, own first); None when its
        own model is non-finite and it keeps it."""
        if finite.own is None:
            return None
        own = finite.rows[finite.own]
        progress = round_ / total_rounds if total_rounds > 0 else 0.0
        radius = self.gamma * math.exp(-self.kappa * progress) * float(
            torch.linalg.vector_norm(own)
        )
        distances = torch.linalg.vector_norm(finite.rows - own, dim=1).cpu()
        accepted = distances <= radius
        accepted[finite.own] = False
        weights = torch.zeros(len(finite.ids), dtype=torch.float64)
        if bool(accepted.any()):
            weights[accepted] = (1.0 - self.alpha) / int(accepted.sum())
            weights[finite.own] = self.alpha
        else:
            weights[finite.own] = 1.0
        return package_for(ids, combine_rows(finite, weights), by_id(finite, weights))


# ---------------------------------------------------------------- centered clipping


@RULE_REGISTRY.register("centered_clipping")
@dataclass(frozen=True)
class CenteredClipping:
    """Centered clipping: move from the own model by the mean of the clipped differences.

    ``v_0 = w_k`` (the own half-step model, row 0), then ``iterations`` times
    ``v <- v + 1/C * sum_i clip_tau(w_i - v)`` with ``clip_tau(z) = z * min(1, tau / ||z||)``,
    over the ``C`` finite candidates (own model included); ``w_k^{t+1} = v``.

    Each step is ``v <- (1 - sum_i s_i / C) v + sum_i (s_i / C) w_i`` with
    ``s_i = min(1, tau / ||w_i - v||)`` in ``[0, 1]``, so ``v`` stays a convex combination of
    the candidates and the reported weights are exactly its coefficients. A candidate within
    ``tau`` of ``v`` pulls with its full difference; a far one (a Byzantine model) moves ``v``
    by at most ``tau / C``. With a non-finite own model there is no centre, so the client
    keeps its own model.

    Source: Karimireddy, He and Jaggi, "Learning from History for Byzantine Robust
    Optimization", ICML 2021 (Algorithm 2, centered clipping, started from the previous
    aggregate; in DFL the client's own model stands in for it).
    """

    tau: float = 10.0
    iterations: int = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "tau", check_real("CenteredClipping", "tau", self.tau, positive=True))
        check_int("CenteredClipping", "iterations", self.iterations, minimum=1)

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        finite = finite_by_id(inputs)
        if finite.own is None:
            return keep_own(inputs)
        count = len(finite.ids)
        coefficients = torch.zeros(count, dtype=torch.float64)
        coefficients[finite.own] = 1.0
        for _ in range(self.iterations):
            centre = combine_rows(finite, coefficients)
            distances = torch.linalg.vector_norm(finite.rows - centre, dim=1).cpu()
            shares = torch.where(distances > self.tau, self.tau / distances, torch.ones_like(distances))
            coefficients = (1.0 - float(shares.sum()) / count) * coefficients + shares / count
        return package_aggregate(inputs, combine_rows(finite, coefficients), by_id(finite, coefficients))


# ---------------------------------------------------------------- q-FDFL


@RULE_REGISTRY.register("qfdfl")
@dataclass(frozen=True)
class QFDFL:
    """q-FDFL: the q-FedAvg step of q-FFL, run by each client with its own start model as "global".

    With ``L = 1 / lr``, reference ``w = w_k^t`` and each candidate's declared local loss
    ``F_j`` (``inputs.declared_losses``):
    ``dw_j = L (w - w_j)``,  ``Delta_j = F_j^q dw_j``,
    ``h_j = q F_j^(q-1) ||dw_j||^2 + L F_j^q``,
    ``w_k^{t+1} = w - sum_j Delta_j / sum_j h_j``.

    Equivalently ``w_k^{t+1} = (1 - sum_j c_j) w + sum_j c_j w_j`` with
    ``c_j = L F_j^q / sum_i h_i``; since ``h_j >= L F_j^q``, ``sum_j c_j <= 1`` and every
    coefficient is >= 0. Reported weights are ``c_j`` per candidate, with the remainder
    ``1 - sum_j c_j`` added to the own id: "own" then stands for the start-of-round model and
    the own half-step model together. ``q = 0`` gives the plain mean of the candidates.

    Candidates whose declared loss is missing or non-finite are dropped; finite losses are
    clamped to ``>= 1e-12`` (``F^(q-1)`` is undefined at 0). Losses are whatever senders
    declared: a Byzantine sender can claim any value. If no candidate is usable, the reference
    is non-finite, or a declared loss is so large (or so small) that ``sum_j h_j`` overflows or
    vanishes, the client keeps its own model.

    Source: Li, Sanjabi, Beirami and Smith, "Fair Resource Allocation in Federated Learning",
    ICLR 2020 (q-FedAvg, Algorithm 2).
    """

    q: float = 0.1
    lr: float = 0.01

    def __post_init__(self) -> None:
        q = check_real("QFDFL", "q", self.q, nonnegative=True)
        if q > 1000.0:
            # loss ** (q + 1) overflows float64 long before q = 1000 matters.
            raise ValueError(f"QFDFL: q must be <= 1000, got {self.q!r}")
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "lr", check_real("QFDFL", "lr", self.lr, positive=True))

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        if inputs.reference is None:
            raise ValueError(
                "QFDFL: inputs.reference is None; q-FFL steps from the client's start-of-round "
                "model w_k^t, which the client must supply"
            )
        if inputs.declared_losses is None:
            raise ValueError(
                "QFDFL: inputs.declared_losses is None; q-FFL weights candidates by their "
                "declared training loss, one value per id (NaN where unknown)"
            )
        finite = inputs.finite_list()
        positions = sorted((i for i, ok in enumerate(finite) if ok), key=lambda i: inputs.ids[i])
        (step,) = self._steps(inputs.vectors, [positions], inputs.reference[None], [[inputs.declared_losses[i] for i in positions]])
        if step is None:
            return keep_own(inputs)
        model, coefficients, remainder = step
        weights = dict(zip((inputs.ids[i] for i in positions), coefficients))
        weights[inputs.own_id] = weights.get(inputs.own_id, 0.0) + remainder
        return package_aggregate(inputs, model, weights)

    def batched(self, batch: RoundBatch) -> list[Aggregate]:
        """Every client's step as :meth:`__call__` takes it, without per-client inputs: each
        run's clients (a batch of runs) take their steps in products of their own, the ones the
        run has alone; the pool is checked for finite rows once."""
        if batch.references is None or batch.declared_losses is None:
            return [self(batch.one(c)) for c in range(len(batch))]
        finite_pool = batch.finite().tolist()
        orders = [pooled_order(batch, c, finite_pool) for c in range(len(batch))]
        by_run: dict[Any, list[int]] = {}
        for c in range(len(batch)):
            by_run.setdefault(None if batch.runs is None else batch.runs[c], []).append(c)
        out: list[Aggregate | None] = [None] * len(batch)
        for members in by_run.values():
            steps = self._steps(
                batch.vectors, [orders[c].pooled for c in members], batch.references[members],
                [tuple(batch.declared_losses[c][i] for i in orders[c].positions) for c in members],
            )
            for c, step in zip(members, steps, strict=True):
                ids = batch.ids[c]
                if step is None:
                    out[c] = keep_own_pooled(batch, c)
                    continue
                model, coefficients, remainder = step
                weights = dict(zip(orders[c].ids, coefficients))
                weights[ids[0]] = weights.get(ids[0], 0.0) + remainder
                total = math.fsum(weights.values())
                out[c] = Aggregate(model=model, weights={s: weights.get(s, 0.0) / total for s in ids})
        return out

    def _steps(
        self, vectors: torch.Tensor, rows: Sequence[Sequence[int]], references: torch.Tensor, declared: Sequence[Sequence[float]],
    ) -> list[tuple[torch.Tensor, list[float], float] | None]:
        """The q-FFL steps of some clients: client ``c`` steps from ``references[c]`` with its
        finite candidates ``vectors[rows[c]]`` (in id order), which declared the losses
        ``declared[c]``. Per client: (its float32 model, each candidate's coefficient, the
        remainder on the reference), or None when it keeps its own model.

        In float64, as products over all of these clients: the distances
        ``||w_j - w||^2 = ||w||^2 + ||w_j||^2 - 2 w . w_j`` from one product of the references and
        the rows, and every client's ``sum_j c_j w_j`` from one more (plus ``(1 - sum_j c_j) w``);
        the coefficients, a handful per client, are Python floats."""
        results: list[tuple[torch.Tensor, list[float], float] | None] = [None] * len(rows)
        wide = references.to(dtype=torch.float64)
        # A reference is finite exactly when its squared norm is (from float32 values it
        # cannot overflow in float64).
        ref_squares = (wide * wide).sum(1).tolist()
        stepping = [c for c in range(len(rows)) if math.isfinite(ref_squares[c]) and any(math.isfinite(x) for x in declared[c])]
        used = sorted({row for c in stepping for row in rows[c]})
        if not used:
            return results
        place = {row: i for i, row in enumerate(used)}
        pool = vectors.index_select(0, torch.tensor(used, dtype=torch.long, device=vectors.device)).to(torch.float64)
        refs = wide[stepping].to(pool.device) if len(stepping) < len(rows) else wide.to(pool.device)
        products = (refs @ pool.t()).tolist()
        pool_squares = (pool * pool).sum(1).tolist()
        mixing = [0.0] * (len(stepping) * len(used))
        remainders = [0.0] * len(stepping)
        steps = {}
        for i, c in enumerate(stepping):
            columns = [place[row] for row in rows[c]]
            own = ref_squares[c]
            distances = [math.sqrt(max(0.0, own + pool_squares[j] - 2.0 * products[i][j])) for j in columns]
            coefficients = self._coefficients(declared[c], distances)
            if coefficients is None:
                continue
            remainders[i] = max(0.0, 1.0 - math.fsum(coefficients))
            for j, value in zip(columns, coefficients, strict=True):
                mixing[i * len(used) + j] = value
            steps[c] = (i, coefficients, remainders[i])
        if not steps:
            return results
        matrix = torch.tensor(mixing, dtype=torch.float64).view(len(stepping), len(used)).to(pool.device)
        models = (matrix @ pool).add_(refs * torch.tensor(remainders, dtype=torch.float64, device=pool.device)[:, None])
        models = models.to(torch.float32).cpu()
        for c, (i, coefficients, remainder) in steps.items():
            results[c] = (models[i], coefficients, remainder)
        return results

    def _coefficients(self, declared: Sequence[float], distances: Sequence[float]) -> list[float] | None:
        """``c_j = L F_j^q / sum_i h_i`` per candidate (0 where the declared loss is not
        finite), or None when ``sum_i h_i`` is not a positive finite number (a declared loss
        whose power overflows or underflows): the client then keeps its own model."""
        lipschitz = 1.0 / self.lr
        numerators, curvatures = [], []
        for x, distance in zip(declared, distances, strict=True):
            if not math.isfinite(x):
                numerators.append(0.0)
                continue
            loss = max(x, 1e-12)  # F^(q-1) is undefined at 0
            try:
                powered = loss**self.q
            except OverflowError:
                return None
            step = distance * lipschitz
            # q * F^(q-1) is written as q * F^q / F so q = 0 gives exactly 0, not 0 * huge.
            curvatures.append(self.q * powered / loss * (step * step) + lipschitz * powered)
            numerators.append(lipschitz * powered)
        try:
            total = math.fsum(curvatures)
        except OverflowError:
            return None
        if not (math.isfinite(total) and total > 0.0):
            return None
        return [n / total for n in numerators]


# ---------------------------------------------------------------- accuracy above mean


@RULE_REGISTRY.register("acc_above_mean")
@dataclass(frozen=True)
class AccuracyAboveMean:
    """Keep the own model and every neighbour at least as accurate as the candidates' mean.

    ``a_i = Acc(w_i, A_k)``,  ``mu = mean_i a_i``,
    ``S = {k} | {j : a_j >= mu}``,  ``w_k^{t+1} = 1/|S| * sum_{i in S} w_i``.

    The mean is over candidates with a finite accuracy (an exactly rounded sum, so it does not
    depend on the order); a neighbour whose accuracy is non-finite is not kept, the own model
    always is (when its row is finite). ``Aggregate.scores`` holds the accuracies (NaN for
    rows that were not evaluated because they are non-finite). Uniform weight on ``S``.

    Source: the selection rule of the DFedReweighting authors' earlier code, the
    accuracy-based special case of the paper's eq. (strategy2inbzt) with uniform weights.
    """

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        if inputs.evaluate is None:
            raise ValueError(
                "AccuracyAboveMean: inputs.evaluate is None; this rule scores candidates on "
                "the client's auxiliary data and needs an evaluate callable"
            )
        finite = finite_by_id(inputs)
        if not finite.ids:
            return keep_own(inputs)
        accuracy = Accuracy()(finite.rows.to(inputs.vectors.dtype), inputs.evaluate)
        scores = by_id(finite, accuracy)
        measured = [a for a in accuracy.tolist() if math.isfinite(a)]
        keep = torch.zeros(len(finite.ids), dtype=torch.bool)
        if measured:
            mean = math.fsum(measured) / len(measured)
            keep = torch.isfinite(accuracy) & (accuracy >= mean)
        if finite.own is not None:
            keep[finite.own] = True
        if not bool(keep.any()):
            return keep_own(inputs, scores)
        weights = keep.to(torch.float64) / int(keep.sum())
        return package_aggregate(inputs, combine_rows(finite, weights), by_id(finite, weights), scores)
