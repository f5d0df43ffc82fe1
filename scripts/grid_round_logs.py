"""Whether a change to the batched engine keeps every bit of a grid: the grid's runs of one seed,
cut to a few rounds, run as a sweep batches them, their round logs written; run it from two
checkouts and compare the two folders.

    python scripts/grid_round_logs.py run examples/grids/paper_byzantine_fmnist.toml OUT --seed 43 --rounds 100
    python scripts/grid_round_logs.py compare OUT_BEFORE OUT_AFTER

``run`` writes ``OUT/runs/<run>/`` for every run of the seed (a results folder each, as a
sweep's); ``compare`` reads every ``peers/<id>.jsonl`` under both and prints how many differ
(exit status 1 when one differs or is missing on one side). The round logs hold no time or
process id, so equal code writes equal bytes; ``peers/<id>.json`` and ``summary.json`` hold
timings and are not compared.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path


def run(grid: Path, out: Path, seed: int, rounds: int, batch: int) -> int:
    import torch

    from dfedrw.experiments.grid import load_grid
    from dfedrw.experiments.sweep_plan import plan_batches, plan_sweep
    from dfedrw.engines.together import run_together
    from dfedrw.engines.run import BatchedRun

    runs_dir = out / "runs"
    if runs_dir.exists() and any(runs_dir.iterdir()):
        raise SystemExit(f"{runs_dir} already holds runs; choose another OUT")
    plan = plan_sweep(load_grid(grid), out / "plan")
    seeds = sorted({r.scenario.seed for r in plan.runs.values()})
    runs = [r for r in plan.runs.values() if r.scenario.seed == seed]
    if not runs:
        raise SystemExit(f"{grid}: no run of seed {seed} (seeds: {', '.join(map(str, seeds))})")
    groups = plan_batches(runs, 1, batch)
    torch.set_num_threads(1)  # as a sweep's children
    for i, group in enumerate(groups, 1):
        if any(r.scenario.engine.name != "batched" for r in group):
            raise SystemExit(f"{grid}: run {group[0].name} is not a batched-engine run")
        print(f"batch {i}/{len(groups)}: {len(group)} runs", flush=True)
        run_together([BatchedRun(dataclasses.replace(r.scenario, rounds=rounds), runs_dir / r.name) for r in group])
    print(f"{len(runs)} runs of seed {seed}, {rounds} rounds: {runs_dir}")
    return 0


def logs(folder: Path) -> dict[str, Path]:
    """Every round log under ``folder/runs``, by its path relative to ``folder``."""
    root = folder / "runs"
    if not root.is_dir():
        raise SystemExit(f"{folder}: no runs/ folder (written by `run`)")
    return {str(p.relative_to(folder)): p for p in sorted(root.glob("*/peers/*.jsonl"))}


def compare(before: Path, after: Path) -> int:
    a, b = logs(before), logs(after)
    missing = sorted(set(a) ^ set(b))
    differ = [name for name in sorted(set(a) & set(b)) if a[name].read_bytes() != b[name].read_bytes()]
    for name in missing[:5]:
        print(f"only in {before if name in a else after}: {name}")
    for name in differ[:5]:
        print(f"differs: {name}")
    print(f"{len(set(a) & set(b))} round logs in both, {len(differ)} differ, {len(missing)} on one side only")
    return 1 if differ or missing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run one seed's runs of a grid, cut to a few rounds")
    r.add_argument("grid", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--rounds", type=int, default=100, help="rounds per run (default 100)")
    r.add_argument("--batch", type=int, default=16, help="runs per batch, as `dfedrw sweep --batch` (default 16)")
    c = sub.add_parser("compare", help="compare the round logs of two `run` folders")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "compare":
        return compare(args.before, args.after)
    if args.rounds < 1 or args.batch < 1:
        parser.error("--rounds and --batch must be at least 1")
    if not args.grid.is_file():
        parser.error(f"grid file not found: {args.grid}")
    return run(args.grid, args.out, args.seed, args.rounds, args.batch)


if __name__ == "__main__":
    sys.exit(main())
