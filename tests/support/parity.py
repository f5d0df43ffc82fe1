"""The engine parity cases and the comparison of two results folders
(``tests/integration/test_engine_parity.py`` says what is compared and why the tolerances are
what they are); shared by the tests that run the cases."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.attacks import ATTACK_REGISTRY
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.results.records import read_final, read_rounds
from tests.support.runs import quiet_console


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
SCREENED = (
    "aggregation.rule=screened_reweighting", "aggregation.tpm=loss", "aggregation.crs=loss_drop_highest",
    "aggregation.crs_params.loss_drop_highest.weighting=inverse",
)
# The neighbourhood rule, its clients sending their scores with their models.
NEIGHBOURHOOD = (
    "aggregation.rule=neighbourhood_reweighting", "aggregation.tpm=loss", "aggregation.crs=loss_drop_highest",
    "aggregation.crs_params.loss_drop_highest.weighting=inverse", "network.share_scores=true",
)
SOFTMAX = ("aggregation.rule=dfedreweighting", "aggregation.tpm=accuracy", "aggregation.crs=softmax")
# Graphs that change every round: Epidemic Learning's push to 3 random peers (directed), and a
# random 4-regular graph re-drawn each round (what a robust rule is told changes with it).
EPIDEMIC = ("topology.schedule=epidemic", "topology.schedule_params.epidemic.fanout=3")
REDRAW = ("topology.schedule=redraw", "topology.schedule_params.redraw.degree=4")


@dataclass(frozen=True)
class Case:
    id: str
    rule: str  # the aggregation.rule, for the weight tolerance
    overrides: tuple[str, ...]


def make_case(id: str, rule: tuple[str, ...] | str, attack: str, byzantine: int, *more: str) -> Case:
    rule_overrides = (f"aggregation.rule={rule}",) if isinstance(rule, str) else rule
    name = rule if isinstance(rule, str) else next(o.partition("=")[2] for o in rule if o.startswith("aggregation.rule="))
    return Case(id, name, (*rule_overrides, f"attack.name={attack}", f"topology.byzantine={byzantine}", *more))


# Every rule twice, every attack 3-5 times, each partition 8 times; two on a complete graph,
# the rest on Erdos-Renyi (rho 0.7).
CASES = [
    make_case("dfedavg-none-iid-complete", "dfedavg", "none", 0, IID, COMPLETE),
    make_case("dfedavg-gaussian-dirichlet", "dfedavg", "gaussian", 1, DIR),
    make_case("lossclip-gaussian-iid", LOSS_CLIP, "gaussian", 2, IID),
    make_case("lossclip-alie-dirichlet", LOSS_CLIP, "alie", 2, DIR),
    make_case("softmax-none-dirichlet", SOFTMAX, "none", 0, DIR),
    # T = 5 (scale 100): one aux sample more (1/24 = 4.2 points) is a factor exp(-0.83), so the
    # weights are graded; the default T = 0.1 (other case) gives almost one-hot weights.
    make_case("softmax-signflip-iid", (*SOFTMAX, "aggregation.crs_params.softmax.temperature=5"), "sign_flip", 1, IID),
    make_case("median-signflip-iid", "median", "sign_flip", 2, IID),
    make_case("median-alie-dirichlet", "median", "alie", 1, DIR),
    make_case("trimmedmean-gaussian-dirichlet", "trimmed_mean", "gaussian", 1, DIR),
    make_case("trimmedmean-alie-iid", "trimmed_mean", "alie", 2, IID),
    make_case("krum-gaussian-iid-complete", "krum", "gaussian", 1, IID, COMPLETE),
    make_case("krum-signflip-dirichlet", "krum", "sign_flip", 1, DIR),
    make_case("flame-alie-iid", "flame", "alie", 1, IID),
    make_case("flame-none-dirichlet", "flame", "none", 0, DIR),
    make_case("balance-signflip-dirichlet", "balance", "sign_flip", 2, DIR),
    make_case("balance-gaussian-iid", "balance", "gaussian", 1, IID),
    # The decentralized rules beyond the paper.
    make_case("clippedgossip-gaussian-dirichlet", "clipped_gossip", "gaussian", 2, DIR),
    make_case("clippedgossip-alie-iid", ("aggregation.rule=clipped_gossip", "aggregation.clipped_gossip.radius=spread"), "alie", 1, IID),
    make_case("ubar-signflip-dirichlet", "ubar", "sign_flip", 2, DIR),
    make_case("ubar-ipm-iid", "ubar", "ipm", 1, IID),
    make_case("csplusrg-alie-dirichlet", "cs_plus_rg", "alie", 1, DIR),
    make_case("csplusrg-gaussian-iid", "cs_plus_rg", "gaussian", 1, IID),
    make_case("normbound-gaussian-dirichlet", "norm_bound", "gaussian", 2, DIR),
    # With noise: each client's stream is seeded alike in both engines.
    make_case("normbound-alie-iid", ("aggregation.rule=norm_bound", "aggregation.norm_bound.noise=0.001"), "alie", 1, IID),
    # The attacks beyond the paper: the defence-aware, colluding, data-holding and silent ones.
    make_case("median-minmax-dirichlet", "median", "min_max", 2, DIR),
    make_case("trimmedmean-minsum-iid", "trimmed_mean", "min_sum", 2, IID),
    make_case("trimmedmean-fangtm-dirichlet", "trimmed_mean", "fang_trimmed_mean", 2, DIR),
    make_case("median-fangmedian-iid", "median", "fang_median", 1, IID),
    make_case("clippedgossip-dissensus-iid", "clipped_gossip", "dissensus", 2, IID),
    # Silent in the last round only: each engine reports the Byzantine neighbour missing there.
    # The client engine waits out a deadline for it; silent earlier, that wait would make the
    # clients two hops away miss their own deadlines (they wait as long for its neighbours), a
    # timing the batched engine, which has no deadlines, does not model.
    make_case(
        "dfedavg-omission-dirichlet", "dfedavg", "omission", 1, DIR,
        "attack.omission.every=1", f"attack.omission.start={FULL_ROUNDS - 1}",
    ),
    make_case("lossclip-tpmaware-iid", LOSS_CLIP, "tpm_aware", 1, IID),
    make_case("multikrum-tpmaware-dirichlet", "multi_krum", "tpm_aware", 2, DIR),
    # A decoy of 10x the mean: with the default 100x the honest models are driven so far that
    # within 60 rounds the decoy passes network.max_abs_value, its receivers refuse it, and the
    # client engine waits out the deadline for it (the same timing as a silent client).
    make_case("lossclip-decoystealth-iid", LOSS_CLIP, "decoy_stealth", 2, IID, "attack.colluding=true", "attack.decoy_stealth.decoy_scale=10"),
    make_case("dfedavg-labelflip-iid", "dfedavg", "label_flip", 2, IID),
    # The screened rule: the colluding twins played against it whole, and dissensus screened.
    make_case("screened-twins-dirichlet", SCREENED, "colluding_twins", 2, DIR, "attack.colluding=true"),
    make_case("screened-dissensus-iid", SCREENED, "dissensus", 2, IID),
    # The neighbourhood rule: what each client measured reaches its neighbours in both engines.
    make_case("neighbourhood-labelflip-dirichlet", NEIGHBOURHOOD, "label_flip", 2, DIR),
    make_case("neighbourhood-gaussian-iid", NEIGHBOURHOOD, "gaussian", 1, IID),
    make_case("neighbourhood-labelflip-dirichlet-framing", NEIGHBOURHOOD, "label_flip", 2, DIR, "attack.scores=frame"),
    # Reputation over rounds: each client's left-out rates carried from round to round.
    make_case(
        "neighbourhood-memory-twins-dirichlet-frameone", NEIGHBOURHOOD, "colluding_twins", 2, DIR, "attack.colluding=true",
        "attack.scores=frame_one", "aggregation.neighbourhood_reweighting.memory=0.9",
    ),
    # Reputation then strike: each attacker reads its standing in the scores its neighbours
    # report, and strikes when they rank it trusted, in both engines alike.
    make_case(
        "neighbourhood-memory-gaussian-dirichlet-trusted", NEIGHBOURHOOD, "gaussian", 2, DIR, "attack.strike=trusted", "attack.trusted_rounds=3",
        "aggregation.neighbourhood_reweighting.memory=0.9",
    ),
    # A backdoor, its success rate measured in both engines, and an attack window: the
    # attackers send the mean of what they know after round 20.
    make_case("dfedavg-badnets-iid-window", "dfedavg", "badnets", 2, IID, "attack.stop=20"),
    make_case("normbound-modelreplacement-iid", "norm_bound", "model_replacement", 2, IID),
    make_case("dfedavg-dba-colluding-dirichlet", "dfedavg", "dba", 2, DIR, "attack.colluding=true"),
    make_case("median-neurotoxin-iid-window", "median", "neurotoxin", 1, IID, "attack.start=5", "attack.stop=30"),
    # On-off: from round 4, two rounds of each six attack, the others send the mean they know.
    make_case("lossclip-gaussian-iid-onoff", LOSS_CLIP, "gaussian", 2, IID, "attack.start=4", "attack.period=6", "attack.on=2"),
    make_case("balance-alie-colluding-dirichlet", "balance", "alie", 2, DIR, "attack.colluding=true"),
    make_case("median-flood-iid", "median", "flood", 1, IID),
    # Schedules: each round's graph in both engines.
    make_case("lossclip-gaussian-dirichlet-epidemic", LOSS_CLIP, "gaussian", 2, DIR, *EPIDEMIC),
    make_case("trimmedmean-alie-iid-redraw", "trimmed_mean", "alie", 2, IID, *REDRAW),
    # Training beyond one plain SGD step: momentum and weight decay, a fifth of an epoch a round
    # (as many steps as each Dirichlet shard's size gives: they differ from client to client), a
    # cosine schedule, each minibatch cropped and flipped by each client's own generator.
    make_case(
        "lossclip-gaussian-dirichlet-momentum-epochs", LOSS_CLIP, "gaussian", 2, DIR, "train.momentum=0.9", "train.weight_decay=0.0005",
        "train.local_epochs=0.2", "train.lr_schedule=cosine", "data.augment=crop_flip", "data.augment_padding=1",
    ),
]
# A convolutional model (no layer plan: called once per model in the batched engine), compared
# over CNN_ROUNDS rounds only. Both engines compute its local steps and scores with the same
# calls (the same bits: measured, every train loss and score equal in rounds 0-3), but the
# weighted sums of the aggregation round differently (1 ulp), and a deep network trained with
# momentum amplifies that: measured on ResNet-20 below, the train losses first differ by 1 ulp
# in round 4 and the scores by 1e-4 in round 16, past CNN_ROUNDS, on an AVX2 machine; on an
# AVX-512 one (other kernels, the same 1-ulp start) the DFedAvg case's train losses differ by up
# to 5.6e-4 relative in rounds 8-9. Their train losses are compared within CNN_LOSS_RTOL; the
# senders, the weights and the missing neighbours as in every case.
CNN_ROUNDS = 10
CNN_LOSS_RTOL = 2e-3
CNN_CASES = [
    make_case("lossclip-gaussian-iid-resnet20", LOSS_CLIP, "gaussian", 1, IID, "train.model=resnet20", "train.momentum=0.5"),
    make_case("dfedavg-none-dirichlet-resnet20", "dfedavg", "none", 0, DIR, "train.model=resnet20", "train.weight_decay=0.001"),
]
BY_ID = {c.id: c for c in CASES}
# The default selection: the paper's rule on its default attack, DFedAvg (the batched engine's
# own sparse-product path) on Dirichlet shards, a rank-based rule, a coordinate-wise one, and a
# graph that changes every round (directed).
FAST = [
    BY_ID[i]
    for i in (
        "lossclip-gaussian-iid", "dfedavg-gaussian-dirichlet", "krum-signflip-dirichlet", "trimmedmean-alie-iid",
        "lossclip-gaussian-dirichlet-epidemic", "lossclip-gaussian-dirichlet-momentum-epochs",
    )
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


def engine_differences(batched: Path, threads: Path, *, rule: str, rounds: int, loss_rtol: float = LOSS_RTOL) -> list[str]:
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
            for key in ("neighbours", "sent_to", "told_byzantine"):  # a schedule's round graph
                if x.get(key) != y.get(key):
                    out.append(f"{at}: {key} batched {x.get(key)!r} / threads {y.get(key)!r}")
            if r >= STRICT_ROUNDS:
                continue
            if not all(_close(wa[s], wb[s], weight_atol) for s in wa):
                out.append(
                    f"{at}: weights differ by {_worst(wa, wb):.3g} > {weight_atol:g} ({rule})"
                    f"\n    batched weights {wa}\n    threads weights {wb}"
                )
            if not _close(x.get("train_loss"), y.get("train_loss"), WEIGHT_ATOL, loss_rtol):
                out.append(f"{at}: train loss batched {x.get('train_loss')!r} / threads {y.get('train_loss')!r}")
            ca, cb = x.get("scores"), y.get("scores")
            if (ca is None) != (cb is None) or (ca is not None and sorted(ca) != sorted(cb)):
                out.append(f"{at}: scored senders differ\n    batched scores {ca}\n    threads scores {cb}")
            elif ca is not None and not all(_close(ca[s], cb[s], WEIGHT_ATOL, LOSS_RTOL) for s in ca):
                out.append(f"{at}: scores differ by {_worst(ca, cb):.3g}\n    batched scores {ca}\n    threads scores {cb}")
            for metric in ("accuracy", "global_accuracy", "attack_success"):
                if (metric in x) != (metric in y) or not _close(x.get(metric), y.get(metric), ACC_TOL):
                    out.append(f"{at}: {metric} batched {x.get(metric)!r} / threads {y.get(metric)!r}")
        fa, fb = read_final(batched, k) or {}, read_final(threads, k) or {}
        for metric in ("accuracy", "global_accuracy", *(("attack_success",) if "attack_success" in fa or "attack_success" in fb else ())):
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
        for key in ("received_from", "silent_to", "pooled_from", "neighbours", "sent_to"):
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


def report_differences(case_id: str, problems: list[str], shown: int = 12) -> str:
    more = f"\n... and {len(problems) - shown} more" if len(problems) > shown else ""
    return f"{case_id}: the engines differ ({len(problems)} differences)\n" + "\n".join(problems[:shown]) + more


# Timing and process fields: the only ones that may differ between a run alone and in a batch.
CLOCK = {"wall_seconds", "loop_seconds", "loop_cpu_seconds", "loop_started_at", "pid", "launcher_pid", "pids"}


def _without_clock(value):
    if isinstance(value, dict):
        return {k: _without_clock(v) for k, v in value.items() if k not in CLOCK}
    if isinstance(value, list):
        return [_without_clock(v) for v in value]
    return value


def differences(alone: Path, together: Path) -> list[str]:
    """What differs between two results folders of one scenario, clock fields aside."""
    problems = []
    for path in sorted(alone.rglob("*")):
        if path.is_dir() or path.suffix not in {".jsonl", ".json", ".toml"}:
            continue
        other = together / path.relative_to(alone)
        if not other.exists():
            problems.append(f"{other} missing")
        elif path.suffix == ".json":
            if _without_clock(json.loads(path.read_text())) != _without_clock(json.loads(other.read_text())):
                problems.append(f"{path.relative_to(alone)} differs")
        elif path.read_bytes() != other.read_bytes():
            problems.append(f"{path.relative_to(alone)} differs")
    return problems
