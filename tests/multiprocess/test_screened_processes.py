"""The screened rule against the colluding twins as real processes over gRPC with mutual TLS:
the two Byzantine processes agree one plan every round (the same digest, each other's pool
used), every honest client screens what Krum's score marks furthest (never scored, weight 0),
and the run gives, round for round, the weights of the same scenario in one process and in the
batched engine (the in-process transport is bit-identical; the batched engine within the
parity tolerance of tests/integration/test_engine_parity.py)."""

from __future__ import annotations

import math

import pytest

from dfedrw.peer.results.records import read_rounds
from tests.support.runs import three_ways, weights_agree

pytestmark = pytest.mark.slow

ROUNDS = 12
SETTINGS = (
    "topology.honest=5", "topology.byzantine=2", f"rounds={ROUNDS}", "eval.every=0", "train.lr=0.1", "network.round_timeout=30",
    "attack.name=colluding_twins", "attack.colluding=true",
    "aggregation.rule=screened_reweighting", "aggregation.tpm=loss", "aggregation.crs=loss_drop_highest",
)


def test_twins_against_the_screened_rule_as_processes(small_scenario, tmp_path):
    # Execute
    grpc, inproc, _ = three_ways(small_scenario, SETTINGS, tmp_path)

    # Assert: every process finished over mutual TLS
    assert grpc["failed_peers"] == [] and grpc["tls"] == "mutual"
    byzantine = sorted(int(k) for k, p in grpc["peers"].items() if p["role"] == "byzantine")
    honest = sorted(int(k) for k, p in grpc["peers"].items() if p["role"] == "honest")
    assert len(byzantine) == 2

    # The twins agreed one plan every round, from the pool of both.
    for r in range(ROUNDS):
        notes = [read_rounds(tmp_path / "grpc", b)[r] for b in byzantine]
        assert {n["attack"]["role"] for n in notes} == {"twin"}
        assert len({n["attack"]["plan"] for n in notes}) == 1
        assert all(n["pooled_from"] == byzantine for n in notes)

    screened = 0
    for k in honest:
        for p in weights_agree(tmp_path, k, ROUNDS):
            # A screened candidate has no score and no weight.
            unscored = [s for s, v in p["scores"].items() if v is None or (isinstance(v, float) and math.isnan(v))]
            assert all(p["weights"][s] == 0 for s in unscored)
            screened += len(unscored)
    assert screened > 0, "the screen should have dropped someone"
    for k in honest:
        assert grpc["peers"][str(k)]["accuracy"] == inproc["peers"][str(k)]["accuracy"]
