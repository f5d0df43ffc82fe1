"""Every rule and every attack runs with a convolutional model (LeNet-5 on 28x28 images the
test writes) in the batched engine, and the clients engine runs one; the fast selection takes
the parts whose arithmetic a CNN's size changes most (distances, clustering, bisection, an
attack that trains), the slow one all of them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.attacks import ATTACK_REGISTRY, threat_model_of
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.kinds.registries import RULE_REGISTRY
from dfedrw.peer.results.records import read_rounds
from tests.support.datafiles import write_image_idx
from tests.support.runs import quiet_console

ROUNDS = 2
FAST_RULES = {"krum", "multi_krum", "flame", "geometric_median", "dfedreweighting"}
FAST_ATTACKS = {"tpm_aware", "min_max", "label_flip"}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return write_image_idx(tmp_path_factory.mktemp("images"))


def cnn_scenario(images: Path, *overrides: str):
    return load_scenario(None, [
        "data.name=mnist", f"data.dir={images}", "train.model=lenet5", "train.momentum=0.9", "train.local_steps=2",
        "topology.honest=5", "topology.byzantine=2", f"rounds={ROUNDS}", "eval.every=1", "engine.name=batched", *overrides,
    ])


def check_run(out: Path, summary: dict) -> None:
    """Every client ran every round; each honest client's records name the senders it
    aggregated, hold a finite train loss and, in evaluation rounds, its accuracies."""
    assert summary["failed_peers"] == []
    honest = [int(k) for k, p in summary["peers"].items() if p["role"] == "honest"]
    for k in honest:
        records = read_rounds(out, k)
        assert [r["round"] for r in records] == list(range(ROUNDS))
        assert all(math.isfinite(r["train_loss"]) and str(k) in r["weights"] for r in records)
        assert all(0.0 <= r["global_accuracy"] <= 100.0 for r in records)
        final = json.loads((out / "peers" / f"{k}.json").read_text())
        assert final["completed"]


def _marked(names, fast):
    return [pytest.param(n, marks=() if n in fast else pytest.mark.slow) for n in names]


@pytest.mark.parametrize("rule", _marked(RULE_REGISTRY.builtin_names(), FAST_RULES))
def test_every_rule_aggregates_convolutional_models(rule, images, tmp_path):
    out, summary = run_scenario(cnn_scenario(images, f"aggregation.rule={rule}", "attack.name=gaussian"), tmp_path, console=quiet_console())
    check_run(out, summary)


@pytest.mark.parametrize("attack", _marked(ATTACK_REGISTRY.builtin_names(), FAST_ATTACKS))
def test_every_attack_crafts_convolutional_models(attack, images, tmp_path):
    model = threat_model_of(ATTACK_REGISTRY.resolve(attack))
    colluding = ["attack.colluding=true"] if model is not None and model.colludes else []
    scenario = cnn_scenario(images, f"attack.name={attack}", *colluding)
    out, summary = run_scenario(scenario, tmp_path, console=quiet_console())
    check_run(out, summary)
    byzantine = [int(k) for k, p in summary["peers"].items() if p["role"] == "byzantine"]
    assert all([r["round"] for r in read_rounds(out, b)] == list(range(ROUNDS)) for b in byzantine)


def test_the_clients_engine_trains_and_scores_a_convolutional_model(images, tmp_path):
    scenario = cnn_scenario(images, "engine.name=clients", "network.transport=inproc", "aggregation.rule=dfedreweighting", "attack.name=alie")
    out, summary = run_scenario(scenario, tmp_path, console=quiet_console())
    check_run(out, summary)
    assert summary["transport"] == "inproc"
