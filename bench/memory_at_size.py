"""Memory of a run at the size of a ResNet-18: 12 client processes (10 honest + 2 Byzantine, the
Gaussian attack), DFedAvg, an 11 M-parameter model from a user's module (or a built-in one),
mutual TLS, through ``dfedrw run``; every process's unique memory sampled while it runs and
set against the bound the docs state (:mod:`dfedrw.peer.wiring.memory`).

    python bench/memory_at_size.py                          # the 11,018,670-parameter MLP, 5 rounds, Fashion-MNIST
    python bench/memory_at_size.py --model resnet18         # a built-in model instead
    python bench/memory_at_size.py --rounds 3 --set network.round_window=1

The MLP (784 -> 4096 -> 1900 -> 10, ReLU) is written to a module of its own in a temporary
folder put on ``PYTHONPATH``, and named ``train.model = "bigmlp:big_mlp"``, as a user names
theirs. Each process's PSS (its private pages plus its share of the shared ones), RSS and USS
are read from ``/proc/PID/smaps_rollup`` every ``--interval`` seconds. Printed: per client its
peak of each (and of PSS the median of its samples) against its bound (models held at most x
model size + the per-process baseline), the median and the largest client peak PSS, the
launcher's and the fork server's; whether every client completed every round. MB are 10^6 bytes.
Exit status 0 when every client completed, no client's peak PSS is over its bound, and the
launcher stays under 500 MB; 1 otherwise.
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

BIG_MLP = '''"""An 11 M-parameter MLP: a user's model, named train.model = "bigmlp:big_mlp"."""
from torch import nn


def big_mlp(in_features, num_classes):
    return nn.Sequential(nn.Linear(in_features, 4096), nn.ReLU(), nn.Linear(4096, 1900), nn.ReLU(), nn.Linear(1900, num_classes))
