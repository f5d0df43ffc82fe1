"""A probe of trust from the neighbourhood, before it is built into the network.

Can a client tell a label flipper from an honest neighbour whose classes differ, once it hears
what its neighbours measured? This bench answers on the robustness table's setting
(``examples/byzantine_fmnist.toml`` at 200 rounds, the batched engine, seeds 43-46) with a
rule given to ``dfedrw run`` as a plugin (``neighbourhood_probe:NeighbourhoodProbe``, this
file), whose clients exchange their scores inside the batched engine's one process instead of
on the wire:

* Each honest client scores its candidates by their loss on its auxiliary data, divided by the
  median of those losses (so that clients with other data speak one scale), and *reports* those
  relative losses; a client hears its neighbours' reports of the round before (they travel
  beside the next model).
* A candidate's evidence is the highest of its own relative loss and the reports its
  neighbours made of it (never one of a sender about itself).
* ``variant``: ``own`` drops the ``f`` neighbours of highest own relative loss (no reports);
  ``evidence`` first leaves out the ``f`` reporters that disagree most with the others (the
  median, over the candidates they report, of their distance from the other reporters'
  median; a neighbour that sent no report counts as one left out), then drops the ``f``
  neighbours of highest evidence; ``evidence_krum`` drops Krum's ``f`` furthest first, then the
  ``f`` of highest evidence among the rest; ``subset`` leaves out the ``f`` neighbours, with
  their reports, whose leaving out makes the worst evidence of those kept lowest
  (:func:`consistent`); ``subset_distance`` does so with each candidate's own value raised to
  its Krum score over the median Krum score where that is higher. ``f`` is the rule's
  ``num_byzantine``. The kept candidates are weighed by their inverse loss, as the screened
  rule's CRS does.
* ``liars``: what a Byzantine neighbour reports (the senders that never aggregate are the
  Byzantine ones in the batched engine): ``silent`` nothing, ``frame`` the worst for every
  honest candidate and the best for the Byzantine ones, ``praise`` the best for all.

It is a probe, not a defence: the reports never leave the process, and it runs in the batched
engine only, one run a process.

    python bench/neighbourhood_probe.py
    python bench/neighbourhood_probe.py --variants own,evidence --attacks label_flip --partitions dirichlet:0.1 --liars frame
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "examples" / "byzantine_fmnist.toml"
PLUGIN = "neighbourhood_probe:NeighbourhoodProbe"
COLLUDING = {"decoy_stealth", "colluding_twins"}
VARIANTS = ("own", "evidence", "evidence_krum", "subset", "subset_distance")
LIARS = ("silent", "frame", "praise")
WORST = 100.0  # a framing liar's report of an honest candidate: far above any relative loss


def evidence(own: dict[int, float], reports: dict[int, dict[int, float]], left_out: int) -> dict[int, float]:
    """Per candidate of ``own`` (id -> the client's relative loss): the highest of its own value
    and the reports of the reporters kept, after leaving out the ``left_out`` reporters whose
    reports stray furthest from the others' median."""
    stray = {}
    for i, mine in reports.items():
        gaps = []
        for j, value in mine.items():
            others = sorted(rep[j] for o, rep in reports.items() if o != i and j in rep)
            if len(others) >= 2:
                gaps.append(abs(value - others[len(others) // 2]))
        stray[i] = sorted(gaps)[len(gaps) // 2] if gaps else 0.0
    dropped = set(sorted(stray, key=lambda i: (-stray[i], i))[:left_out])
    return {j: max([value] + [rep[j] for i, rep in reports.items() if i not in dropped and j in rep]) for j, value in own.items()}


def _rule():
    """The plugin class (built on first use: importing this file to run the bench needs no torch)."""
    import torch

    from dfedrw.peer.aggregation.neighbourhood import consistent, relative

    from dfedrw.peer.aggregation.candidates import finite_by_id
    from dfedrw.peer.aggregation.distance import krum_scores
    from dfedrw.peer.aggregation.inputs import Aggregate, RoundInputs, weighted_sum
    from dfedrw.peer.aggregation.rules import ToleratesByzantine
    from dfedrw.peer.aggregation.screened import krum_kept
    from dfedrw.peer.checked import check_choice

    reported: dict[tuple[int, int], dict[int, float]] = {}  # (round, client) -> its report
    honest: set[int] = set()  # the clients that aggregate

    @dataclass(frozen=True)
    class NeighbourhoodProbe(ToleratesByzantine):
        variant: str = "evidence"
        liars: str = "silent"

        @classmethod
        def check_settings(cls, s) -> None:
            super().check_settings(s)
            check_choice("NeighbourhoodProbe", "variant", s.variant, VARIANTS)
            check_choice("NeighbourhoodProbe", "liars", s.liars, LIARS)

        def __call__(self, inputs: RoundInputs) -> Aggregate:
            t, k, ids, f = inputs.round, inputs.own_id, inputs.ids, self.num_byzantine
            honest.add(k)
            loss = [float(x) for x in inputs.evaluate(inputs.vectors)["loss"]]
            mine = relative(loss)
            reported[(t, k)] = dict(zip(ids, mine, strict=True))
            reported.pop((t - 2, k), None)
            own = {j: mine[p] for p, j in enumerate(ids) if p}
            reports = {}
            for i in ids[1:]:
                if i in honest:
                    heard = reported.get((t - 1, i))
                elif self.liars == "silent" or t == 0:
                    heard = None
                else:
                    heard = {j: (WORST if j in honest else 0.0) if self.liars == "frame" else 0.0 for j in ids}
                if heard is not None:
                    reports[i] = {j: v for j, v in heard.items() if j in own and j != i}
            if self.variant == "own":
                scores = own
            elif self.variant in ("subset", "subset_distance"):
                values = own
                if self.variant == "subset_distance" and len(ids) > 2:
                    finite = finite_by_id(inputs)
                    spread = relative(krum_scores(finite, max(f, 1)))
                    values = {j: max(v, spread[finite.ids.index(j)]) if j in finite.ids else math.inf for j, v in own.items()}
                kept = consistent(values, reports, f)
                scores = {j: 0.0 if j in kept else math.inf for j in own}
            else:
                scores = evidence(own, reports, max(0, f - (len(ids) - 1 - len(reports))))
            screened: set[int] = set()
            if self.variant == "evidence_krum":
                finite = finite_by_id(inputs)
                passed = set(krum_kept(finite, f))
                screened = {j for p, j in enumerate(finite.ids) if p not in passed}
            rest = {j: s for j, s in scores.items() if j not in screened}
            dropped = screened | set(sorted(rest, key=lambda j: (-rest[j], -j))[:f])
            weights = [0.0 if j in dropped or not math.isfinite(x) else 1.0 / max(x, 1e-12) for j, x in zip(ids, loss, strict=True)]
            total = math.fsum(weights)
            weights = [w / total for w in weights]
            model = weighted_sum(inputs.vectors, torch.tensor(weights, dtype=torch.float64))
            return Aggregate(model=model, weights=dict(zip(ids, weights, strict=True)), scores=dict(zip(ids, loss, strict=True)))

    return NeighbourhoodProbe


def __getattr__(name: str):
    if name == "NeighbourhoodProbe":
        cls = _rule()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def one_run(variant: str, liars: str, partition: str, attack: str, seed: int, rounds: int, work: Path) -> dict:
    out = work / f"{variant}-{liars}-{partition.replace(':', '')}-{attack}-{seed}"
    table = f'aggregation."{PLUGIN}"'
    settings = [
        f"rounds={rounds}", f"eval.every={rounds}", "engine.name=batched", f"seed={seed}", f"data.partition={partition}",
        f"attack.name={attack}", f"attack.colluding={'true' if attack in COLLUDING else 'false'}",
        f"aggregation.rule={PLUGIN}", f"{table}.variant={variant}", f"{table}.liars={liars}",
    ]
    command = [sys.executable, "-m", "dfedrw.experiments.cli", "run", str(BASE), "--out", str(out)]
    for s in settings:
        command += ["--set", s]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "bench"), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"accuracy": summary["honest_mean_global_accuracy"], "byzantine_share": summary["byzantine_weight_share"] or 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="own,evidence,evidence_krum")
    parser.add_argument("--liars", default="frame", help="comma-separated: silent, frame, praise")
    parser.add_argument("--partitions", default="dirichlet:0.1")
    parser.add_argument(
        "--attacks", default="label_flip,gaussian,alie,ipm,min_max,min_sum,tpm_aware,dissensus,decoy_stealth,colluding_twins"
    )
    parser.add_argument("--seeds", default="43,44,45,46")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every cell here")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    cells = [
        (v, liar, p, a) for p in args.partitions.split(",") for a in args.attacks.split(",")
        for v in args.variants.split(",") for liar in (args.liars.split(",") if v != "own" else ["silent"])
    ]
    results = []
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {c: [pool.submit(one_run, *c, s, args.rounds, Path(tmp)) for s in seeds] for c in cells}
        print(f"{'partition':14} {'attack':16} {'variant':14} {'liars':7} {'accuracy %':>16} {'Byz. share':>10}", flush=True)
        for (v, liar, p, a), runs in futures.items():
            got = [f.result() for f in runs]
            acc = [g["accuracy"] for g in got]
            share = statistics.mean(g["byzantine_share"] for g in got)
            results.append({"partition": p, "attack": a, "variant": v, "liars": liar, "seeds": seeds, "accuracy": acc, "byzantine_share": share})
            spread = statistics.stdev(acc) if len(acc) > 1 else 0.0
            print(f"{p:14} {a:16} {v:14} {liar:7} {statistics.mean(acc):8.2f} ± {spread:5.2f} {share:10.3f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "cells": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
