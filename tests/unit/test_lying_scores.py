"""What Byzantine clients report as the scores they measured (``attack.scores``), on hand-worked
cases: whom they frame or praise, the padding that keeps a framing report's median plain, the
bound on a report's size, and the rounds they report in."""

from __future__ import annotations

import torch

from dfedrw.peer.aggregation.neighbourhood import relative
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.round.byzantine import FRAMED, PLAIN, PRAISED, ByzantineStep, reported_scores

# Byzantine client 5 of ten; its neighbours 1, 2, 3, 4 (honest) and 6 (Byzantine).
NEIGHBOURS, BYZANTINE = (1, 2, 3, 4, 6), {5, 6}


def test_no_report_by_default():
    assert reported_scores("none", 5, NEIGHBOURS, BYZANTINE, 10, 6) is None
    assert load_scenario(None, []).attack.scores == "none"


def test_praise_makes_the_attackers_a_hundred_times_better():
    lie = reported_scores("praise", 5, NEIGHBOURS, BYZANTINE, 10, 6)
    assert lie == {5: PRAISED, 6: PRAISED, 1: PLAIN, 2: PLAIN, 3: PLAIN, 4: PLAIN}
    # On a receiver's scale (over the report's median, PLAIN): as sent.
    assert dict(zip(lie, relative(list(lie.values())), strict=True)) == lie


def test_frame_pads_with_other_clients_to_keep_its_median_plain():
    # Room for 20 entries: four framed need five plain ones; it has itself and 6, so it names
    # three other clients (the lowest ids it is not a neighbour of: 0, 7, 8).
    lie = reported_scores("frame", 5, NEIGHBOURS, BYZANTINE, 10, 20)
    assert lie == {1: FRAMED, 2: FRAMED, 3: FRAMED, 4: FRAMED, 5: PLAIN, 6: PLAIN, 0: PLAIN, 7: PLAIN, 8: PLAIN}
    assert sorted(relative(list(lie.values()))) == [1.0] * 5 + [100.0] * 4


def test_frame_within_what_a_receiver_takes_frames_fewer():
    # A receiver takes 6 scores (the most candidates a client has): no room to pad, so of the
    # six it names (itself, 6 and its four honest neighbours) two can be framed; the lowest ids.
    lie = reported_scores("frame", 5, NEIGHBOURS, BYZANTINE, 10, 6)
    assert lie == {1: FRAMED, 2: FRAMED, 3: PLAIN, 4: PLAIN, 5: PLAIN, 6: PLAIN}
    # Seven clients: one other (0) to name, so three framed against four plain.
    assert reported_scores("frame", 5, NEIGHBOURS, BYZANTINE, 7, 20) == {1: FRAMED, 2: FRAMED, 3: FRAMED, 4: PLAIN, 5: PLAIN, 6: PLAIN, 0: PLAIN}


def test_frame_one_frames_the_honest_neighbour_of_lowest_id_alone():
    lie = reported_scores("frame_one", 5, NEIGHBOURS, BYZANTINE, 10, 6)
    assert lie == {5: PLAIN, 6: PLAIN, 2: PLAIN, 3: PLAIN, 4: PLAIN, 1: FRAMED}
    assert dict(zip(lie, relative(list(lie.values())), strict=True)) == lie
    # Its only neighbour honest: itself and one padding client keep the median plain.
    assert reported_scores("frame_one", 5, (2,), BYZANTINE, 10, 6) == {5: PLAIN, 0: PLAIN, 2: FRAMED}
    # No room to pad: nothing framed.
    assert reported_scores("frame_one", 5, (2,), BYZANTINE, 10, 2) == {5: PLAIN, 2: PLAIN}


def test_invert_praises_the_attackers_and_frames_the_honest_around_a_plain_median():
    # Two praised and two framed need five plain: 3 and 4, and three other clients.
    lie = reported_scores("invert", 5, NEIGHBOURS, BYZANTINE, 10, 20)
    assert lie == {5: PRAISED, 6: PRAISED, 3: PLAIN, 4: PLAIN, 0: PLAIN, 7: PLAIN, 8: PLAIN, 1: FRAMED, 2: FRAMED}
    assert dict(zip(lie, relative(list(lie.values())), strict=True)) == lie
    # Six entries leave no room to pad: no honest neighbour framed, the attackers praised.
    assert reported_scores("invert", 5, NEIGHBOURS, BYZANTINE, 10, 6) == reported_scores("praise", 5, NEIGHBOURS, BYZANTINE, 10, 6)


def test_it_reports_in_the_rounds_it_attacks_only():
    sc = load_scenario(None, ["attack.name=gaussian", "attack.start=2", "attack.period=4", "attack.on=1", "attack.scores=praise"])
    step = ByzantineStep(sc, 5, None, torch.Generator(), lie={5: PRAISED})
    assert [step.reported(r) for r in range(8)] == [None, None, {5: PRAISED}, None, None, None, {5: PRAISED}, None]
    assert ByzantineStep(sc, 5, None, torch.Generator()).reported(2) is None


def test_the_setting_survives_the_scenario_file_clients_read(tmp_path):
    from dfedrw.peer.config.scenario import dump_scenario

    sc = load_scenario(None, ["attack.name=gaussian", "attack.scores=frame"])
    dump_scenario(sc, tmp_path / "scenario.toml")
    assert load_scenario(tmp_path / "scenario.toml", []).attack.scores == "frame"
    # The default leaves the file as it was.
    dump_scenario(load_scenario(None, ["attack.name=gaussian"]), tmp_path / "plain.toml")
    assert "scores" not in (tmp_path / "plain.toml").read_text().split("[attack]")[1].split("[")[0]
