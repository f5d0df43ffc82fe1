"""A convolutional model's round in the batched engine against the plain PyTorch loop a user
would write for it, and both against the round's arithmetic.

    python bench/cnn_round.py                          # LeNet-5, Fashion-MNIST, 10 + 2 (Gaussian), DFedReweighting, 12 rounds
    python bench/cnn_round.py --rounds 24 --threads 2
    python bench/cnn_round.py --vmap                    # also the engine with the models vmapped (the layout it had before)
    python bench/cnn_round.py --set train.model=mymodels:lenet --json out.json

One invocation runs, back to back, on the same scenario (the paper's Byzantine setting: IID
Fashion-MNIST, an Erdos-Renyi graph of rho 0.7, 10 honest clients and 2 Gaussian attackers,
DFedReweighting with the loss TPM and the loss clipped at the mean, one SGD step of 32 rows a
round, an evaluation every 10 rounds and at the last):

* the batched engine (``dfedrw run`` with ``engine.name = "batched"``, in this process): the
  round loop's seconds from its records;
* the plain loop: one ``nn.Module`` per client, as a user writes it without this project's
  engine: each client's SGD step (autograd, ``p -= lr * grad``), the attackers' messages (the
  mean of what each received plus N(0, 30^2) noise), then each client loads every candidate
  (its own model, each neighbour's) into a scratch model with ``vector_to_parameters`` and
  scores it under ``no_grad`` on its auxiliary rows, clips at the mean loss and averages; the
  evaluation on the test set in batches of 1,000. It uses the project's partition, graph, seeds
  and minibatch order (so both do the same work), nothing of its engine;
* the arithmetic: the multiply-adds of one round (convolutions and linear layers, forward and
  backward, counted by ``torch.utils.flop_counter``), and the time they would take at the rate
  of a 1024 x 1024 float32 matrix product on this machine with the same threads (measured here).

It prints seconds per round (the rounds with an evaluation and those without, apart and
together), the ratio engine / loop (the target: at most 1.0), and each against the arithmetic.
Both use ``--threads`` torch threads (default 1, the engine's default). Progress goes to stderr,
the table to stdout. On a shared machine the ratios are the figures to quote.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCENARIO = [
    "seed=43", "data.name=fashion-mnist", "data.partition=iid", "topology.kind=erdos_renyi", "topology.rho=0.7",
    "topology.honest=10", "topology.byzantine=2", "attack.name=gaussian", "aggregation.rule=dfedreweighting",
    "aggregation.tpm=loss", "aggregation.crs=loss_clip_mean", "train.model=lenet5", "train.lr=0.01", "train.batch_size=32",
    "eval.every=10", "engine.name=batched",
]


def log(message: str) -> None:
    print(f"[cnn_round] {message}", file=sys.stderr, flush=True)


def eval_due(scenario, r: int) -> bool:
    every = scenario.eval.every
    return r == scenario.rounds - 1 or bool(every and (r + 1) % every == 0)


def engine_round_loop(overrides: list[str]) -> dict[str, Any]:
    """The batched engine's run of the scenario: round-loop seconds and the honest accuracy."""
    from rich.console import Console

    from dfedrw.launch.runner import run_scenario
    from dfedrw.peer.config.scenario import load_scenario

    scenario = load_scenario(None, overrides)
    root = Path(tempfile.mkdtemp(prefix="dfedrw-cnn-round-"))
    try:
        out, summary = run_scenario(scenario, root / "run", console=Console(stderr=True))
        records = [json.loads((out / "peers" / f"{k}.json").read_text()) for k, p in summary["peers"].items() if p.get("role") == "honest"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"loop_seconds": max(r["loop_seconds"] for r in records), "accuracy": summary["honest_mean_accuracy"]}


