"""The evidence bench/neighbourhood_probe.py weighs candidates by, on hand-computed cases: a
candidate's value is the highest of the client's own and its kept neighbours' reports, after the
reporters that stray furthest from the others are left out. (Its ``subset`` choice is the
product's: tests/unit/test_neighbourhood_reweighting.py.)"""

import pytest

from tests.support.rules import FRAMING, HONEST, OWN
from tests.support.scripts import load_bench

probe = load_bench("neighbourhood_probe")



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
