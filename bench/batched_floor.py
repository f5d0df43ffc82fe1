"""The batched engine's whole run of the paper's Fashion-MNIST DFedAvg setting against a
hand-vectorised floor, and its fixed start.

    python bench/batched_floor.py                      # 3 alternated pairs, 3,000 rounds
    python bench/batched_floor.py --pairs 5 --rounds 1000 --json out.json

Both are whole processes, timed from outside (wall, CPU user and system from ``wait4``), in
turn, pair by pair, so that a drift of the machine's speed falls on both:

* ``batched``: ``dfedrw run --engine batched`` on Fashion-MNIST, IID, 10 honest clients on the
  Erdos-Renyi graph of rho 0.7 (seed 43), softmax regression, DFedAvg, SGD lr 0.01, batch 32, one
  local step a round, the local and global test every 50 rounds and after the last;
* ``floor``: the same experiment as a user would write it with torch alone (this file,
  ``--floor``): the IDX files read with gzip and numpy, 10 equal random shards, every client's
  model a row of one ``[10, 7850]`` tensor, each round one minibatch of 32 rows a client drawn
  at once, the softmax regression's gradient written out (no autograd), one SGD step, the rows
  mixed by one product with the graph's averaging matrix (sample-weighted over each client
  and its neighbours, as DFedAvg), and the same tests (each client's 1,000 local test rows and
  the 10,000 of the test set). Nothing is written but its accuracy. It draws its own partition
  and minibatches, so its accuracy agrees with the engine's to within a point, not to the bit.

Both run one torch thread (the batched engine's default, ``engine.threads = 1``). A third row
times the batched engine's fixed start: the same run of 1 round, whole process. The table gives
each figure's median over the pairs and the median ratio batched / floor (the target: at most
1.0). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FASHION = Path("/usr/share/datasets/fashion-mnist")
SCENARIO = [
    "seed=43", "data.name=fashion-mnist", "data.partition=iid", "topology.kind=erdos_renyi", "topology.rho=0.7",
    "topology.honest=10", "topology.byzantine=0", "attack.name=none", "aggregation.rule=dfedavg", "train.lr=0.01",
    "train.batch_size=32", "train.local_steps=1", "eval.every=50", "engine.name=batched",
]


def log(message: str) -> None:
    print(f"[batched_floor] {message}", file=sys.stderr, flush=True)


def read_idx(path: Path):
    import numpy as np

    raw = gzip.decompress(path.read_bytes())
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape[0], -1)


def floor(rounds: int, data_dir: Path) -> float:
    """The experiment written with torch alone; returns the honest mean local accuracy (%)."""
    import torch

    from dfedrw.peer.config.scenario import load_scenario
    from dfedrw.peer.wiring.plan import scenario_topology

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(43)
    train_x = torch.from_numpy(read_idx(data_dir / "train-images-idx3-ubyte.gz").copy())
    train_y = torch.from_numpy(read_idx(data_dir / "train-labels-idx1-ubyte.gz").copy()).view(-1).long()
    test_x = torch.from_numpy(read_idx(data_dir / "t10k-images-idx3-ubyte.gz").copy()).float().div_(255.0)
    test_y = torch.from_numpy(read_idx(data_dir / "t10k-labels-idx1-ubyte.gz").copy()).view(-1).long()
    n, classes, features, batch, lr = 10, 10, train_x.shape[1], 32, 0.01
    # The graph is the scenario's (an input, like the data); everything else is drawn here.
    graph = scenario_topology(load_scenario(None, [o for o in SCENARIO if not o.startswith("engine.")])).graph
    shard = len(train_y) // n
    order = torch.randperm(len(train_y), generator=gen)[: shard * n].view(n, shard)
    aux = shard // 10  # the engine keeps a tenth of each shard as the auxiliary set
    train_rows = order[:, aux:]
    local_test = torch.randperm(len(test_y), generator=gen)[:1000]
    mix = torch.zeros(n, n)
    for k in range(n):
        group = [k, *graph.neighbors(k)]
        mix[k, group] = 1.0 / len(group)  # equal shards: sample-weighted is the plain mean
    w = torch.empty(n, features, classes).uniform_(-0.01, 0.01, generator=gen)
    b = torch.zeros(n, 1, classes)
    minus_one = torch.full((n, batch, 1), -1.0)
    accuracy = 0.0

    def evaluate() -> float:
        logits = torch.einsum("sf,kfc->ksc", test_x, w) + b
        hits = logits.argmax(2) == test_y
        local = hits[:, local_test].float().mean(1)
        hits.float().mean(1)  # the global test, as the engine computes it too
        return 100.0 * float(local.mean())

    for r in range(rounds):
        pick = train_rows.gather(1, torch.randint(0, train_rows.shape[1], (n, batch), generator=gen))
        x = train_x[pick].float().div_(255.0)  # [n, batch, features]
        y = train_y[pick]
        logits = torch.baddbmm(b, x, w)
        grad = torch.softmax(logits, 2)  # the cross-entropy's gradient: softmax - one-hot, over the batch
        grad.scatter_add_(2, y.unsqueeze(2), minus_one)
        grad.div_(batch)
        w -= lr * torch.bmm(x.transpose(1, 2), grad)
        b -= lr * grad.sum(1, keepdim=True)
        w = (mix @ w.view(n, -1)).view(n, features, classes)
        b = (mix @ b.view(n, -1)).view(n, 1, classes)
        if (r + 1) % 50 == 0 or r == rounds - 1:
            accuracy = evaluate()
    return accuracy


def timed(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:5])} ... exited with {proc.returncode}: {err.strip().splitlines()[-1:] or ''}")
    return {"seconds": seconds, "user": usage.ru_utime, "system": usage.ru_stime, "stdout": out}


def batched(rounds: int, work: Path, env: dict[str, str]) -> dict[str, float]:
    out = work / f"batched-{rounds}-{time.monotonic_ns()}"
    figures = timed([sys.executable, "-m", "dfedrw.experiments.cli", "run", "--out", str(out), *(f"--set={o}" for o in [*SCENARIO, f"rounds={rounds}"])], env)
    figures["accuracy"] = float(json.loads((out / "summary.json").read_text())["honest_mean_accuracy"])
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--data-dir", type=Path, default=FASHION, help="the four gzipped IDX files (default: Debian's dataset-fashion-mnist)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor:
        print(json.dumps({"accuracy": floor(args.rounds, args.data_dir)}))
        return 0
    if args.pairs < 1 or args.rounds < 1:
        parser.error("--pairs and --rounds must be at least 1")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rows: dict[str, list[dict[str, float]]] = {"batched": [], "floor": [], "batched, 1 round": []}
    with tempfile.TemporaryDirectory(prefix="batched-floor-") as tmp:
        work = Path(tmp)
        for pair in range(args.pairs):
            a = batched(args.rounds, work, env)
            f = timed([sys.executable, str(Path(__file__).resolve()), "--floor", "--rounds", str(args.rounds), "--data-dir", str(args.data_dir)], env)
            f["accuracy"] = float(json.loads(f["stdout"])["accuracy"])
            one = batched(1, work, env)
            for name, fig in (("batched", a), ("floor", f), ("batched, 1 round", one)):
                fig.pop("stdout", None)
                rows[name].append(fig)
            log(f"pair {pair + 1}/{args.pairs}: batched {a['seconds']:.2f} s ({a['accuracy']:.2f}%), floor {f['seconds']:.2f} s ({f['accuracy']:.2f}%), batched 1 round {one['seconds']:.2f} s")
    keys = ("seconds", "user", "system", "accuracy")
    med = {name: {k: statistics.median(x[k] for x in figs) for k in keys} for name, figs in rows.items()}
    ratio = {k: statistics.median(a[k] / f[k] for a, f in zip(rows["batched"], rows["floor"], strict=True)) for k in ("seconds", "user", "system")}
    print(f"batched_floor: whole processes, medians of {args.pairs} alternated pairs, {args.rounds} rounds; {os.cpu_count()} CPUs, one torch thread")
    print("| run | wall s | CPU user s | CPU system s | accuracy % |")
    print("|---|---:|---:|---:|---:|")
    for name, m in med.items():
        print(f"| {name} | {m['seconds']:.2f} | {m['user']:.2f} | {m['system']:.2f} | {m['accuracy']:.2f} |")
    print(f"| batched / floor | {ratio['seconds']:.2f}x | {ratio['user']:.2f}x | {ratio['system']:.2f}x | |")
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "pairs": rows, "median": med, "ratio_median": ratio}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
