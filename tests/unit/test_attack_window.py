"""The attack window (attack.start, attack.stop), its on-off parts (attack.period, attack.on), the backdoor probe a scenario gives its honest
clients, and the success rate in a run's record and summary."""

from __future__ import annotations

import pytest
import torch

from dfedrw.peer.attacks import AttackView, craft_round, make_attack
from dfedrw.peer.config.checks import ScenarioError
from dfedrw.peer.config.scenario import dump_scenario, load_scenario
from dfedrw.peer.learning.data import Dataset
from dfedrw.peer.results.records import RecordBuilder, success_summary
from dfedrw.peer.round.byzantine import craft_attack_round
from dfedrw.peer.wiring.assembly import scenario_backdoor

BYZANTINE = ("topology.byzantine=2", "data.name=digits")


def test_the_window_is_start_to_stop_minus_one():
    att = load_scenario(None, [*BYZANTINE, "attack.start=5", "attack.stop=10"]).attack
    assert [r for r in range(12) if att.attacks_in(r)] == [5, 6, 7, 8, 9]
    whole = load_scenario(None, list(BYZANTINE)).attack
    assert (whole.start, whole.stop) == (0, 0) and all(whole.attacks_in(r) for r in (0, 1, 10**6))


def test_a_window_that_ends_before_it_begins_is_refused():
    with pytest.raises(ScenarioError, match=r"attack.stop=3 must be after attack.start=3 \(or 0: to the last round\)"):
        load_scenario(None, [*BYZANTINE, "attack.start=3", "attack.stop=3"])


def test_on_off_attacks_the_first_on_rounds_of_each_period_from_start_within_the_window():
    att = load_scenario(None, [*BYZANTINE, "attack.start=3", "attack.stop=17", "attack.period=5", "attack.on=2"]).attack
    assert [r for r in range(20) if att.attacks_in(r)] == [3, 4, 8, 9, 13, 14]
    endless = load_scenario(None, [*BYZANTINE, "attack.period=4", "attack.on=3"]).attack
    assert [r for r in range(9) if not endless.attacks_in(r)] == [3, 7]


