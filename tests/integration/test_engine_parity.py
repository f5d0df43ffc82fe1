"""The batched engine and the client engine run the same experiment.

Each scenario below runs twice on ``digits``: once in the batched engine (``engine.name =
"batched"``: every honest model a row of one tensor) and once as clients (``engine.name =
"clients"`` with ``network.transport = "inproc"``: every client a thread running
``peer.node.Client``). Both draw the partition, graph, Byzantine placement, initial models,
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

The default selection runs ``FAST`` (4 scenarios, ``FAST_ROUNDS`` rounds) and the checks that
the comparison does detect a drift: another seed in one engine, another attack-noise stream,
another minibatch order, another initial model, another CRS setting (the last four patch
what ``launch/batched.py`` imports: its ``derive_seed`` and ``client_rule``). ``-m slow`` runs
all of ``CASES`` for ``FULL_ROUNDS`` rounds: each rule, each attack and each partition at least
twice.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.attacks import ATTACK_REGISTRY
from dfedrw.peer.config import load_scenario
from dfedrw.peer.results import read_final, read_rounds
from tests.helpers import quiet_console

STRICT_ROUNDS = 30
WEIGHT_ATOL = 1e-5
SHARE_ATOL = 0.02
SHARE_RULES = frozenset({"median", "trimmed_mean"})
LOSS_RTOL = 1e-4
ACC_TOL = 2.0
FAST_ROUNDS = 40
FULL_ROUNDS = 60

BASE = (
    "data.name=digits",
    "topology.honest=6",
    "train.lr=0.1",
    "eval.every=10",
    # Far above a round's duration even on a loaded machine: a client that missed a deadline
    # would make a genuine difference (a missing sender) the batched engine cannot have.
    "network.round_timeout=30",
)
ENGINES = {
    "batched": ("engine.name=batched",),
    "threads": ("engine.name=clients", "network.transport=inproc"),
}

IID = "data.partition=iid"
DIR = "data.partition=dirichlet:0.1"
COMPLETE = "topology.kind=complete"
LOSS_CLIP = ("aggregation.rule=dfedreweighting", "aggregation.tpm=loss", "aggregation.crs=loss_clip_mean")
SOFTMAX = ("aggregation.rule=dfedreweighting", "aggregation.tpm=accuracy", "aggregation.crs=softmax")


@dataclass(frozen=True)
class Case:
    id: str
    rule: str  # the aggregation.rule, for the weight tolerance
    overrides: tuple[str, ...]


def _case(id: str, rule: tuple[str, ...] | str, attack: str, byzantine: int, *more: str) -> Case:
    rule_overrides = (f"aggregation.rule={rule}",) if isinstance(rule, str) else rule
    name = rule if isinstance(rule, str) else next(o.partition("=")[2] for o in rule if o.startswith("aggregation.rule="))
    return Case(id, name, (*rule_overrides, f"attack.name={attack}", f"topology.byzantine={byzantine}", *more))


# Every rule twice, every attack 3-5 times, each partition 8 times; two on a complete graph,
# the rest on Erdos-Renyi (rho 0.7).
CASES = [
    _case("dfedavg-none-iid-complete", "dfedavg", "none", 0, IID, COMPLETE),
    _case("dfedavg-gaussian-dirichlet", "dfedavg", "gaussian", 1, DIR),
    _case("lossclip-gaussian-iid", LOSS_CLIP, "gaussian", 2, IID),
    _case("lossclip-alie-dirichlet", LOSS_CLIP, "alie", 2, DIR),
    _case("softmax-none-dirichlet", SOFTMAX, "none", 0, DIR),
    # T = 5 (scale 100): one aux sample more (1/24 = 4.2 points) is a factor exp(-0.83), so the
    # weights are graded; the default T = 0.1 (other case) gives almost one-hot weights.
    _case("softmax-signflip-iid", (*SOFTMAX, "aggregation.crs_params.softmax.temperature=5"), "sign_flip", 1, IID),
    _case("median-signflip-iid", "median", "sign_flip", 2, IID),
    _case("median-alie-dirichlet", "median", "alie", 1, DIR),
    _case("trimmedmean-gaussian-dirichlet", "trimmed_mean", "gaussian", 1, DIR),
    _case("trimmedmean-alie-iid", "trimmed_mean", "alie", 2, IID),
    _case("krum-gaussian-iid-complete", "krum", "gaussian", 1, IID, COMPLETE),
    _case("krum-signflip-dirichlet", "krum", "sign_flip", 1, DIR),
    _case("flame-alie-iid", "flame", "alie", 1, IID),
    _case("flame-none-dirichlet", "flame", "none", 0, DIR),
    _case("balance-signflip-dirichlet", "balance", "sign_flip", 2, DIR),
    _case("balance-gaussian-iid", "balance", "gaussian", 1, IID),
    # The decentralized rules beyond the paper.
    _case("clippedgossip-gaussian-dirichlet", "clipped_gossip", "gaussian", 2, DIR),
    _case("clippedgossip-alie-iid", ("aggregation.rule=clipped_gossip", "aggregation.clipped_gossip.radius=spread"), "alie", 1, IID),
    _case("ubar-signflip-dirichlet", "ubar", "sign_flip", 2, DIR),
    _case("ubar-ipm-iid", "ubar", "ipm", 1, IID),
    _case("csplusrg-alie-dirichlet", "cs_plus_rg", "alie", 1, DIR),
    _case("csplusrg-gaussian-iid", "cs_plus_rg", "gaussian", 1, IID),
    # The attacks beyond the paper: the defence-aware, colluding, data-holding and silent ones.
    _case("median-minmax-dirichlet", "median", "min_max", 2, DIR),
    _case("trimmedmean-minsum-iid", "trimmed_mean", "min_sum", 2, IID),
    _case("trimmedmean-fangtm-dirichlet", "trimmed_mean", "fang_trimmed_mean", 2, DIR),
    _case("median-fangmedian-iid", "median", "fang_median", 1, IID),
    _case("clippedgossip-dissensus-iid", "clipped_gossip", "dissensus", 2, IID),
    # Silent in the last round only: each engine reports the Byzantine neighbour missing there.
    # The client engine waits out a deadline for it; silent earlier, that wait would make the
    # clients two hops away miss their own deadlines (they wait as long for its neighbours), a
    # timing the batched engine, which has no deadlines, does not model.
    _case(
        "dfedavg-omission-dirichlet", "dfedavg", "omission", 1, DIR,
        "attack.omission.every=1", f"attack.omission.start={FULL_ROUNDS - 1}",
    ),
    _case("lossclip-tpmaware-iid", LOSS_CLIP, "tpm_aware", 1, IID),
    _case("multikrum-tpmaware-dirichlet", "multi_krum", "tpm_aware", 2, DIR),
    # A decoy of 10x the mean: with the default 100x the honest models are driven so far that
    # within 60 rounds the decoy passes network.max_abs_value, its receivers refuse it, and the
    # client engine waits out the deadline for it (the same timing as a silent client).
    _case("lossclip-decoystealth-iid", LOSS_CLIP, "decoy_stealth", 2, IID, "attack.colluding=true", "attack.decoy_stealth.decoy_scale=10"),
    _case("dfedavg-labelflip-iid", "dfedavg", "label_flip", 2, IID),
    _case("balance-alie-colluding-dirichlet", "balance", "alie", 2, DIR, "attack.colluding=true"),
    _case("median-flood-iid", "median", "flood", 1, IID),
]
BY_ID = {c.id: c for c in CASES}
# The default selection: the paper's rule on its default attack, DFedAvg (the batched engine's
# own sparse-product path) on Dirichlet shards, a rank-based rule, a coordinate-wise one.
FAST = [
    BY_ID[i] for i in ("lossclip-gaussian-iid", "dfedavg-gaussian-dirichlet", "krum-signflip-dirichlet", "trimmedmean-alie-iid")
]


def scenario(case: Case, engine: str, rounds: int, *extra: str):
    return load_scenario(None, [*BASE, *case.overrides, f"rounds={rounds}", *ENGINES[engine], *extra])


def run_engine(case: Case, engine: str, rounds: int, out: Path, *extra: str) -> Path:
    run_scenario(scenario(case, engine, rounds, *extra), out, console=quiet_console())
    return out


# -- the comparison ----------------------------------------------------------------------------
def _num(x: Any) -> float | None:
    return None if x is None else float(x)


def _close(a: Any, b: Any, atol: float, rtol: float = 0.0) -> bool:
    a, b = _num(a), _num(b)
    if a is None or b is None or math.isnan(a) or math.isnan(b):
        return (a is None) == (b is None) and (a is None or math.isnan(a) == math.isnan(b))
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * max(abs(a), abs(b))


def _worst(x: dict[str, Any], y: dict[str, Any]) -> float:
    diffs = [abs(_num(x[s]) - _num(y[s])) for s in x if s in y and x[s] is not None and y[s] is not None]
    return max(diffs, default=float("nan"))


def engine_differences(batched: Path, threads: Path, *, rule: str, rounds: int) -> list[str]:
    """Every way the batched run ``batched`` and the client run ``threads`` of one scenario
    differ beyond rounding (the tolerances of the module docstring), one line per difference:
    which client, which round, what, and both values. Empty when they agree."""
    out: list[str] = []
    sa = json.loads((batched / "summary.json").read_text())
    sb = json.loads((threads / "summary.json").read_text())
    for name, s in (("batched", sa), ("threads", sb)):
        if s.get("failed_peers"):
            out.append(f"{name} run: failed clients {s['failed_peers']}")
    roles_a = {k: p["role"] for k, p in sa["peers"].items()}
    roles_b = {k: p["role"] for k, p in sb["peers"].items()}
    if roles_a != roles_b:
        out.append(f"roles differ: batched {roles_a} / threads {roles_b}")
        return out
    weight_atol = SHARE_ATOL if rule in SHARE_RULES else WEIGHT_ATOL
    for key in sorted((k for k, r in roles_a.items() if r == "byzantine"), key=int):
        out += _byzantine_differences(batched, threads, int(key), rounds)
    for key in sorted((k for k, r in roles_a.items() if r == "honest"), key=int):
        k = int(key)
        ra, rb = read_rounds(batched, k), read_rounds(threads, k)
        where = f"client {k}"
        if [r["round"] for r in ra] != list(range(rounds)) or [r["round"] for r in rb] != list(range(rounds)):
            out.append(f"{where}: rounds logged: batched {len(ra)}, threads {len(rb)}, expected 0..{rounds - 1}")
            continue
        for x, y in zip(ra, rb, strict=True):
            r = x["round"]
            at = f"{where}, round {r}"
            wa, wb = x["weights"], y["weights"]
            if sorted(wa, key=int) != sorted(wb, key=int):
                out.append(f"{at}: different senders\n    batched weights {wa}\n    threads weights {wb}")
                continue
            if x.get("missing") != y.get("missing"):
                out.append(f"{at}: missing neighbours batched {x.get('missing')} / threads {y.get('missing')}")
            if r >= STRICT_ROUNDS:
                continue
            if not all(_close(wa[s], wb[s], weight_atol) for s in wa):
                out.append(
                    f"{at}: weights differ by {_worst(wa, wb):.3g} > {weight_atol:g} ({rule})"
                    f"\n    batched weights {wa}\n    threads weights {wb}"
                )
            if not _close(x.get("train_loss"), y.get("train_loss"), WEIGHT_ATOL, LOSS_RTOL):
                out.append(f"{at}: train loss batched {x.get('train_loss')!r} / threads {y.get('train_loss')!r}")
            ca, cb = x.get("scores"), y.get("scores")
            if (ca is None) != (cb is None) or (ca is not None and sorted(ca) != sorted(cb)):
                out.append(f"{at}: scored senders differ\n    batched scores {ca}\n    threads scores {cb}")
            elif ca is not None and not all(_close(ca[s], cb[s], WEIGHT_ATOL, LOSS_RTOL) for s in ca):
                out.append(f"{at}: scores differ by {_worst(ca, cb):.3g}\n    batched scores {ca}\n    threads scores {cb}")
            for metric in ("accuracy", "global_accuracy"):
                if (metric in x) != (metric in y) or not _close(x.get(metric), y.get(metric), ACC_TOL):
                    out.append(f"{at}: {metric} batched {x.get(metric)!r} / threads {y.get(metric)!r}")
        fa, fb = read_final(batched, k) or {}, read_final(threads, k) or {}
        for metric in ("accuracy", "global_accuracy"):
            a, b = fa.get(metric), fb.get(metric)
            if a is None or b is None or not _close(a, b, ACC_TOL):
                out.append(f"{where}: final {metric} batched {a!r} / threads {b!r} (tolerance {ACC_TOL} points)")
    return out


# What a Byzantine client's round record must hold alike in both engines, every round: whom it
# heard, to how many it was silent, whose pool it used, and what its attack noted: its words
# exactly, its numbers (a step size found by search, a loss) within the score tolerance in the
# strict window (after it, only the words); a plan digest hashes such numbers, so it is left out.
def _byzantine_differences(batched: Path, threads: Path, b: int, rounds: int) -> list[str]:
    ra, rb = read_rounds(batched, b), read_rounds(threads, b)
    if len(ra) != rounds or len(rb) != rounds:
        return [f"Byzantine client {b}: rounds logged: batched {len(ra)}, threads {len(rb)}, expected {rounds}"]
    out = []
    for x, y in zip(ra, rb, strict=True):
        at = f"Byzantine client {b}, round {x['round']}"
        for key in ("received_from", "silent_to", "pooled_from"):
            if x.get(key) != y.get(key):
                out.append(f"{at}: {key} batched {x.get(key)!r} / threads {y.get(key)!r}")
        na, nb = dict(x.get("attack") or {}), dict(y.get("attack") or {})
        na.pop("plan", None)
        nb.pop("plan", None)
        if not _notes_agree(na, nb, strict=x["round"] < STRICT_ROUNDS):
            out.append(f"{at}: attack note batched {x.get('attack')!r} / threads {y.get('attack')!r}")
    return out


def _notes_agree(a: Any, b: Any, *, strict: bool) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_notes_agree(a[k], b[k], strict=strict) for k in a)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return not strict or _close(a, b, WEIGHT_ATOL, LOSS_RTOL)
    if isinstance(a, (int, float)) != isinstance(b, (int, float)) and (a is None or b is None):
        return not strict
    return a == b


def _report(case_id: str, problems: list[str], shown: int = 12) -> str:
    more = f"\n... and {len(problems) - shown} more" if len(problems) > shown else ""
    return f"{case_id}: the engines differ ({len(problems)} differences)\n" + "\n".join(problems[:shown]) + more


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


def check_parity(case: Case, rounds: int, tmp_path: Path, threads_run) -> None:
    batched = run_engine(case, "batched", rounds, tmp_path / "batched")
    problems = engine_differences(batched, threads_run(case, rounds), rule=case.rule, rounds=rounds)
    assert not problems, _report(case.id, problems)


@pytest.mark.parametrize("case", FAST, ids=lambda c: c.id)
def test_engines_agree(case, tmp_path, threads_run):
    check_parity(case, FAST_ROUNDS, tmp_path, threads_run)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_engines_agree_full(case, tmp_path, threads_run):
    check_parity(case, FULL_ROUNDS, tmp_path, threads_run)


def test_cases_cover_every_rule_attack_and_partition():
    rules = {c.rule for c in CASES} | {"softmax" for c in CASES if "aggregation.crs=softmax" in c.overrides}
    rules |= {"loss_clip" for c in CASES if "aggregation.crs=loss_clip_mean" in c.overrides}
    attacks = {o.partition("=")[2] for c in CASES for o in c.overrides if o.startswith("attack.name=")}
    partitions = {o.partition("=")[2] for c in CASES for o in c.overrides if o.startswith("data.partition=")}
    assert rules >= {"dfedavg", "softmax", "loss_clip", "median", "trimmed_mean", "krum", "flame", "balance", "clipped_gossip", "ubar", "cs_plus_rg"}
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
    from dfedrw.launch import batched

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
    from dfedrw.launch import batched

    build = batched.client_rule
    other = scenario(DRIFT_CASE, "batched", FAST_ROUNDS, "aggregation.crs_params.loss_clip_mean.weighting=uniform")
    monkeypatch.setattr(batched, "client_rule", lambda sc, topology, k: build(other, topology, k))
    problems = _drifted(tmp_path, threads_run)
    assert any(", round 0: weights differ" in p for p in problems), problems[:5]
