"""Coordinate-wise rules: the median and the trimmed mean (Yin et al., ICML 2018), each
coordinate on its own (conventions: :mod:`peer.aggregation.baselines`).

Both are written once, over a batch (a client's call is a batch of one), and give every client
what ``rule(batch.one(c))`` gives, bit for bit. Clients with the same number of finite candidates
are sorted together, every coordinate of every client a column of one array, by a sorting network
(elementwise minima and maxima: :func:`sorted_columns`) in the models' own dtype. Any correct sort
puts the same bits in each place except where equal values differ in their bits (-0.0 and +0.0):
the columns holding a -0.0 are sorted again as numpy sorts the float64 rows. Ranks, shares and
counts are comparisons, blind to the sign of zero; sums over candidates run per client in float64.
Columns are sorted on the CPU (a GPU model copied there; another float dtype widened to float64,
exactly), the model handed back on the candidates' device.
"""

from __future__ import annotations
import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
import numpy as np
import torch
from dfedrw.peer.checked import Checked
from dfedrw.peer.aggregation.rules import RULE_REGISTRY, ToleratesByzantine, Aggregate, BatchOfOne, RoundBatch
from dfedrw.peer.aggregation.candidates import PooledOrder, keep_own_pooled, package_for, pooled_order


def _ranked_in(rows: torch.Tensor, ordered: torch.Tensor, low: int, high: int) -> torch.Tensor:
    """Which entries of ``rows`` (``ordered``: ``rows`` sorted along dim 0) a stable sort along
    dim 0 ranks in ``[low, high)``, from each entry's stable rank ``#{j: x_j < x_i} + #{j < i: x_j ==
    x_i}``. Only entries equal to a bound need it: the count below that bound plus their place
    among the equal entries (dim 0 is id order, so equal values are kept lower id first)."""
    first, last = ordered[low], ordered[high - 1]
    kept = (rows > first) & (rows < last)
    for bound in (first, last):
        equal = rows == bound
        rank = (rows < bound).sum(dim=0) + equal.cumsum(dim=0) - 1
        kept |= equal & (rank >= low) & (rank < high)
    return kept


# ---------------------------------------------------------------- batched sorting

# Up to this many candidates a sorting network (O(n log^2 n) passes over all the columns at
# once) beats numpy's sort of each column (about 4x for 9 rows of 10 clients' 7850 coordinates,
# float32, one core); beyond, numpy's sort.
_NETWORK_MAX = 32


