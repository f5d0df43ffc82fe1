"""Where a grid's CPU time goes, by the value of one axis (the method, say), and what the whole
grid should cost: a few runs of each value as one batch, cut to a few rounds.

For each value of ``--axis`` (default ``method``), ``--per`` of its runs (spread over the other
axes: seeds, attacks, partitions) run as one batch of the batched engine (``run_together``) for
``--rounds`` rounds. Printed per value: CPU milliseconds per run and round of the round loop (set-up
aside: a batch pays it once; a short untimed batch of the same runs first, so that one-time
imports are not counted either), the number of the grid's runs with that value, and their CPU seconds
at the grid's own rounds; then the total, and the wall time it means on ``--cores`` cores with
the sweep's batches kept busy to the end. Also, when the grid has DFedReweighting runs, the
scoring products' share (the floor: each of their clients scores its candidates every round).

    python bench/grid_methods.py --grid examples/grids/paper_byzantine_fmnist.toml
    python bench/grid_methods.py --grid examples/grids/paper_fairness_fmnist.toml --per 4 --rounds 200

``--only VALUE`` measures only that value of the axis (repeat for more); the total is then
theirs alone.

``--set KEY=VALUE`` changes every measured run (after the grid's own settings). With
``--set data.name=digits`` the model has 650 parameters instead of Fashion-MNIST's 7,850 (and
the data sets are smaller), so the figures are mostly what does not grow with the model: the
calls, Python bookkeeping and records; the difference from the Fashion-MNIST figures is
arithmetic, which does.

CPU time (``time.process_time``), not wall time: on a shared machine a value measured while
another process held a core would be charged for the wait. Torch runs single-threaded, as in a
sweep's children. Noise between two invocations on a shared machine is a few percent, and a
machine's speed drifts by more than that within the hour.

``--vs REF`` compares this checkout with the commit ``REF``, one after the other on this
machine: the bench runs ``--pairs`` times in each (alternated, this/REF then REF/this, each a
fresh process with the same arguments), REF's from a temporary ``git worktree`` with its own
bench script and code, and the figures and their ratios are printed per pair, with the
median ratio of the grid's CPU seconds. A change is judged by that ratio, which holds where
the machine's speed does not::

    python bench/grid_methods.py --vs 628205f --per 4 --rounds 200
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=Path, default=REPO / "examples" / "grids" / "paper_byzantine_fmnist.toml")
    parser.add_argument("--axis", default="method", help="the axis whose values are measured apart (default: method)")
    parser.add_argument("--per", type=int, default=6, help="runs of each value, as one batch (default 6)")
    parser.add_argument("--rounds", type=int, default=100, help="rounds per run (default 100)")
    parser.add_argument("--cores", type=int, default=2, help="cores the sweep runs on, for the wall time (default 2)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                        help="a scenario setting for every measured run, e.g. data.name=digits (repeat)")
    parser.add_argument("--only", action="append", default=[], metavar="VALUE",
                        help="measure only this value of the axis (repeat); the grid's total then counts only these")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    parser.add_argument("--vs", metavar="REF", default=None, help="compare with this commit (see the docstring)")
    parser.add_argument("--pairs", type=int, default=2, help="with --vs: runs in each checkout, alternated (default 2)")
    args = parser.parse_args(argv)
    if args.per < 1 or args.rounds < 1 or args.cores < 1 or args.pairs < 1:
        parser.error("--per, --rounds, --cores and --pairs must be at least 1")
    if args.vs is not None:
        return compare(args, parser)

    from dfedrw.experiments.grid import load_grid
    from dfedrw.experiments.sweep_plan import plan_sweep
    from dfedrw.engines.together import run_together
    from dfedrw.engines.run import BatchedRun
    from dfedrw.peer.config.scenario import scenario_from_dict, scenario_to_dict
    from dfedrw.peer.config.overrides import apply_overrides
    from scoring_clock import scoring_clock

    def changed(scenario, rounds: int):
        scenario = dataclasses.replace(scenario, rounds=rounds)
        return scenario_from_dict(apply_overrides(scenario_to_dict(scenario), args.sets)) if args.sets else scenario

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="grid-methods-"))
    try:
        plan = plan_sweep(load_grid(args.grid), work / "plan")
        by_value: dict[str, list] = collections.defaultdict(list)
        for run in plan.runs.values():
            point = plan.points[run.points[0]]
            if args.axis not in point.labels:
                parser.error(f"{args.grid}: no axis {args.axis!r} (axes: {', '.join(point.labels)})")
            by_value[point.labels[args.axis]].append(run)
        unknown = sorted(set(args.only) - set(by_value))
        if unknown:
            parser.error(f"--only: no value {', '.join(map(repr, unknown))} of {args.axis!r} (values: {', '.join(by_value)})")
        if args.only:
            by_value = {value: runs for value, runs in by_value.items() if value in args.only}
        try:
            changed(next(iter(plan.runs.values())).scenario, 1)
        except ValueError as exc:
            parser.error(f"--set: {exc}")

        rows, total, floor = [], 0.0, 0.0
        with scoring_clock() as scoring:  # the scoring products, timed where they run
            for value, runs in by_value.items():
                step = max(1, len(runs) // args.per)
                chosen = runs[::step][: args.per]
                full_rounds = chosen[0].scenario.rounds
                # A 2-round batch first, untimed: what a process pays once (imports such as
                # scikit-learn's, first calls) is not a cost per round of a 3,000-round run.
                run_together([BatchedRun(changed(r.scenario, 2), work / "warm" / r.name) for r in chosen])
                batch = [BatchedRun(changed(r.scenario, args.rounds), work / "runs" / r.name) for r in chosen]
                scoring["seconds"] = 0.0
                run_together(batch)
                # The batch's round loop (every run's final files carry the same figure).
                cpu = json.loads((batch[0].out_dir / "peers" / f"{batch[0].honest[0]}.json").read_text())["loop_cpu_seconds"]
                per = cpu / (len(chosen) * args.rounds)
                grid_seconds = per * full_rounds * len(runs)
                floor_seconds = scoring["seconds"] / (len(chosen) * args.rounds) * full_rounds * len(runs)
                total += grid_seconds
                floor += floor_seconds
                rows.append({"value": value, "runs": len(runs), "measured_runs": len(chosen), "ms_per_run_round": round(1000 * per, 2),
                             "grid_cpu_seconds": round(grid_seconds), "scoring_cpu_seconds": round(floor_seconds)})
                print(f"{value:32} {1000 * per:7.2f} ms per run and round  x {len(runs):3} runs x {full_rounds} rounds = "
                      f"{grid_seconds:7.0f} CPU s (scoring {floor_seconds:6.0f})", flush=True)
        wall = total / args.cores
        print(f"{'grid':32} {total:7.0f} CPU s, of which scoring {floor:.0f}; on {args.cores} busy cores about {wall:.0f} s ({wall / 60:.1f} min)")
        if args.json is not None:
            args.json.write_text(json.dumps({"grid": str(args.grid), "rounds": args.rounds, "per": args.per, "set": args.sets, "values": rows,
                                             "grid_cpu_seconds": round(total), "scoring_cpu_seconds": round(floor),
                                             "wall_seconds_on_cores": round(wall), "cores": args.cores}, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _bench_args(args, grid: Path) -> list[str]:
    out = ["--grid", str(grid), "--axis", args.axis, "--per", str(args.per), "--rounds", str(args.rounds), "--cores", str(args.cores)]
    for value in args.sets:
        out += ["--set", value]
    for value in args.only:
        out += ["--only", value]
    return out


def compare(args, parser) -> int:
    """``--vs REF``: the bench in this checkout and in a worktree of REF, alternated."""
    import os
    import statistics
    import subprocess

    def git(*words: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(REPO), *words], capture_output=True, text=True)

    found = git("rev-parse", "--verify", "--quiet", f"{args.vs}^{{commit}}")
    if found.returncode != 0:
        parser.error(f"--vs: no commit {args.vs!r} in {REPO}")
    commit = found.stdout.strip()
    grid = args.grid.resolve()
    work = Path(tempfile.mkdtemp(prefix="grid-vs-"))
    tree = work / "tree"
    try:
        added = git("worktree", "add", "--detach", str(tree), commit)
        if added.returncode != 0:
            parser.error(f"--vs: git worktree add failed: {added.stderr.strip()}")
        # REF's code under the import name the package installs as: a folder on PYTHONPATH
        # holding a link named dfedrw to the worktree (ahead of this checkout's install).
        (work / "path").mkdir()
        (work / "path" / "dfedrw").symlink_to(tree)
        ref_env = {**os.environ, "PYTHONPATH": str(work / "path")}
        try:  # the grid as REF has it, when it has it (its own scenario files and keys)
            ref_grid = tree / grid.relative_to(REPO)
        except ValueError:
            ref_grid = grid
        if not ref_grid.is_file():
            ref_grid = grid
        sides = {
            "this": ([sys.executable, str(Path(__file__).resolve()), *_bench_args(args, grid)], None, REPO),
            "ref": ([sys.executable, str(tree / "bench" / "grid_methods.py"), *_bench_args(args, ref_grid)], ref_env, work),
        }
        print(f"this checkout against {args.vs} ({commit[:12]}): {args.pairs} pair(s), alternated", flush=True)
        totals: dict[str, list[float]] = {"this": [], "ref": []}
        methods: dict[str, dict[str, list[float]]] = {"this": {}, "ref": {}}
        for i in range(args.pairs):
            for side in ("this", "ref") if i % 2 == 0 else ("ref", "this"):
                command, env, cwd = sides[side]
                out = work / f"{side}-{i}.json"
                done = subprocess.run([*command, "--json", str(out)], env=env, cwd=cwd, capture_output=True, text=True)
                if done.returncode != 0 or not out.is_file():
                    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
                    print(f"the bench failed in {'this checkout' if side == 'this' else args.vs} (exit {done.returncode}):\n{tail}", file=sys.stderr)
                    return 1
                figures = json.loads(out.read_text())
                totals[side].append(figures["grid_cpu_seconds"])
                for row in figures["values"]:
                    methods[side].setdefault(row["value"], []).append(row["ms_per_run_round"])
                print(f"pair {i + 1}: {'this' if side == 'this' else args.vs:>12}  grid {figures['grid_cpu_seconds']:7.0f} CPU s", flush=True)
            print(f"pair {i + 1}: this / {args.vs} = {_ratio(totals['this'][-1], totals['ref'][-1]):.3f}", flush=True)
        print(f"{'ms per run and round (median)':32} {'this':>8} {args.vs:>12} {'ratio':>7}")
        for value in methods["this"]:
            mine, theirs = statistics.median(methods["this"][value]), statistics.median(methods["ref"].get(value, [float("nan")]))
            print(f"{value:32} {mine:8.2f} {theirs:12.2f} {_ratio(mine, theirs):7.3f}")
        ratios = [_ratio(a, b) for a, b in zip(totals["this"], totals["ref"], strict=True)]
        print(f"grid CPU s, this / {args.vs}: {', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")
    finally:
        git("worktree", "remove", "--force", str(tree))
        git("worktree", "prune")
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
