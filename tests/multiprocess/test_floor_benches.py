"""The floor bench/round_floor.py compares client processes with does the job it stands for: its
processes run every round over mutual TLS and learn what the client processes learn."""

from __future__ import annotations

import pytest

from tests.support.scripts import load_bench

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_round_floor_and_the_processes_learn_the_same_from_the_same_rounds(tmp_path):
    bench = load_bench("round_floor")
    overrides = [*bench.JOBS["default"], "topology.honest=4", "topology.byzantine=1"]
    floor, processes = bench.run_floor(overrides, 40, tmp_path), bench.run_processes(overrides, 40, tmp_path)
    assert floor["user"] > 0 and floor["seconds"] > 0 and processes["user"] > 0
    # Both ran 40 rounds of the same shards, models and minibatches; the floor draws none of
    # the client's checks, so they agree to a few points, not to the bit.
    assert processes["accuracy"] > 60 and abs(floor["accuracy"] - processes["accuracy"]) < 5, (floor, processes)
