"""A grid's runs one by one against the same runs as one batch, and where a batch's time goes.

Takes the first ``--runs`` distinct runs of a grid file (in the sweep's order), cut to
``--rounds`` rounds, and runs them in one process twice: each alone (``run_together([run])``, one
after the other) and all together (``run_together``: one batch). Both write results folders,
which are compared (records and final files must be the same byte for byte, clock fields
aside). Printed: the round-loop CPU seconds of each mode and the ratio, and for the batch the
CPU seconds spent in the scorer's products (``score_models``, or for a one-layer model
``VectorEvaluator.score_laid_out``: the candidates of every client that scores, on its
auxiliary set), the floor a batch cannot go under, against the rest.

    python bench/batch_of_runs.py                                                  # the fairness grid's first 16 runs, 300 rounds
    python bench/batch_of_runs.py --grid examples/grids/paper_byzantine_fmnist.toml --runs 16 --rounds 200
    python bench/batch_of_runs.py --runs 8 --rounds 100 --json out.json

CPU time (``time.process_time``), not wall time, is what it compares: on a shared machine the
wall clock of one mode can include waiting for a core the other mode had to itself. Torch runs
single-threaded here, as in a sweep's children.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=Path, default=REPO / "examples" / "grids" / "paper_fairness_fmnist.toml")
    parser.add_argument("--runs", type=int, default=16, help="how many of the grid's runs (default 16, a sweep's batch)")
    parser.add_argument("--rounds", type=int, default=300, help="rounds per run (default 300)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)

    from dfedrw.experiments.grid import load_grid
    from dfedrw.experiments.sweep_plan import plan_sweep
    from dfedrw.engines.together import run_together
    from dfedrw.engines.run import BatchedRun
    from scoring_clock import scoring_clock
    from tests.support.parity import differences

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="batch-bench-"))
    try:
        plan = plan_sweep(load_grid(args.grid), work / "plan")
        scenarios = [dataclasses.replace(r.scenario, rounds=args.rounds) for r in list(plan.runs.values())[: args.runs]]
        names = [r.name for r in list(plan.runs.values())[: args.runs]]
        print(f"{len(scenarios)} runs of {args.grid.name}, {args.rounds} rounds each", file=sys.stderr)

        # Scoring time: every scoring product, timed (CPU) around the originals.
        with scoring_clock() as scoring:
            start = time.process_time()
            for scenario, name in zip(scenarios, names, strict=True):
                run_together([BatchedRun(scenario, work / "alone" / name)])
            alone_cpu, alone_scoring = time.process_time() - start, scoring["seconds"]
            scoring["seconds"] = 0.0
            start = time.process_time()
            run_together([BatchedRun(s, work / "together" / n) for s, n in zip(scenarios, names, strict=True)])
            together_cpu, together_scoring = time.process_time() - start, scoring["seconds"]
        problems = [f"{n}: {p}" for n in names for p in differences(work / "alone" / n, work / "together" / n)]
        figures = {
            "runs": len(scenarios), "rounds": args.rounds,
            "alone_cpu_seconds": round(alone_cpu, 2), "batch_cpu_seconds": round(together_cpu, 2),
            "alone_over_batch": round(alone_cpu / together_cpu, 2),
            "batch_scoring_cpu_seconds": round(together_scoring, 2), "alone_scoring_cpu_seconds": round(alone_scoring, 2),
            "batch_other_cpu_seconds": round(together_cpu - together_scoring, 2),
            "batch_ms_per_run_round": round(1000 * together_cpu / (len(scenarios) * args.rounds), 3),
            "identical_results": not problems,
        }
        print(f"{'':28}{'alone':>10}{'batch':>10}")
        print(f"{'CPU seconds (setup + loop)':28}{alone_cpu:10.2f}{together_cpu:10.2f}   alone/batch {figures['alone_over_batch']:.2f}")
        print(f"{'  in scoring products':28}{alone_scoring:10.2f}{together_scoring:10.2f}")
        print(f"{'  everything else':28}{alone_cpu - alone_scoring:10.2f}{together_cpu - together_scoring:10.2f}")
        print(f"batch: {figures['batch_ms_per_run_round']} ms of CPU per run and round; results identical: {not problems}")
        for p in problems[:10]:
            print("  differs:", p)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2) + "\n")
        return 0 if not problems else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.path[:0] = [str(REPO), str(REPO.parent)]
    sys.exit(main())
