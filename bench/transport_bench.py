"""Wall time of one scenario in-process vs as gRPC client processes, and their ratio.

    python bench/transport_bench.py                      # the paper's IID DFedReweighting setting:
                                                         # Fashion-MNIST, 3000 rounds, 10 honest + 2 Byzantine
    python bench/transport_bench.py --set rounds=300 --set data.name=digits

Both runs happen in this one invocation, back to back, so the ratio is comparable even on a
busy machine; the figures themselves are not. CPU time (all client processes together) is the
least noise-sensitive. The round loop (wall and CPU, from the clients' own final records)
leaves out process start, imports and data loading.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402

from dfedrw.launch.runner import run_scenario  # noqa: E402
from dfedrw.peer.config.scenario import load_scenario  # noqa: E402

PAPER_IID = ["data.name=fashion-mnist", "data.partition=iid", "rounds=3000", "attack.name=gaussian"]


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the gRPC client processes)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def loop_times(out: Path, summary: dict) -> tuple[float, float]:
    """(slowest client's wall seconds in its round loop, CPU seconds of all round loops), from
    the clients' final records. A client records its whole process's CPU time, so clients that
    share a process (in-process transport) count once."""
    wall, per_process = [], {}
    for k, peer in summary["peers"].items():
        path = out / "peers" / f"{k}.json"
        if path.exists():
            record = json.loads(path.read_text())
            wall.append(record.get("loop_seconds", 0.0))
            cpu = record.get("loop_cpu_seconds", 0.0)
            per_process[peer["pid"]] = max(per_process.get(peer["pid"], 0.0), cpu)
    return max(wall, default=float("nan")), sum(per_process.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], help="extra scenario overrides")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temp dir)")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="dfedrw-bench-"))
    quiet = Console(file=open(os.devnull, "w"))
    rows = {}
    for transport in ("inproc", "grpc"):
        scenario = load_scenario(None, [*PAPER_IID, *args.set, f"network.transport={transport}"])
        before = cpu_seconds()
        out, summary = run_scenario(scenario, root / transport, console=quiet)
        cpu = cpu_seconds() - before
        loop_wall, loop_cpu = loop_times(out, summary)
        rows[transport] = (summary["wall_seconds"], loop_wall, summary["honest_mean_accuracy"], cpu, loop_cpu)
        print(f"{transport:>7}: wall {summary['wall_seconds']:8.1f} s   round loop {rows[transport][1]:8.1f} s   "
              f"CPU {cpu:8.1f} s (in round loops {rows[transport][4]:8.1f} s)   honest acc {summary['honest_mean_accuracy']:.2f}%", flush=True)
    (wi, li, ai, ci, lci), (wg, lg, ag, cg, lcg) = rows["inproc"], rows["grpc"]
    print(f"ratio grpc/inproc: wall {wg / wi:.2f}x   round loop {lg / li:.2f}x   CPU {cg / ci:.2f}x   "
          f"round-loop CPU {lcg / lci:.2f}x   (accuracy equal: {ai == ag})")
    print(f"runs in {root}")


if __name__ == "__main__":
    main()