'''

LAUNCHER_LIMIT = 500 * 10**6


def _mb(n: float) -> str:
    return f"{n / 1e6:8.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bigmlp:big_mlp", help="train.model (default: the 11 M-parameter MLP of a user module written here)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--honest", type=int, default=10)
    parser.add_argument("--byzantine", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], help="more scenario overrides (KEY=VALUE)")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between samples (default 0.25)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds the run may take (default 1800)")
    parser.add_argument("--out", type=Path, default=None, help="keep the run here (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args()
    if not (1 <= args.rounds <= 1000 and 1 <= args.honest <= 100 and 0 <= args.byzantine <= 100):
        parser.error("--rounds 1..1000, --honest 1..100, --byzantine 0..100")

    with tempfile.TemporaryDirectory(prefix="memory-at-size-") as tmp:
        tmp = Path(tmp)
        (tmp / "bigmlp.py").write_text(BIG_MLP)
        out = args.out or tmp / "run"
        sets = [
            "data.name=fashion-mnist", "data.partition=iid", f"train.model={args.model}", f"rounds={args.rounds}",
            f"topology.honest={args.honest}", f"topology.byzantine={args.byzantine}",
            f"attack.name={'gaussian' if args.byzantine else 'none'}", "aggregation.rule=dfedavg", "network.tls=mutual",
            # 44 MB models to 4-10 neighbours each on 2 cores: a round's traffic takes 10-20 s,
            # longer than the 10 s default deadline. (Under the Gaussian attack DFedAvg's models
            # diverge within two rounds; from then on honest models are implausible too, are
            # rejected, and their receivers wait out this deadline.)
            "network.round_timeout=60", "network.connect_timeout=300", *args.set,
        ]
        env = dict(os.environ)
        # The user's module, then whatever the caller had (this checkout, when it is not installed).
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp), env.get("PYTHONPATH", "")) if p)
        env.setdefault("DFEDRW_CACHE_DIR", str(tmp / "cache"))
        sys.path.insert(0, str(tmp))
        from dfedrw.peer.config.scenario import load_scenario
        from dfedrw.peer.wiring.memory import run_needs
        from dfedrw.peer.wiring.build import scenario_model_specs

        scenario = load_scenario(None, sets)
        needs = run_needs(scenario, scenario_model_specs(scenario))
        print(f"model {args.model}: {needs.model / 4:,.0f} parameters, {needs.model / 1e6:.1f} MB; {needs.describe()}", flush=True)
        cmd = [sys.executable, "-m", "dfedrw.experiments.cli", "run", "--out", str(out)]
        for s in sets:
            cmd += ["--set", s]
        began = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        sampler = Sampler(proc.pid, args.interval)
        sampler.start()
        try:
            _, err = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            print(f"the run took more than {args.timeout:.0f} s: killed", file=sys.stderr)
        finally:
            sampler.stop.set()
            sampler.join()
        wall = time.monotonic() - began
        summary_path = out / "summary.json"
        if not summary_path.exists():
            print(f"no summary (exit {proc.returncode}):\n{err[-3000:]}", file=sys.stderr)
            return 1
        summary = json.loads(summary_path.read_text())
        pids = json.loads((out / "pids.json").read_text())
        clients = {int(k): pid for k, pid in pids["clients"].items()}
        launcher = pids["launcher"]
        others = [pid for pid in sampler.samples if pid != launcher and pid not in clients.values()]

        rows, ok = [], True
        print(f"{'client':>6} {'role':>9} {'bound MB':>9} {'PSS peak':>9} {'PSS med':>8} {'RSS peak':>9} {'USS peak':>9}  rounds")
        for k, pid in sorted(clients.items()):
            held = needs.held[k]
            bound = needs.client_bytes(held)
            peak, typical = sampler.peak(pid), sampler.typical(pid)
            peer = summary["peers"][str(k)]
            done = bool(peer.get("completed"))
            if peak is None:
                print(f"{k:>6} {held.role:>9} {_mb(bound)}  (never sampled)")
                ok = False
                continue
            ok &= done and peak.pss <= bound
            rows.append({"client": k, "role": held.role, "held_models": held.models, "bound_mb": bound / 1e6, "pss_peak_mb": peak.pss / 1e6,
                         "pss_median_mb": typical[0] / 1e6, "rss_peak_mb": peak.rss / 1e6, "uss_peak_mb": peak.uss / 1e6, "completed": done})
            print(f"{k:>6} {held.role:>9} {_mb(bound)} {_mb(peak.pss)} {_mb(typical[0])} {_mb(peak.rss)} {_mb(peak.uss)}  {'all' if done else 'FAILED'}")
        peaks = sorted(r["pss_peak_mb"] for r in rows)
        launcher_peak = sampler.peak(launcher)
        server_peak = max((sampler.peak(pid).pss for pid in others), default=0)
        launcher_pss = launcher_peak.pss if launcher_peak else 0
        ok &= launcher_pss <= LAUNCHER_LIMIT and not summary["failed_peers"]
        figures = {
            "model": args.model, "parameters": needs.model // 4, "model_mb": needs.model / 1e6, "rounds": args.rounds,
            "clients": len(clients), "completed": sum(r["completed"] for r in rows), "failed_peers": summary["failed_peers"],
            "client_pss_peak_mb_median": statistics.median(peaks) if peaks else None, "client_pss_peak_mb_max": peaks[-1] if peaks else None,
            "launcher_pss_peak_mb": launcher_pss / 1e6, "fork_server_pss_peak_mb": server_peak / 1e6,
            "run_wall_seconds": round(wall, 1), "rounds_seconds": summary.get("wall_seconds"), "estimate_gb": needs.total / 1e9, "clients_detail": rows,
        }
        print(
            f"clients' peak PSS: median {figures['client_pss_peak_mb_median']:.1f} MB, largest {figures['client_pss_peak_mb_max']:.1f} MB; "
            f"launcher {figures['launcher_pss_peak_mb']:.1f} MB, fork server {figures['fork_server_pss_peak_mb']:.1f} MB; "
            f"{figures['completed']} of {len(clients)} clients completed {args.rounds} rounds (failed: {summary['failed_peers'] or 'none'}); "
            f"{wall:.0f} s in all"
        )
        print("within every bound, launcher under 500 MB, no client lost" if ok else "NOT within the bounds, or a client was lost")
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
