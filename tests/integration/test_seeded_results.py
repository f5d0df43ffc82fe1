"""A seeded run's figures are the ones stored in tests/data/seeded_runs.json
(``scripts/seeded_runs.py``): how data are loaded, how processes start and how many threads
they use must not change what a run computes. To the last bit where this machine's
floating-point kernels are the stored ones (their fingerprint says), within a relative 1e-4
where they differ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dfedrw.peer.learning.data import DatasetUnavailable
from dfedrw.peer.learning.datasets import check_dataset

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
    stored = json.loads(seeded_runs.STORED.read_text())
    here = seeded_runs.numerics()
    exact = here["digest"] == stored["numerics"]["digest"]

    # Execute
    now = seeded_runs.figures(name)

    # Assert
    diffs = seeded_runs.differences(now, stored["runs"][name], exact)
    how = "to the last bit" if exact else f"within {seeded_runs.REL_TOL:g}: kernels here {here}, stored {stored['numerics']}"
    assert not diffs, f"{name}, {how}: {len(diffs)} differ, first {diffs[:3]}"
    honest_final = [v for f, v in stored["runs"][name].items() if f.endswith(".json") and v["role"] == "honest"]
    assert honest_final and all(isinstance(v["global_accuracy"], float) for v in honest_final)


def test_the_kernel_fingerprint_tells_torchs_generic_kernels_from_this_machines():
    # Prepare: the same probe in a process that torch makes use its generic (non-SIMD) kernels
    here = seeded_runs.numerics()
    if here["cpu_capability"] == "DEFAULT":
        pytest.skip("torch already uses its generic kernels on this machine")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    code = f"import json, sys; sys.path.insert(0, {str(REPO / 'scripts')!r}); import seeded_runs; print(json.dumps(seeded_runs.numerics()))"

    # Execute
    generic = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120).stdout)

    # Assert: same fingerprint twice in one process, another one under other kernels
    assert seeded_runs.numerics() == here
    assert generic["cpu_capability"] == "DEFAULT" and generic["digest"] != here["digest"]