class PlainLoop:
    """The scenario's rounds as plain PyTorch, one module per client (see the module docstring)."""

    def __init__(self, overrides: list[str]) -> None:
        import torch

        from dfedrw.peer.wiring.assembly import clients_data, initial_model, scenario_model
        from dfedrw.peer.config.scenario import load_scenario
        from dfedrw.peer.learning.datacache import test_set
        from dfedrw.peer.wiring.build import scenario_dataset
        from dfedrw.peer.wiring.plan import derive_seed, scenario_topology
        from dfedrw.peer.learning.training import BatchOrder

        self.scenario = sc = load_scenario(None, overrides)
        topo = scenario_topology(sc)
        self.honest, self.byzantine = sorted(topo.honest()), sorted(topo.byzantine)
        self.neighbours = {k: sorted(topo.graph.neighbors(k)) for k in range(topo.num_clients)}
        self.data = clients_data(sc, topo, self.honest)
        self.test = test_set(scenario_dataset(sc.data))
        self.models = {k: initial_model(sc, k) for k in self.honest}
        self.scratch = scenario_model(sc)
        self.batches = {k: BatchOrder(len(self.data[k].train), sc.train.batch_size, derive_seed(sc.seed, "batches", k)) for k in self.honest}
        self.noise = {b: torch.Generator().manual_seed(derive_seed(sc.seed, "attack", b)) for b in self.byzantine}

    def train(self, k: int) -> None:
        import torch
        from torch.nn import functional as F

        model, shard = self.models[k], self.data[k].train
        idx = self.batches[k].next()
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(shard.x[idx]), shard.y[idx]).backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-self.scenario.train.lr)

    def score(self, vector, aux) -> float:
        import torch
        from torch.nn import functional as F

        torch.nn.utils.vector_to_parameters(vector, self.scratch.parameters())
        with torch.no_grad():
            return float(F.cross_entropy(self.scratch(aux.x), aux.y))

    def accuracy(self, k: int) -> float:
        import torch

        with torch.no_grad():
            hits = sum(int((self.models[k](x).argmax(1) == y).sum()) for x, y in zip(self.test.x.split(1000), self.test.y.split(1000), strict=True))
        return 100.0 * hits / len(self.test.y)

    def round(self, r: int) -> None:
        import torch

        for k in self.honest:
            self.train(k)
        vectors = {k: torch.nn.utils.parameters_to_vector(self.models[k].parameters()).detach().clone() for k in self.honest}
        for b in self.byzantine:
            heard = [vectors[k] for k in self.neighbours[b] if k in vectors]
            base = torch.stack(heard).mean(0) if heard else torch.zeros_like(next(iter(vectors.values())))
            vectors[b] = base + 30.0 * torch.randn(base.shape, generator=self.noise[b])
        for k in self.honest:
            candidates = [vectors[k], *(vectors[j] for j in self.neighbours[k])]
            losses = [self.score(v, self.data[k].aux) for v in candidates]
            finite = [x for x in losses if math.isfinite(x)]
            mean = sum(finite) / len(finite)
            kept = [x if math.isfinite(x) and x <= mean else 0.0 for x in losses]
            total = sum(kept) or 1.0
            mixed = sum((w / total) * v for w, v in zip(kept, candidates, strict=True))
            torch.nn.utils.vector_to_parameters(mixed, self.models[k].parameters())
        if eval_due(self.scenario, r):
            self.last_accuracy = sum(self.accuracy(k) for k in self.honest) / len(self.honest)

    def run(self) -> dict[str, Any]:
        seconds = {"eval": [], "plain": []}
        for r in range(self.scenario.rounds):
            start = time.perf_counter()
            self.round(r)
            seconds["eval" if eval_due(self.scenario, r) else "plain"].append(time.perf_counter() - start)
        return {"loop_seconds": sum(seconds["eval"]) + sum(seconds["plain"]), "seconds": seconds, "accuracy": self.last_accuracy}

    def flops(self) -> dict[str, float]:
        """Multiply-adds x 2 of one round without evaluation and of one evaluation."""
        import torch
        from torch.nn import functional as F
        from torch.utils.flop_counter import FlopCounterMode

        k = self.honest[0]
        model = copy.deepcopy(self.models[k])
        shard, aux = self.data[k].train, self.data[k].aux
        with FlopCounterMode(display=False) as step:
            F.cross_entropy(model(shard.x[: self.scenario.train.batch_size]), shard.y[: self.scenario.train.batch_size]).backward()
        with FlopCounterMode(display=False) as row, torch.no_grad():
            model(aux.x[:1])
        per_row = row.get_total_flops()
        scored_rows = sum((1 + len(self.neighbours[h])) * len(self.data[h].aux.y) for h in self.honest)
        round_flops = len(self.honest) * step.get_total_flops() + scored_rows * per_row
        return {"round": float(round_flops), "evaluation": float(len(self.honest) * len(self.test.y) * per_row)}


