"""Reputation then strike (``attack.strike = "trusted"``): how a Byzantine client reads its
standing in the scores its honest neighbours report (:class:`Standing`, hand-worked), when its step decides
to attack (:meth:`ByzantineStep.attacking`, once per label), and the settings' checks."""

from __future__ import annotations

import json

import pytest
import torch

from dfedrw.peer.attacks import make_attack
from dfedrw.peer.config.checks import ScenarioError
from dfedrw.peer.config.scenario import dump_scenario, load_scenario
from dfedrw.peer.round.byzantine import ByzantineStep, Standing

BYZANTINE = ("topology.byzantine=2", "data.name=digits", "attack.name=sign_flip")
TRUSTED = (*BYZANTINE, "network.share_scores=true", "attack.strike=trusted")


def test_a_report_ranks_the_attacker_trusted_when_it_is_not_among_the_f_worst():
    # Client 5's standing; 5 and 8 are Byzantine. Report of 0 names 5 alone (f = 1): one entry
    # (9, loss 3) is worse than 5's 2: trusted. Report of 1 names 5 and 8 (f = 2): only 8 is
    # worse than 5: not. Report of 2 (f = 1): nobody worse: not. One of three: not trusted.
    standing = Standing(5, rounds=2, byzantine=(5, 8))
    standing.observe(0, {0: {7: 1.0, 5: 2.0, 9: 3.0}, 1: {7: 1.0, 5: 2.0, 8: 3.0}, 2: {5: 4.0, 7: 1.0, 9: 3.0}})
    assert standing.latest == {0: True, 1: False, 2: False} and standing.streak == 0
    # Newer reports of 1 and 2: 1 now scores 5 below two others, 2 sent none (no say).
    standing.observe(1, {1: {7: 3.0, 5: 2.0, 8: 3.0}, 2: None})
    assert standing.latest == {0: True, 1: True} and standing.streak == 1
    standing.observe(2, {})  # nothing new: its neighbours' latest say the same
    assert (standing.streak, standing.trusted()) == (2, True)


def test_half_the_reports_or_none_naming_it_end_the_run_of_trusted_steps():
    standing = Standing(5, rounds=1, byzantine=())
    standing.observe(0, {0: {5: 1.0, 7: 2.0}})
    assert standing.trusted()
    standing.observe(1, {1: {5: 3.0, 7: 1.0, 9: 2.0}})  # one of two: not more than half
    assert (standing.streak, standing.trusted()) == (0, False)
    standing.observe(2, {1: {5: 1.0, 7: 2.0}})
    assert standing.streak == 1
    standing.observe(3, {0: {7: 1.0, 9: 2.0}, 1: {}})  # no report names it: nothing to go on
    assert (standing.latest, standing.streak) == ({}, 0)


def test_a_step_is_counted_once_however_many_answers_judge_it():
    # Under asynchronous gossip each neighbour's new model is answered as it comes.
    standing = Standing(5, rounds=2, byzantine=())
    for sender in (0, 1, 2):
        standing.observe(4, {sender: {5: 1.0, 7: 2.0}})
    assert standing.streak == 1
    standing.observe(4, {3: {5: 3.0, 7: 2.0}, 4: {5: 3.0, 7: 2.0}, 6: {5: 3.0, 7: 2.0}})  # now three of six: reset
    assert standing.streak == 0


def test_reports_are_compared_as_the_wire_carries_them_float32():
    # 1 + 2**-30 is above 1.0 in float64 and equal to it in float32: nobody is worse.
    standing = Standing(5, rounds=1, byzantine=())
    standing.observe(0, {0: {5: 1.0, 7: 1.0 + 2.0**-30}})
    assert standing.streak == 0


def _step(settings) -> ByzantineStep:
    sc = load_scenario(None, list(settings))
    return ByzantineStep(sc, 5, make_attack("sign_flip"), torch.Generator(), byzantine=(5,))


def _round(step: ByzantineStep, label: int, reports) -> dict:
    received = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    crafted, _, _ = step(
        label, receivers=(0, 1), senders=(0, 1), received=received, sizes=[10, 10], losses=[1.0, 1.0], reports=dict(enumerate(reports)),
    )
    return dict(crafted.note)


def test_the_step_behaves_until_trusted_then_strikes_until_a_step_ranks_it_otherwise():
    step = _step([*TRUSTED, "attack.trusted_rounds=2"])
    good, bad = [{5: 1.0, 0: 2.0, 1: 3.0}] * 2, [{5: 9.0, 0: 2.0, 1: 3.0}] * 2
    # Round 0: its neighbours measured nothing yet.
    notes = [_round(step, r, reports) for r, reports in enumerate([[None, None], good, good, good, bad, good, good, good])]
    assert [n.get("attacking", True) for n in notes] == [False, False, False, True, True, False, False, True]
    assert [n["trusted_for"] for n in notes] == [0, 0, 1, 2, 3, 0, 1, 2]


