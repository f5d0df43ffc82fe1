"""The hand-vectorised floor bench/batched_floor.py compares the batched engine with learns the
paper's run (a floor that learned nothing would be fast for nothing)."""

from pathlib import Path

import pytest

from tests.support.scripts import load_bench

FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not (FASHION / "train-images-idx3-ubyte.gz").exists(), reason="needs Debian's dataset-fashion-mnist")
def test_the_batched_engines_floor_learns_the_papers_run():
    bench = load_bench("batched_floor")
    assert bench.floor(100, FASHION) > 60
