"""Every built-in attack runs as Byzantine client processes in ``dfedrw run`` (gRPC, mutual TLS),
with the knowledge its class declares (the defence, a data sample, colluding partners), and
every one in a generated docker-compose cluster; the attacks that need what only a running
Byzantine client has (data, partners) also under torchrun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dfedrw.launch.compose import write_compose
from dfedrw.launch.compose_plan import ATTACK_ENV, ComposeOptions
from dfedrw.launch.local import LocalRun
from dfedrw.peer.attacks import ATTACK_REGISTRY, threat_model_of
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.results.records import read_rounds
from tests.support.runs import quiet_console, torchrun_scenario

pytestmark = pytest.mark.slow

ATTACKS = ATTACK_REGISTRY.builtin_names()
ROUNDS = 6


def settings(attack: str) -> list[str]:
    model = threat_model_of(ATTACK_REGISTRY.resolve(attack))
    colluding = ["attack.colluding=true"] if model is not None and model.colludes else []
    return [
        "data.name=digits", "topology.honest=3", "topology.byzantine=2", f"rounds={ROUNDS}", "eval.every=0",
        "train.lr=0.1", "network.round_timeout=30", f"attack.name={attack}", *colluding,
    ]


def check_attacked(out: Path, attack: str, byzantine: list[int], honest: list[int]) -> None:
    """Every Byzantine client ran ``attack`` for every round, and its messages reached honest
    clients: each honest client's weights name the senders it aggregated."""
    for b in byzantine:
        final = json.loads((out / "peers" / f"{b}.json").read_text())
        assert final["attack"] == attack and final["completed"]
        assert [r["round"] for r in read_rounds(out, b)] == list(range(ROUNDS))
    aggregated = {s for k in honest for r in read_rounds(out, k) for s in r["weights"]}
    sent = sum(1 for b in byzantine for r in read_rounds(out, b) if r["silent_to"] < 3)
    assert sent > 0, f"{attack}: the Byzantine clients never sent"
    assert {str(b) for b in byzantine} & aggregated, f"{attack}: no honest client received a Byzantine message"
    if hasattr(ATTACK_REGISTRY.resolve(attack), "backdoor"):
        # A backdoor: every honest client measured its success rate at the last round.
        for k in honest:
            final = json.loads((out / "peers" / f"{k}.json").read_text())
            assert 0.0 <= final["attack_success"] <= 100.0, (attack, k, final)
    if attack == "dba":
        # One plan: the colluders agree who they are, and each planted its own band.
        for r in range(ROUNDS):
            notes = [read_rounds(out, b)[r]["attack"] for b in sorted(byzantine)]
            assert [n["colluders"] for n in notes] == [sorted(byzantine)] * 2 and [n["part"] for n in notes] == [0, 1], notes


@pytest.mark.parametrize("attack", ATTACKS)
def test_every_attack_runs_as_byzantine_processes(attack, tmp_path):
    scenario = load_scenario(None, settings(attack))
    summary = LocalRun(scenario, tmp_path, console=quiet_console()).run()
    assert summary["failed_peers"] == [] and summary["tls"] == "mutual"
    roles = {int(k): p["role"] for k, p in summary["peers"].items()}
    byzantine = [k for k, r in roles.items() if r == "byzantine"]
    honest = [k for k, r in roles.items() if r == "honest"]
    assert len(byzantine) == 2 and len({p["pid"] for p in summary["peers"].values()}) == 5
    check_attacked(tmp_path, attack, byzantine, honest)


@pytest.mark.parametrize("attack", ATTACKS)
def test_every_attack_gets_its_own_compose_service_setting(attack, tmp_path):
    scenario = load_scenario(None, settings(attack))
    write_compose(scenario, tmp_path, ComposeOptions(port=50100))
    text = (tmp_path / "docker-compose.yml").read_text()
    assert text.count(f'{ATTACK_ENV}: "{attack}"') == 2
    # The scenario the services read keeps what the attack needs (colluding, its settings).
    again = load_scenario(tmp_path / "scenario.toml")
    assert again.attack == scenario.attack


def _knowing(attack: str) -> bool:
    model = threat_model_of(ATTACK_REGISTRY.resolve(attack))
    return model is not None and (bool(model.data) or model.colludes or model.defence)


@pytest.mark.parametrize("attack", [a for a in ATTACKS if _knowing(a)])
def test_attacks_with_knowledge_run_under_torchrun(attack, tmp_path):
    rc, output = torchrun_scenario(load_scenario(None, settings(attack)), tmp_path / "out")
    assert rc == 0, output[-4000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["launcher"] == "torchrun" and summary["failed_peers"] == []
    roles = {int(k): p["role"] for k, p in summary["peers"].items()}
    check_attacked(tmp_path / "out", attack, [k for k, r in roles.items() if r == "byzantine"], [k for k, r in roles.items() if r == "honest"])


def test_a_silent_attacker_still_hears_the_round_after_its_receivers_waited_for_it(tmp_path):
    """Omission is silent in even rounds, so its honest neighbours wait a whole round_timeout
    for it before they begin the next round; the attacker waits long enough for their models
    of that round (twice the timeout) and acts in every odd round, never "knowing no model"."""
    scenario = load_scenario(None, [*settings("omission"), "network.round_timeout=3"])
    summary = LocalRun(scenario, tmp_path, console=quiet_console()).run()
    assert summary["failed_peers"] == []
    byzantine = [int(k) for k, p in summary["peers"].items() if p["role"] == "byzantine"]
    for b in byzantine:
        for record in read_rounds(tmp_path, b):
            if record["round"] % 2 == 1:
                assert record["received_from"] and "why" not in record["attack"], (b, record)
                assert record["attack"]["silent"] is False, (b, record)
