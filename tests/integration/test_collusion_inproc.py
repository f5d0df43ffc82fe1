"""Colluding Byzantine clients as threads pool what they received, and the run equals the
batched engine's.

5 honest + 2 Byzantine clients on ``digits`` with ``attack.colluding = true``, run twice: as
clients on the in-process transport (each Byzantine client sends the other its pool every round
and waits for the other's) and in the batched engine (which pools rows). Asserted:

* every Byzantine round record says ``pooled_from`` = both colluders;
* the honest records (weights, scores, losses, accuracies) and the Byzantine ones (whom each
  heard, silences, pools, the attack's note) agree within the tolerances of
  ``tests/integration/test_engine_parity.py`` (:func:`engine_differences`);
* the pools matter: the same run without ``attack.colluding`` gives the honest clients other
  weights or scores (one colluder hears an honest client the other does not), and its Byzantine
  records have no ``pooled_from``.

A per-receiver attack (ALIE) and each per-round attack that is registered (Min-Max; the
colluding decoy + stealth attack when present).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.attacks import ATTACK_REGISTRY
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.wiring.plan import scenario_topology
from dfedrw.peer.results.records import read_rounds
from tests.support.runs import quiet_console
from tests.support.parity import engine_differences, report_differences

ROUNDS = 20
BASE = (
    "data.name=digits",
    "topology.honest=5",
    "topology.byzantine=2",
    "train.lr=0.1",
    "eval.every=5",
    f"rounds={ROUNDS}",
    # Far above a round's duration: a missed deadline would be a difference the batched engine cannot have.
    "network.round_timeout=30",
)
ENGINES = {"batched": ("engine.name=batched",), "threads": ("engine.name=clients", "network.transport=inproc")}
LOSS_CLIP = ("aggregation.rule=dfedreweighting", "aggregation.tpm=loss", "aggregation.crs=loss_clip_mean")

# (attack, rule overrides): a per-receiver attack against trimmed mean, per-round ones against
# DFedReweighting with loss clipping.
CASES = [
    pytest.param("alie", "trimmed_mean", ("aggregation.rule=trimmed_mean",), id="alie-trimmed_mean"),
    *(
        pytest.param(
            name, "dfedreweighting", LOSS_CLIP, id=f"{name}-loss_clip",
            marks=pytest.mark.skipif(name not in ATTACK_REGISTRY.names(), reason=f"attack {name!r} is not registered"),
        )
        for name in ("min_max", "decoy_stealth")
    ),
]


def run(engine: str, out: Path, attack: str, rule: tuple[str, ...], *extra: str) -> Path:
    scenario = load_scenario(None, [*BASE, *rule, f"attack.name={attack}", *ENGINES[engine], *extra])
    run_scenario(scenario, out, console=quiet_console())
    return out


def byzantine_ids(out: Path) -> list[int]:
    summary = json.loads((out / "summary.json").read_text())
    return sorted(int(k) for k, p in summary["peers"].items() if p["role"] == "byzantine")


def honest_differ(a: Path, b: Path, honest: list[int]) -> bool:
    """Whether any honest client's weights or scores differ in any round between two runs."""
    for k in honest:
        for x, y in zip(read_rounds(a, k), read_rounds(b, k), strict=True):
            if x["weights"] != y["weights"] or x.get("scores") != y.get("scores"):
                return True
    return False


def test_the_placement_lets_pooling_matter():
    # The comparison with the run without collusion below means something only when one
    # colluder hears an honest client the other does not.
    topology = scenario_topology(load_scenario(None, list(BASE)))
    b, c = sorted(topology.byzantine)
    heard = [{k for k in topology.neighbours(x) if k not in topology.byzantine} for x in (b, c)]
    assert heard[0] != heard[1]


@pytest.mark.parametrize(("attack", "rule_name", "rule"), CASES)
def test_colluders_pool_every_round_and_match_the_batched_engine(attack, rule_name, rule, tmp_path):
    # Execute
    threads = run("threads", tmp_path / "threads", attack, rule, "attack.colluding=true")
    batched = run("batched", tmp_path / "batched", attack, rule, "attack.colluding=true")

    # Assert: both colluders' pools in every round of each colluder.
    colluders = byzantine_ids(threads)
    assert len(colluders) == 2
    for b in colluders:
        records = read_rounds(threads, b)
        assert [r["round"] for r in records] == list(range(ROUNDS))
        assert all(r["pooled_from"] == colluders for r in records), [r.get("pooled_from") for r in records]
    final = json.loads((threads / "peers" / f"{colluders[0]}.json").read_text())
    assert final["rejected_by_reason"] == {} and final["completed"]

    # Assert: the same records as the batched engine, honest and Byzantine.
    problems = engine_differences(batched, threads, rule=rule_name, rounds=ROUNDS)
    assert not problems, report_differences(f"{attack} colluding", problems)


def test_without_collusion_the_records_say_so_and_differ(tmp_path):
    # Prepare
    rule = ("aggregation.rule=trimmed_mean",)
    pooled = run("threads", tmp_path / "pooled", "alie", rule, "attack.colluding=true")

    # Execute
    alone = run("threads", tmp_path / "alone", "alie", rule)

    # Assert
    colluders = byzantine_ids(alone)
    assert all("pooled_from" not in r for b in colluders for r in read_rounds(alone, b))
    honest = [k for k in range(7) if k not in colluders]
    assert honest_differ(pooled, alone, honest)
