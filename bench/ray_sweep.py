"""The same grid through the local pool and through a Ray cluster of the same CPUs, in one
invocation: wall time of each, their ratio, and Ray's overhead per batch.

    python bench/ray_sweep.py                          # 3 alternated pairs; a cluster of its own
    python bench/ray_sweep.py --pairs 5 --rounds 2000 --json out.json
    python bench/ray_sweep.py --address HOST:PORT      # an existing cluster (limit it to the CPUs yourself)

The grid: 24 runs of softmax regression on digits (6 seeds x 2 rules x 2 attacks, 10 + 2
clients, ``--rounds`` rounds, the batched engine) in batches of ``--batch`` runs. ``local`` is
``dfedrw sweep GRID --jobs 2``; ``ray`` is ``dfedrw sweep GRID --ray ADDRESS`` on a cluster that
offers 2 CPUs: by default one this bench starts (tests/support/ray_lab.py: a head offering no CPU and
one worker node of 2 CPUs, on loopback in a network namespace of its own, so it needs root), and
whose start is not timed. Each is a whole process timed from outside, in a fresh folder, the two
alternating pair by pair. The ratio is Ray / local (the target: at most 1.15); Ray's overhead
per batch is (Ray's wall - local wall) / batches. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.support import ray_lab  # noqa: E402 - the tests' cluster, started the same way

GRID = ray_lab.GRID
RUNS = 24


def log(message: str) -> None:
    print(f"[ray_sweep] {message}", file=sys.stderr, flush=True)


def timed(argv: list[str], lab: ray_lab.RayLab | None = None) -> float:
    start = time.perf_counter()
    done = (lab.run(argv, capture_output=True, text=True) if lab is not None else subprocess.run(argv, capture_output=True, text=True))
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=4, help="runs per batch (default 4: 6 batches)")
    parser.add_argument("--address", default=None, help="an existing Ray cluster's address (default: start one)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.address is None and (why := ray_lab.unusable_reason()) is not None:
        raise SystemExit(f"cannot start a Ray cluster here: {why}; give --address")
    work = Path(tempfile.mkdtemp(prefix="ray-sweep-"))
    grid = work / "grid.toml"
    grid.write_text(GRID.format(rounds=args.rounds))
    sweep = [sys.executable, "-m", "dfedrw.experiments.cli", "sweep", str(grid), "--batch", str(args.batch)]
    batches = -(-RUNS // args.batch)
    lab = None
    times: dict[str, list[float]] = {"local": [], "ray": []}
    try:
        if args.address is None:
            log("starting a Ray cluster: a head and one worker node of 2 CPUs")
            lab = ray_lab.RayLab(workers=1, cpus=2).start()
        address = args.address or lab.address
        for pair in range(args.pairs):
            for system in ("local", "ray") if pair % 2 == 0 else ("ray", "local"):
                out = work / f"{system}-{pair}"
                extra = ["--jobs", "2"] if system == "local" else ["--ray", address]
                seconds = timed([*sweep, "--out", str(out), *extra], lab if system == "ray" else None)
                times[system].append(seconds)
                log(f"pair {pair + 1}/{args.pairs}: {system} {seconds:.1f} s")
                shutil.rmtree(out, ignore_errors=True)
    finally:
        if lab is not None:
            lab.close()
        shutil.rmtree(work, ignore_errors=True)
    local, ray = statistics.median(times["local"]), statistics.median(times["ray"])
    ratios = [r / l for l, r in zip(times["local"], times["ray"])]
    result = {
        "grid": f"{RUNS} runs, digits, {args.rounds} rounds, batches of {args.batch} ({batches} batches)",
        "pairs": args.pairs, "local_seconds": times["local"], "ray_seconds": times["ray"],
        "local_median": round(local, 2), "ray_median": round(ray, 2), "ratio_median": round(statistics.median(ratios), 3),
        "overhead_per_batch_seconds": round((ray - local) / batches, 2),
    }
    print(f"grid: {result['grid']}; {args.pairs} alternated pairs, medians")
    print("| | wall seconds |")
    print("|---|---:|")
    print(f"| local pool, --jobs 2 | {local:.1f} |")
    print(f"| Ray, 2 CPUs | {ray:.1f} |")
    print(f"Ray / local: {result['ratio_median']:.3f}x (median of the pairs' ratios); Ray's overhead per batch: {result['overhead_per_batch_seconds']:.2f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
