"""scripts/seeded_runs.py's comparison: every bit where the kernels are the stored ones,
numbers within a relative 1e-4 where they differ, and nothing else loosened."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import seeded_runs  # noqa: E402

STORED = {"0.jsonl": [{"round": 1, "scores": {"2": 2.218047}, "weights": {"2": 0.5, "3": 0.000001}}], "0.json": {"role": "honest", "global_accuracy": 91.25}}


def changed(path, value):
    """STORED with one entry (keys along ``path``) set to ``value``."""
    import copy

    out = copy.deepcopy(STORED)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def test_the_last_bit_counts_only_where_the_kernels_are_the_stored_ones():
    near = changed(["0.jsonl", 0, "scores", "2"], 2.218046)  # one unit in the 6th decimal
    assert seeded_runs.differences(near, STORED, exact=True) == ["/0.jsonl/0/scores/2: 2.218046, stored 2.218047"]
    assert seeded_runs.differences(near, STORED, exact=False) == []
    assert seeded_runs.differences(STORED, STORED, exact=True) == []


def test_across_kernels_a_number_off_by_more_than_the_tolerance_is_named():
    far = changed(["0.json", "global_accuracy"], 91.25 * (1 + 3e-4))
    tiny = changed(["0.jsonl", 0, "weights", "3"], 0.000002)  # a small weight within the absolute tolerance
    assert seeded_runs.differences(far, STORED, exact=False) == [f"/0.json/global_accuracy: {91.25 * (1 + 3e-4)!r}, stored 91.25"]
    assert seeded_runs.differences(tiny, STORED, exact=False) == []


def test_across_kernels_ids_rounds_roles_keys_and_lengths_must_still_be_equal():
    cases = [
        changed(["0.jsonl", 0, "round"], 2),
        changed(["0.json", "role"], "byzantine"),
        changed(["0.jsonl", 0, "weights"], {"2": 0.5}),
        changed(["0.jsonl"], STORED["0.jsonl"] * 2),
    ]
    found = [seeded_runs.differences(case, STORED, exact=False) for case in cases]
    assert found == [
        ["/0.jsonl/0/round: 2, stored 1"],
        ["/0.json/role: 'byzantine', stored 'honest'"],
        ["/0.jsonl/0/weights: keys ['3'] on one side only"],
        ["/0.jsonl: 2 entries, stored 1"],
    ]
