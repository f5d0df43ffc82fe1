"""A big model a block of coordinates at a time gives the very bits of the whole: DFedAvg's
float64 sum, the finite check, the Gaussian attack (peer/aggregation/columns.py)."""

from __future__ import annotations

import pytest
import torch

from dfedrw.peer.aggregation import columns
from dfedrw.peer.aggregation.rules import finite_rows, weighted_sum
from dfedrw.peer.attacks.classic import Gaussian


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 64 coordinates, so that a model of a thousand takes the blocked path."""
    monkeypatch.setattr(columns, "BLOCK", 64)
    columns._agrees.cache_clear()
    yield
    columns._agrees.cache_clear()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to the last bit, NaN included."""
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}
    return a.dtype == b.dtype and torch.equal(a.view(ints[a.dtype]), b.view(ints[b.dtype]))


def candidates(rows=9, size=1000, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, size, generator=gen) * torch.rand(rows, 1, generator=gen) * 10


def test_the_blocked_weighted_sum_is_the_whole_ones_bits(small_blocks):
    vectors = candidates()
    weights = torch.tensor([0.3, 0.0, 0.1, 0.2, 0.05, 0.05, 0.1, 0.1, 0.1], dtype=torch.float64)
    vectors[1, 7] = float("nan")  # a row of weight 0 never reaches the sum
    used = weights > 0
    whole = (weights[used] @ vectors[used].to(torch.float64)).to(torch.float32)
    assert columns.in_blocks(vectors.shape[1])
    assert same_bits(weighted_sum(vectors, weights), whole)
    vectors = candidates(seed=1)
    every = torch.full((9,), 1 / 9, dtype=torch.float64)
    assert same_bits(weighted_sum(vectors, every), (every @ vectors.to(torch.float64)).to(torch.float32))


def test_the_blocked_finite_check_and_mean_are_the_whole_ones(small_blocks):
    vectors = candidates()
    vectors[2, 999], vectors[5, 0] = float("inf"), float("nan")
    assert finite_rows(vectors).tolist() == torch.isfinite(vectors).all(dim=1).tolist()
    assert same_bits(columns.mean_rows(vectors), vectors.to(torch.float64).mean(dim=0))


def test_the_blocked_gaussian_attack_sends_the_whole_ones_messages(small_blocks):
    received = candidates(rows=4)
    blocked = Gaussian().for_receivers(received, (1, 2, 3), torch.Generator().manual_seed(5))
    columns.BLOCK = 1 << 16  # the whole at once (monkeypatch puts it back)
    whole = Gaussian().for_receivers(received, (1, 2, 3), torch.Generator().manual_seed(5))
    assert all(same_bits(a, b) for a, b in zip(blocked, whole, strict=True))


def test_models_of_up_to_a_block_take_the_path_of_old():
    assert not columns.in_blocks(columns.BLOCK) and columns.in_blocks(columns.BLOCK + 1)
