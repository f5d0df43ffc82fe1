"""Big models a block of coordinates at a time, the same bits as all at once.

A rule that sums candidates in float64 (:func:`~dfedrw.peer.aggregation.rules.weighted_sum`), or
an attack that averages what it received (the Gaussian attack's centre), would otherwise copy
every candidate to float64: for eleven candidates of an 11 M-parameter model, 970 MB on top of
the 485 MB they take. Over blocks of :data:`BLOCK` coordinates one block's copy exists at a time.
Each coordinate's result depends on that coordinate's values alone (a product with a weight
vector, a mean over the rows, an elementwise step), so a block gives the bits the whole would; a
probe checks once per process that this torch agrees (a kernel whose summation order depended on
the width would not), else the whole tensor is computed at once, as for models of up to ``BLOCK``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch

__all__ = ["BLOCK", "column_blocks", "in_blocks", "mean_rows", "weighted_rows"]

# Coordinates a block holds: 512 KiB of float64 a row.
BLOCK = 1 << 16


def in_blocks(size: int) -> bool:
    """Whether a computation over ``size`` coordinates goes a block at a time."""
    return size > BLOCK and _agrees()


def column_blocks(size: int) -> Iterator[slice]:
    for start in range(0, size, BLOCK):
        yield slice(start, min(start + BLOCK, size))


def weighted_rows(weights: torch.Tensor, rows: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    """``(weights @ rows[index].to(float64)).to(float32)`` (all rows when ``index`` is None):
    float64 ``weights [k]``, ``rows [n, D]``; float32 ``[D]``."""
    size = rows.shape[1]
    if not in_blocks(size):
        picked = rows if index is None else rows.index_select(0, index)
        return (weights @ picked.to(torch.float64)).to(torch.float32)
    out = torch.empty(size, dtype=torch.float32, device=rows.device)
    for block in column_blocks(size):
        part = rows[:, block]
        out[block] = weights @ (part if index is None else part.index_select(0, index)).to(torch.float64)
    return out


def mean_rows(rows: torch.Tensor) -> torch.Tensor:
    """``rows.to(float64).mean(dim=0)``: float64 ``[D]``."""
    size = rows.shape[1]
    if not in_blocks(size):
        return rows.to(torch.float64).mean(dim=0)
    out = torch.empty(size, dtype=torch.float64, device=rows.device)
    for block in column_blocks(size):
        out[block] = rows[:, block].to(torch.float64).mean(dim=0)
    return out


@functools.cache
def _agrees() -> bool:
    """Whether blocks give the bits the whole tensor gives, on a probe of this process's torch."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(9, 2 * BLOCK + 4099, generator=gen) * torch.rand(9, 1, generator=gen) * 30
    weights = torch.rand(9, generator=gen, dtype=torch.float64)
    weights /= weights.sum()
    whole = (weights @ rows.to(torch.float64)).to(torch.float32), rows.to(torch.float64).mean(dim=0)
    parts = torch.empty_like(whole[0]), torch.empty_like(whole[1])
    for block in column_blocks(rows.shape[1]):
        part = rows[:, block].to(torch.float64)
        parts[0][block], parts[1][block] = weights @ part, part.mean(dim=0)
    return all(torch.equal(a, b) for a, b in zip(whole, parts, strict=True))
