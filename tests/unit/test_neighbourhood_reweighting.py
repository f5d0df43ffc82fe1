"""NeighbourhoodReweighting on hand-computed cases: which neighbours :func:`consistent` leaves
out given what the others reported, with 0, 1 and ``f`` lying neighbours, and the rule around
it (the losses it measures and reports, the weights of those kept)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dfedrw.peer.aggregation import make_crs, make_tpm
from dfedrw.peer.aggregation.inputs import RoundInputs
from dfedrw.peer.aggregation.neighbourhood import NeighbourhoodReweighting, consistent, relative, remembered
from dfedrw.peer.aggregation.rules import RULE_REGISTRY
from tests.support.rules import FRAMING, HONEST, OWN



def test_relative_values_are_over_their_median():
    assert relative([1.0, 2.0, 4.0]) == [0.5, 1.0, 2.0]
    assert relative([2.0, 4.0]) == [0.5, 1.0]  # the upper median of an even count
    assert relative([0.0, 0.0, 3.0]) == [0.0, 0.0, 3.0]  # a median of 0: as they are


def test_consistent_keeps_everyone_told_of_no_byzantine_neighbour():
    assert consistent(OWN, HONEST | FRAMING, 0) == {1, 2, 3, 4, 5}


def test_consistent_leaves_out_a_framing_liar_with_its_reports():
    # Left out with its reports, candidate 5 leaves a worst kept value of 1.0; leaving out any
    # honest neighbour keeps its frames (100.0).
    assert consistent(OWN, HONEST | FRAMING, 1) == {1, 2, 3, 4}


def test_consistent_leaves_out_f_framing_liars():
    own = OWN | {6: 1.0}
    honest = {i: rep | {6: 1.0} for i, rep in HONEST.items()}
    liars = {5: {j: 100.0 for j in range(1, 5)} | {6: 0.0}, 6: {j: 100.0 for j in range(1, 5)} | {5: 0.0}}
    assert consistent(own, honest | liars, 2) == {1, 2, 3, 4}


def test_consistent_a_silent_attacker_is_left_out_on_the_witness_and_its_own_score():
    # No reports from 5; witness 1 reports 3.0 for it and client 0 finds it a little worse
    # (1.2): leaving out 5 keeps a worst of 1.0, leaving out the witness one of 1.2.
    assert consistent(OWN | {5: 1.2}, HONEST, 1) == {1, 2, 3, 4}


def test_consistent_between_the_witness_and_the_accused_the_accused_goes():
    # The same with 5 as good as the others on client 0's data: leaving out the witness (and
    # its report) or the accused both keep a worst of 1.0 and a sum of 4.0. What is said of
    # them decides: 3.0 of the accused, 1.0 of the witness.
    assert consistent(OWN, HONEST, 1) == {1, 2, 3, 4}
    # Even when client 0 finds the accused a little better than the rest.
    assert consistent(OWN | {5: 0.9}, HONEST, 1) == {1, 2, 3, 4}


def test_consistent_a_liar_framing_one_honest_neighbour_has_it_left_out():
    # The tie's other side, a weakness: 5 frames 2 alone. Leaving out 2 (and its report) or 5
    # (and its frame) both keep a worst of 1.0; 2 is the one accused, so 2 goes.
    assert consistent(OWN, {i: {j: 1.0 for j in OWN if j != i} for i in (1, 2, 3, 4)} | {5: {2: 9.0}}, 1) == {1, 3, 4, 5}


def test_consistent_told_of_more_than_there_are_loses_an_honest_neighbour():
    assert consistent(OWN, HONEST | FRAMING, 2) == {2, 3, 4}


# -- the rule ----------------------------------------------------------------------------------

IDS = (0, 1, 2, 3, 4, 5)


def _rule(f: int) -> NeighbourhoodReweighting:
    return NeighbourhoodReweighting(tpm=make_tpm("loss"), crs=make_crs("loss_drop_highest", weighting="inverse"), num_byzantine=f)


def _inputs(losses, reports=None, vectors=None) -> RoundInputs:
    """Client 0's round: each candidate's row is its id (so a weighted sum says who counted),
    ``losses[i]`` the loss of ``ids[i]`` on its auxiliary data."""
    rows = torch.tensor([[float(i)] * 3 for i in IDS]) if vectors is None else vectors
    metrics = {"loss": torch.tensor(losses, dtype=torch.float64), "accuracy": torch.zeros(len(IDS), dtype=torch.float64)}
    finite = torch.isfinite(rows).all(dim=1)

    def evaluate(v):
        assert v.shape[0] == int(finite.sum())  # the finite candidates only, in id order
        return {key: value[finite] for key, value in metrics.items()}

    return RoundInputs(own_id=0, round=3, ids=IDS, vectors=rows, num_samples=(10,) * 6, evaluate=evaluate, reports=reports)


def test_the_rule_is_registered_and_takes_a_tpm_and_a_crs():
    assert RULE_REGISTRY.takes("neighbourhood_reweighting", "tpm", "crs")


def test_told_of_no_attacker_it_weighs_every_candidate_by_the_crs():
    agg = _rule(0)(_inputs([1.0, 1.0, 2.0, 1.0, 1.0, 1.0]))
    # Inverse losses: 1, 1, 0.5, 1, 1, 1 over 5.5.
    assert agg.weights[2] == pytest.approx(0.5 / 5.5) and agg.weights[0] == pytest.approx(1 / 5.5)
    # What it reports: the losses it measured.
    assert agg.scores == {0: 1.0, 1: 1.0, 2: 2.0, 3: 1.0, 4: 1.0, 5: 1.0}


def test_no_liar_the_one_witness_and_the_clients_own_values_leave_out_the_bad_candidate():
    # Client 0 finds 5 a little worse (1.2 over a median of 1.0); witness 1 reported 3.0 for it
    # on its own scale (its report's median is 1.0), witness 2 1.0. f = 1: leaving out 5 keeps a
    # worst of 1.0, leaving out witness 1 one of 1.2. The CRS (told of none here) weighs the
    # five kept by their inverse losses, all 1.0.
    reports = (None, HONEST[1] | {0: 1.0, 1: 1.0}, HONEST[2] | {2: 1.0}, None, None, None)
    agg = _rule(1)(_inputs([1.0, 1.0, 1.0, 1.0, 1.0, 1.2], reports))
    assert agg.weights[5] == 0.0
    assert [agg.weights[j] for j in range(5)] == pytest.approx([0.2] * 5)


def test_one_framing_liar_is_left_out_with_its_report():
    # Candidate 5 reports 9.0 for neighbours 1 and 2 and 1.0 for everyone else: on its own scale
    # (median 1.0) it frames 1 and 2 at 9.0. Every value of client 0 is 1.0. Leaving out 5
    # leaves a worst of 1.0; leaving out anyone else keeps a frame (9.0).
    liar = {0: 1.0, 1: 9.0, 2: 9.0, 3: 1.0, 4: 1.0, 5: 1.0}
    reports = (None, HONEST[1] | {1: 1.0}, HONEST[2] | {2: 1.0}, None, None, liar)
    agg = _rule(1)(_inputs([1.0] * 6, reports))
    assert agg.weights[5] == 0.0 and agg.weights[1] > 0 and agg.weights[2] > 0
    # The five kept, each at 1/5 (the CRS here is told of no attacker).
    assert [agg.weights[j] for j in range(5)] == pytest.approx([0.2] * 5)


def test_f_framing_liars_are_left_out():
    # 4 and 5 frame 1, 2 and 3: 9.0 on their own scale, which they keep low by reporting 1.0
    # for five others (clients 6 and 7 are no neighbours of client 0). 1 and 2 saw nothing
    # wrong. Leaving out 4 and 5 keeps a worst of 1.0; any other pair keeps a frame.
    liar = {0: 1.0, 1: 9.0, 2: 9.0, 3: 9.0, 4: 1.0, 5: 1.0, 6: 1.0, 7: 1.0}
    reports = (None, {0: 1.0, 2: 1.0, 3: 1.0}, {0: 1.0, 1: 1.0, 3: 1.0}, None, liar, liar)
    agg = _rule(2)(_inputs([1.0] * 6, reports))
    assert agg.weights[4] == agg.weights[5] == 0.0
    assert [agg.weights[j] for j in range(4)] == pytest.approx([0.25] * 4)


def test_a_liar_kept_when_told_of_none():
    liar = {0: 1.0, 1: 9.0, 2: 9.0, 3: 1.0, 4: 1.0, 5: 1.0}
    agg = _rule(0)(_inputs([1.0] * 6, (None, None, None, None, None, liar)))
    assert all(w == pytest.approx(1 / 6) for w in agg.weights.values())


def test_a_non_finite_candidate_weighs_nothing_and_reports_nan():
    rows = torch.tensor([[float(i)] * 3 for i in IDS])
    rows[3, 1] = math.nan
    agg = _rule(1)(_inputs([1.0, 1.0, 1.0, 1.0, 1.0, 2.0], vectors=rows))
    assert agg.weights[3] == 0.0 and math.isnan(agg.scores[3])
    # 5 is the worst of the finite neighbours on the client's own data: left out.
    assert agg.weights[5] == 0.0 and agg.weights[0] == pytest.approx(1 / 4)
    assert agg.model.tolist() == pytest.approx([(0 + 1 + 2 + 4) / 4] * 3)


def test_reports_must_line_up_with_the_candidates():
    with pytest.raises(ValueError, match="reports"):
        _inputs([1.0] * 6, (None, None))


def test_the_crs_is_told_of_no_attacker_among_those_kept():
    # Built as a scenario builds it, the CRS told f = 1 too: the rule leaves out the one it is
    # told of, and the CRS weighs the rest by their inverse losses without dropping another.
    rule = NeighbourhoodReweighting(
        tpm=make_tpm("loss"), crs=make_crs("loss_drop_highest", weighting="inverse", num_byzantine=1), num_byzantine=1,
    )
    agg = rule(_inputs([1.0, 1.0, 1.0, 2.0, 1.0, 4.0]))
    # Own values over the median (1.0): 5 is the worst, left out; 3 (2.0) is kept at half weight.
    assert agg.weights[5] == 0.0
    assert [agg.weights[j] for j in range(5)] == pytest.approx([1 / 4.5, 1 / 4.5, 1 / 4.5, 0.5 / 4.5, 1 / 4.5])


def test_krums_screen_first_drops_a_far_model_that_does_well_on_the_data():
    # Candidate 5 is far from the others (its row 50.0 against 0-4) and as good on the data.
    # Without the screen nothing tells it apart: the client's values tie, and the lowest id goes.
    # With it, Krum's score drops 5 first, then the consistency leaves out one of the rest
    # (told f = 1 for each stage: the tie again, 1).
    rows = torch.tensor([[float(i)] * 3 for i in IDS])
    rows[5] = 50.0
    plain = _rule(1)(_inputs([1.0] * 6, vectors=rows))
    assert plain.weights[1] == 0.0 and plain.weights[5] > 0
    screened = NeighbourhoodReweighting(
        tpm=make_tpm("loss"), crs=make_crs("loss_drop_highest", weighting="inverse"), num_byzantine=1, screen="krum",
    )(_inputs([1.0] * 6, vectors=rows))
    assert screened.weights[5] == 0.0 and screened.weights[1] == 0.0
    assert [screened.weights[j] for j in (0, 2, 3, 4)] == pytest.approx([0.25] * 4)
    with pytest.raises(ValueError, match="screen"):
        NeighbourhoodReweighting(tpm=make_tpm("loss"), crs=make_crs("loss_drop_highest"), screen="median")


# -- reputation over rounds ----------------------------------------------------------------------


def test_remembered_leaves_out_the_highest_rates_as_many_as_the_round_leaves_out():
    # Round 1 alone leaves out 2; 5 has been left out before (0.5), 2 never: with decay 0.5, 2's
    # rate becomes 0.5 * 0 + 0.5 * 1 = 0.5, 5's 0.5 * 0.5 = 0.25. 2 goes (the round's own
    # choice wins the tie-break only on equal rates; here 2's rate is the higher).
    kept, rates = remembered({5: 0.5}, {1, 3, 4, 5}, [1, 2, 3, 4, 5], 0.5)
    assert kept == {1, 3, 4, 5} and rates == {1: 0.0, 2: 0.5, 3: 0.0, 4: 0.0, 5: 0.25}
    # 5 has been left out in most rounds (0.9): with decay 0.9, 5's rate 0.81 is above 2's
    # 0.1, so 5 goes though this round kept it, and 2 is kept though this round left it out.
    kept, rates = remembered({5: 0.9}, {1, 3, 4, 5}, [1, 2, 3, 4, 5], 0.9)
    assert kept == {1, 2, 3, 4} and rates[5] == pytest.approx(0.81) and rates[2] == pytest.approx(0.1)


def test_remembered_keeps_the_rates_of_neighbours_not_judged_and_breaks_ties_by_the_round_then_id():
    kept, rates = remembered({7: 0.3}, {1, 2}, [1, 2, 3], 0.5)
    # 3 left out this round (0.5); 7 was no candidate: its rate stays and it is never chosen.
    assert kept == {1, 2} and rates == {1: 0.0, 2: 0.0, 3: 0.5, 7: 0.3}
    # Equal rates (none yet, none left out before): the round's choice stands.
    assert remembered(None, {1, 3}, [1, 2, 3], 0.5)[0] == {1, 3}
    # Equal rates and each left out this round or not alike: the lower id goes.
    assert remembered({1: 0.5, 2: 0.5}, {1, 2}, [1, 2], 0.5)[0] == {1, 2}
    assert remembered({1: 1.0, 2: 0.0}, {2}, [1, 2], 0.5)[0] == {2}


def test_the_rule_with_memory_carries_its_rates_to_the_next_round():
    rule = NeighbourhoodReweighting(
        tpm=make_tpm("loss"), crs=make_crs("loss_drop_highest", weighting="inverse"), num_byzantine=1, memory=0.75,
    )
    # Round one: 5 worst on the client's data, left out; its rate 0.25.
    first = rule(_inputs([1.0, 1.0, 1.0, 1.0, 1.0, 1.5]))
    assert first.weights[5] == 0.0 and first.memory == {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0, 5: 0.25}
    # Round two: 3 looks worst this round, 5 fine; alone the round would leave out 3 (rate
    # 0.25), but 5's 0.75 * 0.25 = 0.1875 is lower: 3 goes, and the rates say both.
    second = rule(dataclasses.replace(_inputs([1.0, 1.0, 1.0, 1.5, 1.0, 1.0]), memory=first.memory))
    assert second.weights[3] == 0.0 and second.memory[3] == 0.25 and second.memory[5] == pytest.approx(0.1875)
    # Left out round after round, 5 stays out in a round it looks best in.
    rates = {5: 0.9, 3: 0.1}
    third = rule(dataclasses.replace(_inputs([1.0, 1.0, 1.0, 1.5, 1.0, 0.9]), memory=rates))
    assert third.weights[5] == 0.0 and third.weights[3] > 0
    # Without memory, nothing kept; a memory of 1 or below 0 refused, naming the key.
    assert _rule(1)(_inputs([1.0] * 6)).memory is None
    for bad in (1.0, -0.1, math.nan):
        with pytest.raises(ValueError, match="memory"):
            NeighbourhoodReweighting(tpm=make_tpm("loss"), crs=make_crs("loss_drop_highest"), memory=bad)
