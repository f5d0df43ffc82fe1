"""What mutual TLS costs: one scenario as gRPC client processes with ``network.tls`` off and
mutual, in one invocation, and their ratio.

    python bench/tls_bench.py                       # the paper's IID DFedReweighting setting:
                                                    # Fashion-MNIST, 3000 rounds, 10 honest + 2 Byzantine
    python bench/tls_bench.py --set rounds=300 --set data.name=digits --pairs 3

Runs alternate off, mutual, off, mutual, ... (``--pairs`` of them), so a machine whose speed
drifts affects both alike; the ratio of each pair is printed and their median is the figure to
quote. CPU time of all client processes is the least noise-sensitive; the round loop (from the
clients' own final records) leaves out process start, imports and data loading.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from transport_bench import PAPER_IID, cpu_seconds, loop_times  # the same scenario and accounting

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], help="extra scenario overrides")
    parser.add_argument("--pairs", type=int, default=1, help="off/mutual pairs to run (default: 1)")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temp dir)")
    args = parser.parse_args()
    if not 1 <= args.pairs <= 20:
        parser.error("--pairs must be in 1..20")
    root = args.out or Path(tempfile.mkdtemp(prefix="dfedrw-tls-bench-"))
    quiet = Console(file=open(os.devnull, "w"))
    ratios: dict[str, list[float]] = {"wall": [], "round loop": [], "CPU": [], "round-loop CPU": []}
    for i in range(args.pairs):
        rows = {}
        for tls in ("off", "mutual"):
            scenario = load_scenario(None, [*PAPER_IID, *args.set, "network.transport=grpc", f"network.tls={tls}"])
            before = cpu_seconds()
            out, summary = run_scenario(scenario, root / f"{i}-{tls}", console=quiet)
            cpu = cpu_seconds() - before
            loop_wall, loop_cpu = loop_times(out, summary)
            rows[tls] = (summary["wall_seconds"], loop_wall, cpu, loop_cpu, summary["honest_mean_accuracy"])
            print(
                f"pair {i + 1} tls {tls:>6}: wall {rows[tls][0]:8.1f} s   round loop {loop_wall:8.1f} s   CPU {cpu:8.1f} s "
                f"(in round loops {loop_cpu:8.1f} s)   honest acc {rows[tls][4]:.2f}%",
                flush=True,
            )
        for j, name in enumerate(ratios):
            ratios[name].append(rows["mutual"][j] / rows["off"][j])
        print(f"pair {i + 1} ratio mutual/off: " + "   ".join(f"{n} {r[-1]:.3f}x" for n, r in ratios.items()), flush=True)
    print("median ratio mutual/off: " + "   ".join(f"{n} {statistics.median(r):.3f}x" for n, r in ratios.items()))
    print(f"runs in {root}")


if __name__ == "__main__":
    main()
