"""A seeded run's figures are the ones stored in tests/data/seeded_runs.json, to the last bit
(``scripts/seeded_runs.py``): how data are loaded, how processes start and how many threads
they use must not change what a run computes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dfedrw.peer.data import DatasetUnavailable
from dfedrw.peer.datasets import check_dataset

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import seeded_runs  # noqa: E402


@pytest.mark.parametrize("name", sorted(seeded_runs.SCENARIOS))
def test_a_seeded_run_computes_the_stored_figures(name):
    # Prepare
    dataset = "fashion-mnist" if name == "fashion-mnist" else "digits"
    try:
        check_dataset(dataset)
    except DatasetUnavailable as exc:
        pytest.skip(f"{dataset} not on this machine: {exc}")
    stored = json.loads(seeded_runs.STORED.read_text())[name]

    # Execute
    now = seeded_runs.figures(name)

    # Assert
    assert sorted(now) == sorted(stored)
    for f in stored:
        assert now[f] == stored[f], f"{name}: {f} differs from the stored figures"
    honest_final = [v for f, v in stored.items() if f.endswith(".json") and v["role"] == "honest"]
    assert honest_final and all(isinstance(v["global_accuracy"], float) for v in honest_final)
