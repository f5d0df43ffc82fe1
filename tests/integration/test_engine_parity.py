"""The batched engine and the client engine run the same experiment.

Each scenario below runs twice on ``digits``: once in the batched engine (``engine.name =
"batched"``: every honest model a row of one tensor) and once as clients (``engine.name =
"clients"`` with ``network.transport = "inproc"``: every client a thread running
``peer.client.client.Client``). Both draw the partition, graph, Byzantine placement, initial models,
minibatches, attack noise and rule randomness from the same seeds, so the runs may differ only
in float rounding: the batched engine computes the local step as batched matrix products (and
DFedAvg as one sparse product for all clients), which sum in another order than one client's
``nn.Linear``. :func:`engine_differences` compares, per honest client:

* every round, exactly: the sender ids of the logged weights (the same senders every round,
  zero weights included) and the ``missing`` neighbours; and the roles, the number of rounds,
  no failed client;
* in the first ``STRICT_ROUNDS`` rounds, within a tolerance: the weight given to each sender,
  the logged scores, the train loss, and the accuracies of the evaluation rounds;
* at the end: the final local and global test accuracy.

Measured differences (CPU, torch single-threaded, the batched engine of commit 108d400: local
steps as batched matrix products, DFedAvg as one sparse product; the 16 ``CASES`` below run for
100 rounds, i.e. past ``FULL_ROUNDS``):

* sender ids and ``missing``: identical in every round of every scenario;
* final accuracies: identical (difference 0.0) in every scenario; evaluation-round accuracies
  identical except median (sign flip, IID), client 0, round 89: one test prediction (0.30
  points local, 0.28 global), after its coordinate flips (next item);
* weights: identical in 13 scenarios; DFedReweighting with loss clipping (2 scenarios) differs
  by 1e-6, one step of the log's 6-decimal rounding; the median (sign flip, IID) first differs
  in round 42, by one coordinate's share (0.0011), and by up to 0.0089 later;
* scores (DFedReweighting): relative difference <= 9.6e-7 (the log's rounding);
* train loss: relative difference <= 3.2e-7 in rounds 0-29 (each engine computes the loss of
  the same minibatch and model with its own products; 1.0e-6 for the median); later up to
  4.7e-4 for the median, after its first coordinate flip; <= 3.4e-7 in all other scenarios.

The same scenarios were rerun with the batched engine's gradients moved by 4 ulps (every
nonzero entry, random direction: what a reordered sum does to them; zeros stay zero), to see
how far a future, differently summed code path can move things: only the coordinate-wise rules
changed. The median's first difference came in round 27 (0.0011, one coordinate; round 35 with
1 ulp), the median on Dirichlet shards' in round 55 (0.0008), trimmed mean's in round 47
(0.0015); the train loss of rounds 0-29 stayed within 1.9e-6 relative; accuracies as above.
Moving every *model* entry by one ulp instead (which also breaks the exact ties of the
coordinates no client's data touch, something no summation order does) moves the median and
trimmed-mean shares from round 0, by up to 0.073; every other rule stays identical.

Hence the tolerances (all far above rounding, far below what a drift in seeds or rules gives,
see the ``test_comparison_detects_*`` tests):

* ``WEIGHT_ATOL = 1e-5``: ten steps of the log's 6-decimal rounding. Measured: <= 1e-6.
  Another minibatch order moves round-0 weights by 1e-3, another initial model by 9e-5.
* ``SHARE_ATOL = 0.02`` for ``median`` and ``trimmed_mean``, whose logged weight is a
  candidate's share of the coordinates where it is (one of) the kept value(s): one coordinate
  of the 650 of digits' softmax regression flipping between two near-equal candidates moves a
  share by ~0.0015; 0.02 allows ~13 such flips. Measured: 0 in rounds 0-29 (0.0011 with
  4-ulp gradients).
* ``STRICT_ROUNDS = 30``: the window in which weights, scores, losses and evaluation
  accuracies are compared. A close decision (a clip at the mean, a Krum or median rank, a
  FLAME cluster, a BALANCE radius) that one engine's rounding flips makes the runs part ways
  from that round on, and nothing bounds the weights after a flip (Krum's move from one
  candidate to another is a difference of 1). No decision flipped before round 42 with the
  engines as they are, nor before round 27 with 4-ulp gradients (and that flip is within
  ``SHARE_ATOL``). After the window sender ids and ``missing`` are still compared exactly.
* ``LOSS_RTOL = 1e-4`` (plus ``WEIGHT_ATOL``), also for scores: measured <= 1.0e-6 (1.9e-6
  with 4-ulp gradients); another minibatch order, initial model or attack draw moves the
  round-0 train losses or scores by 0.2 % (a score) to tens of percent.
* ``ACC_TOL = 2.0`` points, for the final accuracies and the evaluation rounds in the window:
  equal models give equal predictions unless two logits are within rounding of each other;
  2 points is one flipped prediction on the smallest Dirichlet local test set here (73 samples,
  1.37 points each) and 7 on the global test set (360). Measured: 0.0 for every final
  accuracy and in every evaluation round of the window.

If a new batched code path makes this test fail, look at the first difference it reports: a
different sender set, or weights apart in round 0, is a bug; a single close decision flipping
late in the window (one coordinate share, a clip at the mean between two nearly equal losses)
is rounding, and the measurement above is what to redo before moving ``STRICT_ROUNDS``.

The default selection runs ``FAST`` (6 scenarios, ``FAST_ROUNDS`` rounds) and the checks that
the comparison does detect a drift: another seed in one engine, another attack-noise stream,
another minibatch order, another initial model, another CRS setting (the last four patch
what ``engines/run.py`` imports: its ``derive_seed`` and ``client_rule``). ``-m slow`` runs
the rest of ``CASES`` for ``FULL_ROUNDS`` rounds: with ``FAST``, each rule, each attack and each
partition at least twice.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dfedrw.peer.attacks import ATTACK_REGISTRY
from dfedrw.peer.config.scenario import load_scenario
from tests.support.parity import (
    BY_ID, CASES, CNN_CASES, CNN_LOSS_RTOL, CNN_ROUNDS, FAST, FAST_ROUNDS, FULL_ROUNDS, Case, engine_differences, report_differences, run_engine, scenario,
)


# -- runs shared by the tests of this module -----------------------------------------------------
@pytest.fixture(scope="module")
def threads_run(tmp_path_factory):
    """(case, rounds) -> the client engine's results folder, run once per module."""
    done: dict[tuple[str, int], Path] = {}

    def get(case: Case, rounds: int) -> Path:
        if (case.id, rounds) not in done:
            done[(case.id, rounds)] = run_engine(case, "threads", rounds, tmp_path_factory.mktemp(case.id) / "threads")
        return done[(case.id, rounds)]

    return get