@functools.lru_cache(maxsize=None)
def sorting_network(count: int, wanted: tuple[int, ...] | None = None) -> tuple[tuple[int, int], ...]:
    """Batcher's odd-even merge sort for ``count`` wires as compare-exchanges ``(i, j)``, ``i < j``
    (``i`` gets the minimum): the network for the next power of two without the comparators that
    touch a wire ``>= count`` (those wires hold +inf: they never move). ``wanted``: only the
    comparators the wires ``wanted`` depend on (only those wires end sorted)."""
    size = 1
    while size < count:
        size *= 2
    pairs = []
    p = 1
    while p < size:
        k = p
        while k >= 1:
            for j in range(k % p, size - k, 2 * k):
                for i in range(min(k, size - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    pairs = [(i, j) for i, j in pairs if j < count]
    if wanted is None:
        return tuple(pairs)
    needed, kept = set(wanted), []
    for i, j in reversed(pairs):
        if i in needed or j in needed:
            kept.append((i, j))
            needed |= {i, j}
    return tuple(reversed(kept))


def sorted_columns(values: np.ndarray, wanted: Sequence[int] | None = None) -> list[np.ndarray]:
    """Row ``r`` of ``values`` ([n, N], finite) sorted along dim 0, for every ``r`` in ``wanted``
    (all rows if None; the others in no particular order), bit for bit as any sort puts them, but
    for the order of -0.0 and +0.0 (see :func:`signed_zero_columns`)."""
    count = values.shape[0]
    if count > _NETWORK_MAX:
        ordered = np.sort(values, axis=0)
        return [ordered[r] for r in range(count)]
    rows = [values[r].copy() for r in range(count)]
    spare = np.empty_like(values[0]) if count > 1 else None
    for i, j in sorting_network(count, None if wanted is None else tuple(sorted(set(wanted)))):
        np.minimum(rows[i], rows[j], out=spare)
        np.maximum(rows[i], rows[j], out=rows[j])
        rows[i], spare = spare, rows[i]
    return rows


def signed_zero_columns(values: np.ndarray) -> np.ndarray:
    """Indices of the columns of ``values`` ([n, N], float32 or float64) holding a -0.0: the
    only columns whose sorted values may differ in their bits from one sort to another."""
    bits = values.view(np.uint32 if values.dtype == np.float32 else np.uint64)
    sign = np.uint32(1 << 31) if values.dtype == np.float32 else np.uint64(1 << 63)
    return np.flatnonzero((bits == sign).any(axis=0))


def _sorted_as_numpy(values: np.ndarray, ordered: list[np.ndarray], wanted: Sequence[int]) -> None:
    """Put into the rows ``wanted`` of ``ordered`` (from :func:`sorted_columns`) the values
    numpy's sort of the float64 rows gives in the columns where another sort could put a -0.0
    and a +0.0 the other way round (cast back: the values are ``values``' own)."""
    columns = signed_zero_columns(values)
    if columns.size:
        exact = np.sort(values[:, columns].astype(np.float64), axis=0)
        for r in wanted:
            ordered[r][columns] = exact[r]


@dataclass(frozen=True)
class _Group:
    """Clients with ``count`` finite candidates each, as columns: ``values[i, b * D + d]``
    is coordinate ``d`` of the ``i``-th finite candidate (id order) of ``members[b]``."""

    count: int
    members: list[int]
    orders: list[PooledOrder]
    values: np.ndarray  # [count, len(members) * D] in the models' dtype


def _coordinate_groups(batch: RoundBatch, order_by: Callable[[int], int] | None = None) -> tuple[list[Aggregate | None], list[_Group], int]:
    """(every client's aggregate, filled in for the clients without a finite candidate, each
    keeping its own model; the others grouped by their count; the model's width).
    ``order_by(c)``: within a group, members in increasing order of it (ties in client order)."""
    finite = batch.finite().tolist()
    out: list[Aggregate | None] = [None] * len(batch)
    by_count: dict[int, list[tuple[int, PooledOrder]]] = {}
    for c in range(len(batch)):
        order = pooled_order(batch, c, finite)
        if order.ids:
            by_count.setdefault(len(order.ids), []).append((c, order))
        else:
            out[c] = keep_own_pooled(batch, c)
    groups = []
    width = batch.vectors.shape[1]
    for count, entries in by_count.items():
        if order_by is not None:
            entries.sort(key=lambda entry: order_by(entry[0]))
        index = torch.tensor([[order.pooled[i] for _, order in entries] for i in range(count)], dtype=torch.long)
        values = batch.vectors.index_select(0, index.view(-1).to(batch.vectors.device)).cpu()
        if values.dtype not in (torch.float32, torch.float64):
            values = values.to(torch.float64)
        values = values.view(count, len(entries) * width).numpy()
        groups.append(_Group(count, [c for c, _ in entries], [order for _, order in entries], values))
    return out, groups, width


def _kept_columns(values: np.ndarray, ordered: list[np.ndarray], low: int, high: int) -> np.ndarray:
    """Which entries of the columns ``values`` ([n, N], sorted as ``ordered``: the rows of
    :func:`sorted_columns`) a stable sort along dim 0 ranks in ``[low, high)``, in numpy (about 4x
    torch's speed here). Every entry from the smallest to the largest kept value is kept, unless a
    value at a bound is also ranked outside: only those tied columns need :func:`_ranked_in`."""
    first, last = ordered[low], ordered[high - 1]
    kept = (values >= first) & (values <= last)
    tied = np.zeros(first.shape, dtype=bool)
    if low > 0:
        tied |= ordered[low - 1] == first
    if high < values.shape[0]:
        tied |= ordered[high] == last
    columns = np.flatnonzero(tied)
    if columns.size:
        sorted_tied = torch.from_numpy(np.stack([row[columns] for row in ordered]))
        kept[:, columns] = _ranked_in(torch.from_numpy(values[:, columns]), sorted_tied, low, high).numpy()
    return kept


def _shares(values: np.ndarray, members: int, width: int) -> list[list[float]]:
    """Per member and candidate, the count of True in ``values`` ([n, members * width]) over the
    member's ``width`` coordinates, as floats (what the rules report)."""
    count = values.shape[0]
    # Counts of ones: exact in any order and any integer type that holds ``width``; a narrow
    # one sums several times faster than torch's int64 sum of booleans.
    counter = np.uint16 if width <= np.iinfo(np.uint16).max else np.int64
    counts = values.view(np.uint8).reshape(count, members, width).sum(axis=2, dtype=counter).T.tolist()
    return [[float(n) for n in client] for client in counts]


@RULE_REGISTRY.register("median")
@dataclass(frozen=True)
class Median(BatchOfOne, Checked):
    """Coordinate-wise median of the finite candidates (own model included).

    ``w_k^{t+1}[d] = median_i w_i[d]``; for an even count the mean of the two middle values,
    i.e. ``torch.quantile(q=0.5, interpolation="linear")`` semantics.

    Reported weight of candidate ``i``: the number of coordinates at which ``w_i[d]`` is one of
    the (one or two) values the median takes, normalised to sum 1 (0 for a model never in the
    middle, e.g. a far Byzantine one). The model is not ``sum_i v_i w_i`` for these weights.

    Source: Yin et al., "Byzantine-Robust Distributed Learning: Towards Optimal Statistical
    Rates", ICML 2018.

    Written once, over a batch (:class:`BatchOfOne`): :meth:`batched` sorts the columns of the
    clients with one number of finite candidates in one call and takes each one's middle values:
    1.9x faster than a batch of one per client (``python bench/rules_batched.py``, this machine).
    """

    def batched(self, batch: RoundBatch) -> list[Aggregate]:
        """Every client's median at once (see the module's notes)."""
        out, groups, width = _coordinate_groups(batch)
        for group in groups:
            middle = ((group.count - 1) // 2, group.count // 2)
            ordered = sorted_columns(group.values, middle)
            _sorted_as_numpy(group.values, ordered, middle)
            low, high = ordered[middle[0]], ordered[middle[1]]
            # (low + high) / 2 in float64: elementwise, the same bits in any shape.
            models = ((torch.from_numpy(low).to(torch.float64) + torch.from_numpy(high).to(torch.float64)) / 2).view(len(group.members), width)
            hits = _shares((group.values == low) | (group.values == high), len(group.members), width)
            for b, (c, order) in enumerate(zip(group.members, group.orders, strict=True)):
                out[c] = package_for(batch.ids[c], models[b].to(batch.vectors.device), dict(zip(order.ids, hits[b], strict=True)))
        return out


@RULE_REGISTRY.register("trimmed_mean")
@dataclass(frozen=True)
class TrimmedMean(BatchOfOne, ToleratesByzantine):
    """Coordinate-wise trimmed mean: drop the ``b`` largest and ``b`` smallest, average the rest.

    ``w_k^{t+1}[d] = 1/(C - 2b) * sum_{i = b+1}^{C-b} w_(i)[d]``  (``w_(i)[d]`` sorted), with
    ``b = num_byzantine``. When ``2b >= C`` (few finite candidates) ``b`` is reduced to
    ``floor((C - 1) / 2)``, which keeps one value (odd C) or two (even C): the median.

    Reported weight of candidate ``i``: its share of the kept (coordinate, candidate) entries.
    Equal values are ranked by id, so which of them is "kept" is deterministic.

    Source: Yin et al., "Byzantine-Robust Distributed Learning: Towards Optimal Statistical
    Rates", ICML 2018.

    Written once, over a batch (:class:`BatchOfOne`): :meth:`batched` sorts the columns of every
    client with one number of finite candidates in one call and sums each client's kept values:
    1.9x faster than a batch of one per client (``python bench/rules_batched.py``, this machine).
    """

    def batch_group(self) -> tuple:
        """What :meth:`batched` needs equal across its clients: nothing (each client's
        ``num_byzantine`` is read from its own rule, ``RoundBatch.rules``)."""
        return ()

    def _trim(self, count: int) -> int:
        return self.num_byzantine if 2 * self.num_byzantine < count else (count - 1) // 2

    def batched(self, batch: RoundBatch) -> list[Aggregate]:
        """Every client's trimmed mean at once: clients with one number of finite candidates sorted
        together whatever each trims (``batch.rules``: each one's ``num_byzantine``), the shares of
        clients with one trim together, each one's kept values summed on their own."""
        rules = batch.rules or (self,) * len(batch)
        out, groups, width = _coordinate_groups(batch, order_by=lambda c: rules[c].num_byzantine)
        for group in groups:
            count = group.count
            trims = [rules[c]._trim(count) for c in group.members]
            ordered = sorted_columns(group.values)
            lowest = min(trims)
            _sorted_as_numpy(group.values, ordered, range(lowest, count - lowest))
            start = 0
            # Members with one trim are consecutive (ordered by num_byzantine): their columns a slice.
            for trim, members in itertools.groupby(trims):
                stop = start + len(list(members))
                columns = slice(start * width, stop * width)
                kept_entries = _kept_columns(group.values[:, columns], [row[columns] for row in ordered], trim, count - trim)
                shares = _shares(kept_entries, stop - start, width)
                for b in range(start, stop):
                    c, order = group.members[b], group.orders[b]
                    # The kept values summed as a contiguous float64 [kept, D] tensor.
                    mine = slice(b * width, (b + 1) * width)
                    kept = torch.from_numpy(np.array([row[mine] for row in ordered[trim : count - trim]], dtype=np.float64))
                    model = kept.sum(dim=0) / kept.shape[0]
                    out[c] = package_for(batch.ids[c], model.to(batch.vectors.device), dict(zip(order.ids, shares[b - start], strict=True)))
                start = stop
        return out
