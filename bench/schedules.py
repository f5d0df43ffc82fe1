"""A fixed Erdos-Renyi graph against Epidemic Learning of the same mean degree: accuracy and traffic.

DFedAvg and DFedReweighting (loss TPM, loss clipped at the mean: the project's default pair) on
Fashion-MNIST, IID and Dirichlet(0.1) shards over 10 honest clients (no Byzantine ones), softmax
regression, lr 0.01, batch 32 (the paper's setting), each on

* ``fixed``: the paper's Erdos-Renyi graph (rho 0.7, re-drawn until connected), every round;
* ``epidemic``: Epidemic Learning's push (``topology.schedule = "epidemic"``): each round every
  client sends to ``fanout`` peers drawn uniformly, ``fanout`` = the fixed graph's mean degree
  rounded (each client then receives ``fanout`` models a round on average, as on the graph).

All runs of a seed go through the batched engine as one batch (the same experiment as the
client engine, see tests/integration/test_engine_parity.py). Printed: the honest clients' mean
local test accuracy (and global) after each of ``--at`` rounds, the mean degree, the models sent
(the batched engine sends nothing over a wire: every model a client sends another in a round is
counted from the graph of the round) and the bytes they are (models x the model's raw float32
bytes; a gRPC message adds a header of about a hundred bytes to each).

    python bench/schedules.py                       # seed 43, 3,000 rounds, accuracies at 500 and 3,000
    python bench/schedules.py --seeds 43 44 --rounds 1000 --at 500 1000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

RULES = {"dfedavg": ("aggregation.rule=dfedavg",), "dfedreweighting": ("aggregation.rule=dfedreweighting", "aggregation.tpm=loss", "aggregation.crs=loss_clip_mean")}
PARTITIONS = {"iid": "iid", "dir0.1": "dirichlet:0.1"}


def base(seed: int, rounds: int, every: int) -> list[str]:
    return [
        f"seed={seed}", f"rounds={rounds}", f"eval.every={every}", "data.name=fashion-mnist", "train.lr=0.01", "train.batch_size=32",
        "topology.kind=erdos_renyi", "topology.rho=0.7", "topology.honest=10", "topology.byzantine=0", "attack.name=none",
        "engine.name=batched", "checkpoint.every=0",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[43])
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--at", type=int, nargs="+", default=[500, 3000], help="rounds after which accuracy is reported")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if max(args.at) > args.rounds:
        parser.error("--at rounds must not exceed --rounds")
    every = int(np.gcd.reduce(args.at))

    from dfedrw.engines.together import run_together
    from dfedrw.engines.run import BatchedRun
    from dfedrw.peer.config.scenario import load_scenario
    from dfedrw.peer.wiring.plan import scenario_graphs
    from dfedrw.peer.results.records import read_rounds
    from dfedrw.peer.wiring.build import scenario_model_specs

    torch.set_num_threads(1)
    rows = []
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="schedules-bench-"))
    try:
        for seed in args.seeds:
            fixed_degree = scenario_graphs(load_scenario(None, base(seed, args.rounds, every))).mean_degree(1)
            fanout = max(1, round(fixed_degree))
            graphs = {"fixed": (), "epidemic": ("topology.schedule=epidemic", f"topology.schedule_params.epidemic.fanout={fanout}")}
            runs, names = [], []
            for rule, rule_set in RULES.items():
                for part, partition in PARTITIONS.items():
                    for graph, graph_set in graphs.items():
                        sc = load_scenario(None, [*base(seed, args.rounds, every), f"data.partition={partition}", *rule_set, *graph_set])
                        names.append((seed, rule, part, graph, sc))
                        runs.append(BatchedRun(sc, work / f"{seed}-{rule}-{part}-{graph}"))
            print(f"seed {seed}: {len(runs)} runs of {args.rounds} rounds as one batch (fixed graph mean degree {fixed_degree:.2f}, "
                  f"epidemic fanout {fanout})", file=sys.stderr)
            t0 = time.monotonic()
            run_together(runs, lambda r: (r + 1) % 500 == 0 and print(f"  round {r + 1}", file=sys.stderr))
            print(f"  {time.monotonic() - t0:.0f} s", file=sys.stderr)
            for (seed_, rule, part, graph, sc), run in zip(names, runs, strict=True):
                g = scenario_graphs(sc)
                messages = sum(g.messages(r) for r in range(args.rounds))
                model_bytes = sum(s.nbytes for s in scenario_model_specs(sc))
                accuracy, global_accuracy = {}, {}
                for at in args.at:
                    recs = [read_rounds(run.out_dir, k)[at - 1] for k in run.honest]
                    accuracy[at] = float(np.mean([r["accuracy"] for r in recs]))
                    global_accuracy[at] = float(np.mean([r["global_accuracy"] for r in recs]))
                rows.append({
                    "seed": seed_, "rule": rule, "partition": part, "graph": graph if graph == "fixed" else f"epidemic (fanout {fanout})",
                    "mean_degree": round(g.mean_degree(args.rounds), 3), "accuracy": accuracy, "global_accuracy": global_accuracy,
                    "messages": messages, "model_bytes": model_bytes, "bytes": messages * model_bytes,
                })
    finally:
        shutil.rmtree(work, ignore_errors=True)
    wall = time.monotonic() - started

    at = " | ".join(f"acc @{a} (global)" for a in args.at)
    print(f"| seed | rule | partition | graph | mean degree | {at} | models sent | bytes sent |")
    print("|---|---|---|---|---|" + "---|" * len(args.at) + "---|---|")
    for row in rows:
        accs = " | ".join(f"{row['accuracy'][a]:.2f} ({row['global_accuracy'][a]:.2f})" for a in args.at)
        print(
            f"| {row['seed']} | {row['rule']} | {row['partition']} | {row['graph']} | {row['mean_degree']:g} | {accs} | "
            f"{row['messages']:,} | {row['bytes'] / 1e9:.3f} GB |"
        )
    print(f"\nmodel: {rows[0]['model_bytes']:,} bytes (float32); wall time {wall:.0f} s", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "wall_seconds": round(wall, 1), "rounds": args.rounds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
