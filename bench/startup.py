"""Start-up and memory of N real client processes (``dfedrw run``), for several N and data sets.

For each data set and each N it runs ``dfedrw run`` (one process per client, gRPC with mutual
TLS, loopback) with N honest clients on an Erdos-Renyi graph of mean degree about 8 (the
default rho 0.7 for N = 12), ``--rounds`` rounds, no evaluation, and prints:

* launch -> all in round 0: seconds from starting ``dfedrw run`` until the last client began
  its round loop (the clients' final records name when; certificates and the data cache's
  check are included), and that divided by N (start-up per client on this machine);
* PSS per client: the unique memory of a client process (shared pages divided among the
  processes that share them), the median and the largest over clients, each client's the
  median of its samples; USS (pages no other process maps) beside it; the most threads a
  client had;
* the launcher's PSS and the fork server's (their highest), and seconds per round (median
  client's round loop / rounds).

Memory is read from ``/proc/PID/smaps_rollup`` (Linux) twice a second, with each process's
thread count. The comparison in one
invocation is ``--start``: the client processes started as fresh interpreters (``spawn``)
against forked from a process that has the client code imported (``fork``).

    python bench/startup.py                                    # 12 and 50 clients, digits and Fashion-MNIST, spawn and fork
    python bench/startup.py --clients 100 --datasets fashion-mnist --rounds 100
    python bench/startup.py --clients 12 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from proc_memory import Sampler

REPO = Path(__file__).resolve().parent.parent


def one_run(dataset: str, clients: int, rounds: int, start: str, work: Path, timeout: float) -> dict:
    rho = 0.7 if clients <= 12 else min(0.7, 8 / (clients - 1))
    out = work / f"{dataset}-{clients}-{start}"
    cmd = [
        sys.executable, "-m", "dfedrw.experiments.cli", "run", "--out", str(out),
        "--set", f"data.name={dataset}", "--set", f"topology.honest={clients}", "--set", "topology.byzantine=0",
        "--set", f"topology.rho={rho:.6f}", "--set", f"rounds={rounds}", "--set", "eval.every=0",
        "--set", "network.tls=mutual", "--start", start,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO.parent)}
    began = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler = Sampler(proc.pid)
    sampler.start()
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        sampler.stop.set()
        sampler.join()
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{err[-3000:]}")
    finals = [json.loads(p.read_text()) for p in sorted((out / "peers").glob("*.json"))]
    pids = {f["pid"] for f in finals}
    client_memory = [m for m in (sampler.typical(p) for p in pids) if m is not None]
    all_in = max(f["loop_started_at"] for f in finals) - began
    pss = sorted(m[0] for m in client_memory)
    uss = sorted(m[1] for m in client_memory)
    summary = json.loads((out / "summary.json").read_text())
    return {
        "dataset": dataset, "clients": clients, "start": start, "rounds": rounds, "mean_degree": round(rho * (clients - 1), 1),
        "all_in_round_0_seconds": round(all_in, 2), "startup_per_client_seconds": round(all_in / clients, 3),
        "client_pss_mb_median": round(statistics.median(pss) / 2**20, 1) if pss else None,
        "client_pss_mb_max": round(pss[-1] / 2**20, 1) if pss else None,
        "client_uss_mb_median": round(statistics.median(uss) / 2**20, 1) if uss else None,
        "clients_sampled": len(client_memory),
        "client_threads_max": max((sampler.threads.get(p, 0) for p in pids), default=0),
        "launcher_pss_mb": round(max((m.pss for m in sampler.samples.get(proc.pid, [])), default=0) / 2**20, 1),
        # Neither the launcher nor a client: the fork server (none with spawn).
        "fork_server_pss_mb": round(max((m.pss for pid, got in sampler.samples.items() if pid not in pids and pid != proc.pid for m in got), default=0) / 2**20, 1),
        "seconds_per_round": round(statistics.median(f["loop_seconds"] for f in finals) / rounds, 4),
        "completed": summary.get("honest_completed"), "tls": summary.get("tls"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[12, 50])
    parser.add_argument("--datasets", nargs="+", default=["digits", "fashion-mnist"])
    parser.add_argument("--rounds", type=int, default=30, help="rounds per run (default 30; memory is sampled while they run)")
    parser.add_argument("--start", nargs="+", default=["spawn", "fork"], choices=["spawn", "fork"])
    parser.add_argument(
        "--spawn-max", type=int, default=50,
        help="largest N started with spawn (default 50: a fresh interpreter holds ~200 MB of its own, 100 of them more than this machine's memory)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take (default 900)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        for dataset in args.datasets:
            for n in args.clients:
                for start in args.start:
                    if start == "spawn" and n > args.spawn_max:
                        print(f"{dataset} N={n}: spawn left out (--spawn-max {args.spawn_max})", file=sys.stderr)
                        continue
                    row = one_run(dataset, n, args.rounds, start, Path(tmp), args.timeout)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
    head = f"{'data set':15}{'N':>5}{'start':>7}{'all in r0 s':>13}{'s/client':>10}{'PSS MB med':>12}{'max':>7}{'USS med':>9}{'launcher':>10}{'fork srv':>10}{'s/round':>9}{'threads':>9}"
    print(head)
    for r in rows:
        print(
            f"{r['dataset']:15}{r['clients']:5}{r['start']:>7}{r['all_in_round_0_seconds']:13.2f}{r['startup_per_client_seconds']:10.3f}"
            f"{r['client_pss_mb_median']:12.1f}{r['client_pss_mb_max']:7.1f}{r['client_uss_mb_median']:9.1f}{r['launcher_pss_mb']:10.1f}{r['fork_server_pss_mb']:10.1f}{r['seconds_per_round']:9.4f}{r['client_threads_max']:9}"
        )
    for dataset in args.datasets:
        for n in args.clients:
            by = {r["start"]: r for r in rows if r["dataset"] == dataset and r["clients"] == n}
            if "spawn" in by and "fork" in by:
                print(
                    f"{dataset} N={n}: spawn/fork start-up {by['spawn']['all_in_round_0_seconds'] / by['fork']['all_in_round_0_seconds']:.2f}x, "
                    f"PSS {by['spawn']['client_pss_mb_median'] / by['fork']['client_pss_mb_median']:.2f}x"
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
