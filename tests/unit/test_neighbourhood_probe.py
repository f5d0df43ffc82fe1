"""The evidence bench/neighbourhood_probe.py weighs candidates by, on hand-computed cases: a
candidate's value is the highest of the client's own and its kept neighbours' reports, after the
reporters that stray furthest from the others are left out."""

import pytest

from tests.support.scripts import load_bench

probe = load_bench("neighbourhood_probe")

# Client 0's neighbours 1-5, each one's own relative loss 1.0. Reporter 1 holds the classes that
# candidate 5 fails on and reports 3.0 for it; 2-4 report 1.0 for everyone.
OWN = {j: 1.0 for j in range(1, 6)}
HONEST = {
    1: {2: 1.0, 3: 1.0, 4: 1.0, 5: 3.0},
    2: {1: 1.0, 3: 1.0, 4: 1.0, 5: 1.0},
    3: {1: 1.0, 2: 1.0, 4: 1.0, 5: 1.0},
    4: {1: 1.0, 2: 1.0, 3: 1.0, 5: 1.0},
}
FRAMING = {5: {j: 100.0 for j in range(1, 5)}}  # candidate 5 frames every honest neighbour


def test_relative_losses_are_over_their_median():
    assert probe.relative([1.0, 2.0, 4.0]) == [0.5, 1.0, 2.0]
    assert probe.relative([2.0, 4.0]) == [0.5, 1.0]  # the upper median of an even count


def test_no_liar_the_highest_report_counts():
    assert probe.evidence(OWN, HONEST, 0) == {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 3.0}


def test_one_framing_liar_left_out_of_f_1():
    # Reporter 5 strays by 99 on every candidate it reports, the others by 0: it is left out.
    assert probe.evidence(OWN, HONEST | FRAMING, 1) == {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 3.0}


def test_a_liar_kept_frames_every_honest_neighbour():
    assert probe.evidence(OWN, HONEST | FRAMING, 0) == {1: 100.0, 2: 100.0, 3: 100.0, 4: 100.0, 5: 3.0}


def test_leaving_out_more_than_the_liars_can_lose_the_one_witness():
    # f = 2 against one liar: the second left out is an honest reporter that strays by 0, the
    # lowest id first, which is the one that saw candidate 5 fail.
    assert probe.evidence(OWN, HONEST | FRAMING, 2)[5] == pytest.approx(1.0)


def test_consistent_keeps_everyone_told_of_no_byzantine_neighbour():
    assert probe.consistent(OWN, HONEST | FRAMING, 0) == {1, 2, 3, 4, 5}


def test_consistent_leaves_out_a_framing_liar_with_its_reports():
    # Left out with its reports, candidate 5 leaves a worst kept value of 1.0; leaving out any
    # honest neighbour keeps its frames (100.0).
    assert probe.consistent(OWN, HONEST | FRAMING, 1) == {1, 2, 3, 4}


def test_consistent_leaves_out_f_framing_liars():
    own = OWN | {6: 1.0}
    honest = {i: rep | {6: 1.0} for i, rep in HONEST.items()}
    liars = {5: {j: 100.0 for j in range(1, 5)} | {6: 0.0}, 6: {j: 100.0 for j in range(1, 5)} | {5: 0.0}}
    assert probe.consistent(own, honest | liars, 2) == {1, 2, 3, 4}


def test_consistent_a_silent_attacker_is_left_out_on_the_witness_and_its_own_score():
    # No reports from 5; witness 1 reports 3.0 for it and client 0 finds it a little worse
    # (1.2): leaving out 5 keeps a worst of 1.0, leaving out the witness one of 1.2.
    assert probe.consistent(OWN | {5: 1.2}, HONEST, 1) == {1, 2, 3, 4}


def test_consistent_cannot_tell_the_witness_from_the_accused_on_equal_own_scores():
    # The same with 5 as good as the others on client 0's data: leaving out the witness (and
    # its report) or the accused both keep a worst of 1.0 and a sum of 4.0; the lower id goes.
    assert probe.consistent(OWN, HONEST, 1) == {2, 3, 4, 5}


def test_consistent_told_of_more_than_there_are_loses_an_honest_neighbour():
    assert probe.consistent(OWN, HONEST | FRAMING, 2) == {2, 3, 4}