def matmul_rate(threads: int) -> float:
    """FLOP/s of a 1024 x 1024 float32 matrix product, best of several."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.rand(1024, 1024), torch.rand(1024, 1024)
    a @ b
    best = math.inf
    for _ in range(10):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * 1024**3 / best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both (engine.threads for the engine)")
    parser.add_argument("--vmap", action="store_true", help="also run the engine with the models vmapped (FlatModel layout 'vmap')")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a scenario override for every run")
    parser.add_argument("--json", type=Path, help="write every figure to this file too")
    args = parser.parse_args(argv)

    import torch

    overrides = [*SCENARIO, f"rounds={args.rounds}", f"engine.threads={args.threads}", *args.set]
    torch.set_num_threads(args.threads)
    rate = matmul_rate(args.threads)
    log(f"matrix product: {rate / 1e9:.1f} GFLOP/s on {args.threads} thread(s)")

    log("the plain loop")
    loop = PlainLoop(overrides)
    flops = loop.flops()
    plain = loop.run()
    log(f"plain loop: {plain['loop_seconds']:.1f} s, honest accuracy {plain['accuracy']:.2f} %")
    sc = loop.scenario
    evals = sum(eval_due(sc, r) for r in range(sc.rounds))
    total_flops = sc.rounds * flops["round"] + evals * flops["evaluation"]

    rows: list[dict[str, Any]] = []
    layouts = ["loop", *(["vmap"] if args.vmap else [])]
    for layout in layouts:
        log(f"the batched engine (models {'called one by one' if layout == 'loop' else 'vmapped'})")
        from dfedrw.peer.learning import model_matrix as training
        original, training.FlatModel.default_layout = training.FlatModel.default_layout, layout
        try:
            torch.set_num_threads(args.threads)
            engine = engine_round_loop(overrides)
        finally:
            training.FlatModel.default_layout = original
        rows.append({"what": f"batched engine ({layout})", **engine})
    rows.append({"what": "plain PyTorch loop", **plain})

    arithmetic = total_flops / rate
    print(f"{sc.train.model}, {sc.data.name}, {len(loop.honest)} + {len(loop.byzantine)} clients, {sc.aggregation.rule}, "
          f"{sc.rounds} rounds ({evals} with an evaluation), {args.threads} thread(s)")
    print(f"arithmetic: {flops['round'] / 1e9:.2f} GFLOP a round, {flops['evaluation'] / 1e9:.2f} GFLOP an evaluation; "
          f"{total_flops / 1e9:.1f} GFLOP in all = {arithmetic:.2f} s at the matrix product's {rate / 1e9:.1f} GFLOP/s")
    print(f"{'':28} {'s / round':>10} {'total s':>9} {'vs loop':>8} {'vs arithmetic':>14} {'GFLOP/s':>8} {'accuracy %':>11}")
    for row in rows:
        row["per_round"] = row["loop_seconds"] / sc.rounds
        row["vs_loop"] = row["loop_seconds"] / plain["loop_seconds"]
        row["vs_arithmetic"] = row["loop_seconds"] / arithmetic
        row["gflops"] = total_flops / row["loop_seconds"] / 1e9
        print(f"{row['what']:28} {row['per_round']:10.3f} {row['loop_seconds']:9.2f} {row['vs_loop']:7.2f}x {row['vs_arithmetic']:13.1f}x "
              f"{row['gflops']:8.1f} {row['accuracy']:11.2f}")
    plain_rounds = plain["seconds"]["plain"]
    if plain_rounds:
        print(f"plain loop: {sum(plain_rounds) / len(plain_rounds):.3f} s a round without evaluation, "
              f"{sum(plain['seconds']['eval']) / max(1, evals):.3f} s with one")
    if args.json:
        args.json.write_text(json.dumps({"flops": flops, "matmul_flops_per_s": rate, "rows": rows, "overrides": overrides}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