def test_a_step_restored_from_its_state_goes_on_as_the_step_that_never_stopped():
    # Prepare: the same reports to a step that runs through and to one stopped after round 3,
    # its state kept as a checkpoint keeps it (JSON), and a new step restored from it
    good, bad = [{5: 1.0, 0: 2.0, 1: 3.0}] * 2, [{5: 9.0, 0: 2.0, 1: 3.0}] * 2
    rounds = [[None, None], good, good, good, bad, good, good, good]
    settings = [*TRUSTED, "attack.trusted_rounds=2"]
    through, first = _step(settings), _step(settings)
    expected = [_round(through, r, reports) for r, reports in enumerate(rounds)]
    before = [_round(first, r, reports) for r, reports in enumerate(rounds[:4])]
    kept = json.loads(json.dumps(first.state()))

    # Execute
    again = _step(settings)
    again.restore(kept)
    after = [_round(again, r, reports) for r, reports in enumerate(rounds[4:], start=4)]

    # Assert: the same decisions and runs, where a step begun again at nothing would behave
    assert kept == {"standing": {"streak": 3, "counted": 3, "latest": {"0": True, "1": True}}}
    assert before + after == expected
    assert _round(_step(settings), 4, rounds[4]).get("attacking", True) is False


@pytest.mark.parametrize(
    "state",
    [None, {}, {"streak": -1, "counted": 3, "latest": {}}, {"streak": 2, "counted": 3, "latest": {"x": True}},
     {"streak": 2, "counted": 3, "latest": {"0": 1}}, {"streak": True, "counted": 3, "latest": {}}, {"streak": 2, "counted": "3", "latest": {}}],
)
def test_a_standing_that_is_not_one_is_refused_and_nothing_changes(state):
    standing = Standing(5, rounds=2, byzantine=())
    standing.observe(0, {0: {5: 1.0, 7: 2.0}})
    with pytest.raises(ValueError, match="not a standing"):
        standing.restore(state)
    assert (standing.streak, standing.latest) == (1, {0: True})


def test_the_decision_of_a_label_is_made_once_before_its_step_learns_anything():
    # The batched engine asks what a round's messages carry before the round's step: the step
    # that follows keeps that decision though its reports move the standing.
    step = _step([*TRUSTED, "attack.trusted_rounds=1"])
    _round(step, 0, [{5: 1.0, 0: 2.0}])
    assert step.attacking(1)
    assert _round(step, 1, [{5: 9.0, 0: 2.0, 1: 3.0}]).get("attacking", True) is True and step.attacking(1)
    assert not step.attacking(2)


def test_outside_the_window_it_never_strikes_however_trusted():
    step = _step([*TRUSTED, "attack.trusted_rounds=1", "attack.start=3"])
    notes = [_round(step, r, [{5: 1.0, 0: 2.0}]) for r in range(5)]
    assert [n.get("attacking", True) for n in notes] == [False, False, False, True, True]


def test_on_the_calendar_the_step_ignores_what_it_is_told():
    step = _step(BYZANTINE)
    assert step.standing is None and "trusted_for" not in _round(step, 0, [{5: 9.0, 0: 1.0}]) and step.attacking(1)


@pytest.mark.parametrize(
    "settings, message",
    [
        ((*BYZANTINE, "attack.strike=trusted"), r"attack.strike = \"trusted\": .*set network.share_scores = true"),
        ((*TRUSTED, "attack.period=10", "attack.on=5"), r"attack.strike = \"trusted\" with attack.period=10: .*set one"),
        ((*BYZANTINE, "attack.trusted_rounds=3"), r"attack.trusted_rounds=3 is read only with attack.strike = \"trusted\""),
        ((*TRUSTED, "attack.trusted_rounds=0"), r"attack.trusted_rounds=0 must be an integer"),
        ((*BYZANTINE, "attack.strike=sometimes"), r"attack.strike='sometimes' is not valid; choose one of: schedule, trusted"),
    ],
)
def test_bad_strike_settings_are_refused_naming_their_key(settings, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenario(None, list(settings))


def test_the_strike_is_written_with_the_scenario_only_when_set(tmp_path):
    dump_scenario(load_scenario(None, list(BYZANTINE)), tmp_path / "plain.toml")
    assert "strike" not in (tmp_path / "plain.toml").read_text()
    trusted = load_scenario(None, [*TRUSTED, "attack.trusted_rounds=7"])
    dump_scenario(trusted, tmp_path / "trusted.toml")
    again = load_scenario(tmp_path / "trusted.toml")
    assert (again.attack.strike, again.attack.trusted_rounds) == ("trusted", 7) and again == trusted