@pytest.mark.parametrize(
    "settings, message",
    [
        (["attack.period=5"], r"attack.on=0: the rounds of each period of 5 that attack, from 1 to 4"),
        (["attack.period=5", "attack.on=5"], r"attack.on=5: the rounds of each period of 5 that attack, from 1 to 4"),
        (["attack.on=2"], r"attack.period=0 with attack.on=2: set the period whose first attack.on rounds attack"),
        (["attack.period=1", "attack.on=1"], r"attack.period=1 must be at least 2"),
        (["attack.period=-1", "attack.on=1"], r"attack.period"),
    ],
)
def test_an_on_off_schedule_that_cannot_alternate_is_refused_naming_its_key(settings, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenario(None, [*BYZANTINE, *settings])


def test_off_rounds_of_an_on_off_attacker_send_the_mean_it_knows():
    sc = load_scenario(None, [*BYZANTINE, "attack.name=sign_flip", "attack.period=3", "attack.on=1"])
    attack = make_attack("sign_flip")
    notes = [craft_attack_round(sc, attack, _view(r), torch.Generator()).note.get("attacking") for r in range(6)]
    assert notes == [None, False, False, None, False, False]
    off = craft_attack_round(sc, attack, _view(4), torch.Generator())
    assert torch.equal(off.messages[0], torch.tensor([2.0, 4.0]))


def test_the_window_is_written_with_the_scenario_only_when_set(tmp_path):
    plain = load_scenario(None, list(BYZANTINE))
    assert "start" not in dump_scenario(plain, tmp_path / "plain.toml") and "stop" not in (tmp_path / "plain.toml").read_text()
    assert "period" not in (tmp_path / "plain.toml").read_text()
    windowed = load_scenario(None, [*BYZANTINE, "attack.start=2", "attack.stop=7", "attack.period=3", "attack.on=1"])
    dump_scenario(windowed, tmp_path / "windowed.toml")
    again = load_scenario(tmp_path / "windowed.toml")
    assert (again.attack.start, again.attack.stop, again.attack.period, again.attack.on) == (2, 7, 3, 1) and again == windowed


def _view(r: int) -> AttackView:
    return AttackView(round=r, attacker=5, receivers=(0, 1), senders=(0, 1), received=torch.tensor([[1.0, 2.0], [3.0, 6.0]]))


def test_outside_the_window_an_attacker_sends_the_mean_it_knows():
    sc = load_scenario(None, [*BYZANTINE, "attack.name=sign_flip", "attack.start=3", "attack.stop=5"])
    attack = make_attack("sign_flip")
    for r in (0, 2, 5, 9):
        crafted = craft_attack_round(sc, attack, _view(r), torch.Generator())
        assert crafted.note == {"attacking": False}
        assert all(torch.equal(crafted.messages[k], torch.tensor([2.0, 4.0])) for k in (0, 1))
    inside = craft_attack_round(sc, attack, _view(3), torch.Generator().manual_seed(0))
    expected = craft_round(attack, _view(3), torch.Generator().manual_seed(0))
    assert torch.equal(inside.messages[0], expected.messages[0]) and torch.equal(inside.messages[0], torch.tensor([-20.0, -40.0]))
    silent = craft_attack_round(sc, attack, AttackView(round=0, attacker=5, receivers=(0,), senders=(), received=torch.empty(0, 2)), torch.Generator())
    assert silent.messages == {0: None}


def test_only_a_backdoor_attack_gives_a_probe_with_or_without_byzantine_clients():
    assert scenario_backdoor(load_scenario(None, [*BYZANTINE, "attack.name=gaussian"])) is None
    assert scenario_backdoor(load_scenario(None, ["topology.byzantine=0", "attack.name=none", "data.name=digits"])) is None
    # No attacker plants it, but its trigger measures the base rate on the clean models.
    base = scenario_backdoor(load_scenario(None, ["topology.byzantine=0", "attack.name=badnets", "attack.badnets.target=3", "data.name=digits"]))
    assert base is not None and base.backdoor.target == 3
    probe = scenario_backdoor(load_scenario(None, [*BYZANTINE, "attack.name=badnets", "attack.badnets.target=7", "attack.badnets.trigger_size=2"]))
    assert probe.input_shape == (1, 8, 8) and probe.backdoor.target == 7
    test = Dataset(x=torch.zeros(4, 64), y=torch.tensor([7, 1, 2, 7]), num_classes=10)
    rows = probe.rows(test)
    # Rows 1 and 2 (not of class 7), pixels (5..6, 5..6) of the 8x8 image set: 45, 46, 53, 54.
    assert rows.y.tolist() == [7, 7] and rows.x.nonzero()[:, 1].tolist() == [45, 46, 53, 54] * 2


def test_the_summary_of_a_success_rate_by_hand():
    # Finals 40 and 60; the honest mean 90 at round 4 and 95 at round 9, then 50 at round 14.
    summary = success_summary([40.0, 60.0], {4: [80.0, 100.0], 9: [90.0, 100.0], 14: [40.0, 60.0]})
    assert summary == {"mean": 50.0, "worst": 60.0, "peak_mean": 95.0, "peak_round": 9}


def test_a_record_has_a_success_curve_only_when_one_was_measured():
    plain = RecordBuilder([0], [0])
    plain.add(0, [{"round": 0, "accuracy": 50.0, "global_accuracy": 40.0, "weights": {"0": 1.0}}])
    assert set(plain.result()["curves"]) == {"accuracy", "global_accuracy"}
    backdoored = RecordBuilder([0], [0])
    backdoored.add(0, [{"round": 0, "accuracy": 50.0, "global_accuracy": 40.0, "attack_success": 90.0, "weights": {"0": 1.0}}])
    assert backdoored.result()["curves"]["attack_success"] == [[0, 90.0]]
