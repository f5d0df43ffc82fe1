"""FLAME (Nguyen et al. 2022) adapted to decentralized FL, with the HDBSCAN clustering it runs
on the candidates' cosine distances (conventions: :mod:`peer.aggregation.baselines`)."""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from dfedrw.peer.checked import Checked
from dfedrw.peer.registry import check_choice, check_int, check_real
from dfedrw.peer.aggregation.rules import RULE_REGISTRY, Aggregate, BatchOfOne, RoundBatch, finite_rows
from dfedrw.peer.aggregation.candidates import FiniteCandidates, keep_own_pooled, package_for, pooled_order
from dfedrw.peer.aggregation.distance import gram

__all__ = ["Flame"]


FLAME_CLUSTER_ON = ("updates", "models")


def _noise_seed(seed: int, own_id: int, round_: int) -> int:
    # A digest rather than ``hash()`` so the stream is the same on every platform and Python
    # version; each client and round gets its own stream without any shared RNG state.
    digest = hashlib.blake2b(f"flame/{seed}/{own_id}/{round_}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") & (2**63 - 1)


def cosine_distances(count: int, dots: Callable[[int, int], float]) -> list[list[float]]:
    """The cosine distances ``1 - x_i . x_j / (|x_i| |x_j|)`` of ``count`` rows, clamped to [0, 2],
    from their float64 dot products (``dots(i, j)`` for ``i <= j``; ``dots(i, i)`` the squared
    norm): rows of Python floats (what the clustering reads), symmetric, with a zero diagonal. A
    zero row has no direction: distance 1 (orthogonal) to every other row."""
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

    The estimator's fit checks its parameters and input, then runs four private steps of
    scikit-learn's (mutual reachability, minimum spanning tree, single-linkage tree, labels from
    the condensed tree); called directly, on what those checks would pass unchanged, they take
    about half its time on a dozen candidates. tests/unit/test_batched_robust_rules.py checks
    their labels are the estimator's; where they cannot be imported the estimator itself runs.

    Up to ``_SMALL`` points whose pairwise distances all differ (Flame's dozen candidates, unless
    two are the same model), :func:`_small_hdbscan_labels` runs the same steps in Python on lists,
    a few times faster at that size, where scikit-learn's cost is its calls. With distinct
    distances every choice the steps make (the nearest point, the order of the tree's edges) is
    unique, so the labels are the estimator's (the same test checks both ways)."""
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

        # Fixed parameters, finite distances by construction: scikit-learn's checks are skipped.
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
    """HDBSCAN's labels (min_samples = 1, so core distance 0 and the distances are the mutual
    reachability graph; excess of mass; a single cluster allowed) of the symmetric ``distances``
    (lists, zero diagonal, off-diagonal values all different), by scikit-learn 1.9's steps; None
    where its labelling would fail (a point left no label): the caller then asks scikit-learn."""
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
class Flame(BatchOfOne, Checked):
    """FLAME adapted to decentralized FL: cluster updates, clip to the median norm, add noise.

    Updates are measured from the client's start-of-round model, ``u_i = w_i - w_k^t``
    (``inputs.reference``; if None, row 0 stands in: the own update is 0, cosine distance 1 to all).

    1. HDBSCAN (``metric="precomputed"``, ``min_samples=1``, ``allow_single_cluster=True``,
       ``min_cluster_size`` default ``C // 2 + 1``, clamped to ``C``) on the pairwise cosine
       distances ``1 - cos(x_i, x_j)`` of the updates ``x_i = u_i`` (``cluster_on="updates"``)
       or the models ``x_i = w_i`` (``"models"``, as FLAME's algorithm writes it for local
       models; in decentralized FL with non-IID data the neighbours' updates from the own model
       point in unrelated directions, their models much less so). The largest cluster is
       accepted, noise and other clusters rejected; if every point is noise, or fewer than 3
       candidates are finite (no clustering), all are accepted.
    2. ``S_t = median_i ||u_i||`` over all finite updates (mean of the two middle values for
       an even count); ``u_i <- u_i * min(1, S_t / ||u_i||)``.
    3. ``w_k^{t+1} = w_k^t + mean_{i accepted} u_i + N(0, (noise * S_t)^2 I)``, the noise
       drawn (in float32) from a ``torch.Generator`` seeded from ``(seed, own_id, round)``:
       deterministic, different per client and round, no global RNG state.

    Reported weights are ``1/|accepted|`` on the accepted ids and 0 elsewhere: they describe
    the accepted mean; clipping and noise are applied on top, so the model is not
    ``sum_i v_i w_i``. If the reference is non-finite the client keeps its own model.

    Source: Nguyen et al., "FLAME: Taming Backdoors in Federated Learning", USENIX Security 2022.

    Written once, over a batch (:class:`BatchOfOne`): :meth:`batched` hands ``_aggregate`` each
    client's rows from the round's pool, widened to float64 once for all clients: 1.46x faster
    than a batch of one per client (``python bench/rules_batched.py``, this machine).
    """

    noise: float = 0.001
    seed: int = 0
    min_cluster_size: int | None = None
    cluster_on: str = "updates"

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        check_choice("Flame", "cluster_on", s.cluster_on, FLAME_CLUSTER_ON)
        noise = check_real("Flame", "noise", s.noise, nonnegative=True)
        s.noise = noise
        check_int("Flame", "seed", s.seed)
        if s.min_cluster_size is not None:
            # HDBSCAN itself refuses clusters of one point.
            check_int("Flame", "min_cluster_size", s.min_cluster_size, minimum=2)

    def batch_group(self) -> tuple:
        """What :meth:`batched` needs equal across its clients: every setting but the seed, which
        each client's noise draws from (``RoundBatch.rules``)."""
        return (self.noise, self.min_cluster_size, self.cluster_on)

    def batched(self, batch: RoundBatch) -> list[Aggregate]:
        """Every client's round as its own rule takes it in a batch of one (``batch.rules``:
        Flames of one :meth:`batch_group`, each with its seed), bit for bit: the same arithmetic
        on the same shapes, the pool checked for finite rows once, no per-client inputs built."""
        finite = batch.finite().tolist()
        references_finite = None if batch.references is None else finite_rows(batch.references).tolist()
        orders = [pooled_order(batch, c, finite) for c in range(len(batch))]
        used = sorted({row for order in orders for row in order.pooled})
        place = {row: i for i, row in enumerate(used)}
        wide = batch.vectors.index_select(0, torch.tensor(used, dtype=torch.long, device=batch.vectors.device)).to(torch.float64) if used else None
        out = []
        for c, (rows, order) in enumerate(zip(batch.rows, orders, strict=True)):
            if batch.references is None:
                reference, reference_finite = batch.vectors[rows[0]], finite[rows[0]]
            else:
                reference, reference_finite = batch.references[c], references_finite[c]
            picked = wide.index_select(0, torch.tensor([place[r] for r in order.pooled], dtype=torch.long, device=wide.device)) if order.pooled else batch.vectors.new_empty(0, batch.vectors.shape[1], dtype=torch.float64)
            candidates = FiniteCandidates(ids=order.ids, rows=picked, own=order.own, positions=order.positions)
            rule = self if batch.rules is None else batch.rules[c]
            aggregate = rule._aggregate(candidates, batch.ids[c], reference, batch.round, reference_finite)
            out.append(keep_own_pooled(batch, c) if aggregate is None else aggregate)
        return out

    def _aggregate(
        self, finite: FiniteCandidates, ids: Sequence[int], reference: torch.Tensor, round_: int, reference_finite: bool,
    ) -> Aggregate | None:
        """The client's aggregate (``ids``: its candidates' senders, own first); None when it
        keeps its own model. ``reference_finite``: whether ``reference`` is."""
        count = len(finite.ids)
        reference = reference.to(device=finite.rows.device, dtype=torch.float64)
        if count == 0 or not reference_finite:
            return None
        updates = finite.rows - reference
        # Each update's norm, its squares summed row by row.
        norms = [math.sqrt(v) for v in (updates * updates).sum(dim=1).tolist()]
        if count < 3:
            accepted = [True] * count
        else:
            default = count // 2 + 1
            size = default if self.min_cluster_size is None else self.min_cluster_size
            # The cosine distances of what is clustered, from its Gram matrix (one product).
            dots = gram(updates if self.cluster_on == "updates" else finite.rows)
            accepted = _largest_cluster(cosine_distances(count, lambda i, j: dots[i][j]), size)

        ordered = sorted(norms)
        bound = (ordered[(count - 1) // 2] + ordered[count // 2]) / 2  # the median (two middle values: their mean)
        kept = sum(accepted)
        coefficients = [(bound / n if n > bound else 1.0) / kept if ok else 0.0 for n, ok in zip(norms, accepted, strict=True)]
        model = reference + torch.tensor(coefficients, dtype=torch.float64, device=updates.device) @ updates
        scale = self.noise * bound
        if scale > 0:
            generator = torch.Generator().manual_seed(_noise_seed(self.seed, ids[0], round_))
            # Drawn in float32 (torch's float64 normal draw is ~5x slower on CPU), widened exactly.
            drawn = torch.randn(model.shape[0], generator=generator, dtype=torch.float32).to(torch.float64)
            model = model + scale * drawn.to(model.device)
        return package_for(ids, model, {i: 1.0 / kept if ok else 0.0 for i, ok in zip(finite.ids, accepted, strict=True)})