def check_parity(case: Case, rounds: int, tmp_path: Path, threads_run, **tolerances) -> None:
    batched = run_engine(case, "batched", rounds, tmp_path / "batched")
    problems = engine_differences(batched, threads_run(case, rounds), rule=case.rule, rounds=rounds, **tolerances)
    assert not problems, report_differences(case.id, problems)


@pytest.mark.parametrize("case", FAST, ids=lambda c: c.id)
def test_engines_agree(case, tmp_path, threads_run):
    check_parity(case, FAST_ROUNDS, tmp_path, threads_run)


# The default selection's cases are checked there (FAST_ROUNDS, past STRICT_ROUNDS already):
# the slow one runs every other case.
@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c not in FAST], ids=lambda c: c.id)
def test_engines_agree_full(case, tmp_path, threads_run):
    check_parity(case, FULL_ROUNDS, tmp_path, threads_run)


@pytest.mark.slow
@pytest.mark.parametrize("case", CNN_CASES, ids=lambda c: c.id)
def test_engines_agree_on_a_convolutional_model(case, tmp_path, threads_run):
    check_parity(case, CNN_ROUNDS, tmp_path, threads_run, loss_rtol=CNN_LOSS_RTOL)


def test_cases_cover_every_rule_attack_and_partition():
    rules = {c.rule for c in CASES} | {"softmax" for c in CASES if "aggregation.crs=softmax" in c.overrides}
    rules |= {"loss_clip" for c in CASES if "aggregation.crs=loss_clip_mean" in c.overrides}
    attacks = {o.partition("=")[2] for c in CASES for o in c.overrides if o.startswith("attack.name=")}
    partitions = {o.partition("=")[2] for c in CASES for o in c.overrides if o.startswith("data.partition=")}
    assert rules >= {"dfedavg", "softmax", "loss_clip", "median", "trimmed_mean", "krum", "flame", "balance", "clipped_gossip", "ubar", "cs_plus_rg", "norm_bound", "screened_reweighting", "neighbourhood_reweighting"}
    assert attacks >= {"none", *ATTACK_REGISTRY.builtin_names()}
    assert partitions >= {"iid", "dirichlet:0.1"}
    assert len({c.id for c in CASES}) == len(CASES)


# -- the comparison is not vacuous: drifts are detected ------------------------------------------
DRIFT_CASE = BY_ID["lossclip-gaussian-iid"]


def _drifted(tmp_path: Path, threads_run, *extra: str) -> list[str]:
    batched = run_engine(DRIFT_CASE, "batched", FAST_ROUNDS, tmp_path / "batched", *extra)
    return engine_differences(batched, threads_run(DRIFT_CASE, FAST_ROUNDS), rule=DRIFT_CASE.rule, rounds=FAST_ROUNDS)


def _in_round_0(problems: list[str]) -> bool:
    return any(p.startswith("roles differ") or ", round 0:" in p for p in problems)


def test_comparison_detects_a_different_seed(tmp_path, threads_run):
    seed = load_scenario(None, []).seed
    problems = _drifted(tmp_path, threads_run, f"seed={seed + 1}")
    assert problems and _in_round_0(problems), problems[:5]


def _shift_stream(monkeypatch, stream: str) -> None:
    """The batched engine draws ``stream`` (its first ``derive_seed`` label) from another seed."""
    from dfedrw.engines import run as batched
    if stream == "init":  # drawn by the clients' own function, which the engine calls
        initial = batched.initial_model
        monkeypatch.setattr(batched, "initial_model", lambda sc, k: initial(replace(sc, seed=sc.seed + 1), k))
        return
    derive = batched.derive_seed

    def shifted(seed, *labels):
        return derive(seed + 1 if labels and labels[0] == stream else seed, *labels)

    monkeypatch.setattr(batched, "derive_seed", shifted)


def test_comparison_detects_another_attack_noise(tmp_path, threads_run, monkeypatch):
    # The Byzantine models are clipped (weight 0) whatever their noise: the scores (their
    # losses) are what shows it.
    _shift_stream(monkeypatch, "attack")
    problems = _drifted(tmp_path, threads_run)
    assert any(", round 0: scores differ" in p for p in problems), problems[:5]


@pytest.mark.parametrize("stream", ["batches", "init"], ids=["minibatch-order", "initial-model"])
def test_comparison_detects_another_model_stream(stream, tmp_path, threads_run, monkeypatch):
    _shift_stream(monkeypatch, stream)
    problems = _drifted(tmp_path, threads_run)
    assert any(", round 0: train loss" in p for p in problems), problems[:5]
    assert any(", round 0: weights differ" in p for p in problems), problems[:5]


def test_comparison_detects_another_rule_setting(tmp_path, threads_run, monkeypatch):
    """One engine's rule drifts (loss clip weighting uniform instead of proportional)."""
    from dfedrw.engines import run as batched
    from dfedrw.peer.round.told import ToldRules

    other = scenario(DRIFT_CASE, "batched", FAST_ROUNDS, "aggregation.crs_params.loss_clip_mean.weighting=uniform")

    class Drifted(ToldRules):  # the batched engine's rules built from the other setting
        def __init__(self, sc, topology, clients, **options):
            super().__init__(other, topology, clients, **options)

    monkeypatch.setattr(batched, "ToldRules", Drifted)
    problems = _drifted(tmp_path, threads_run)
    assert any(", round 0: weights differ" in p for p in problems), problems[:5]
