"""A convolutional model's round in the batched engine against the plain PyTorch loop a user
would write for it, and both against the round's arithmetic.

    python bench/cnn_round.py                          # LeNet-5, Fashion-MNIST, 10 + 2 (Gaussian), DFedReweighting, 12 rounds
    python bench/cnn_round.py --rounds 24 --threads 2
    python bench/cnn_round.py --layouts loop,vmap,auto  # the engine in each layout (engine.layout), and its own pick
    python bench/cnn_round.py --device cuda --layouts loop,vmap,auto --set train.model=resnet20
    python bench/cnn_round.py --set train.model=mymodels:lenet --json out.json
    python bench/cnn_round.py --set data.dir=DIR        # the IDX files in DIR (bench/synthetic_idx.py writes some)

One invocation runs, back to back, on the same scenario (the paper's Byzantine setting: IID
Fashion-MNIST, an Erdos-Renyi graph of rho 0.7, 10 honest clients and 2 Gaussian attackers,
DFedReweighting with the loss TPM and the loss clipped at the mean, one SGD step of 32 rows a
round, an evaluation every 10 rounds and at the last):

* the batched engine (``dfedrw run`` with ``engine.name = "batched"``, in this process): the
  round loop's seconds from its records, once per layout of ``--layouts`` (``engine.layout``:
  ``loop``, the models called one after the other; ``vmap``, all of them in one call per layer,
  grouped convolutions; ``auto``, the engine's own pick, which it records);
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

``--device cuda`` runs all of it on the GPU (``engine.device``; the plain loop's modules, data
and vectors there too, the attackers' noise drawn on the CPU as the engine draws it), the
arithmetic's rate then that of an 8192 x 8192 float32 product there, and each row adds the
most the GPU held for it (``torch.cuda.max_memory_allocated``).
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
    """The batched engine's run of the scenario: round-loop seconds, the honest accuracy and
    the layout the engine ran its models in (and, under ``auto``, how it picked it)."""
    from rich.console import Console

    # The batched engine's own launcher (what `dfedrw run` calls for it), which needs no
    # network library: the bench runs where only torch and the project's data libraries are.
    from dfedrw.launch.batched_engine import run_batched
    from dfedrw.peer.config.scenario import load_scenario

    scenario = load_scenario(None, overrides)
    root = Path(tempfile.mkdtemp(prefix="dfedrw-cnn-round-"))
    try:
        out = root / "run"
        summary = run_batched(scenario, out, console=Console(stderr=True))
        records = [json.loads((out / "peers" / f"{k}.json").read_text()) for k, p in summary["peers"].items() if p.get("role") == "honest"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    picked = {key: summary[key] for key in ("layout", "layout_choice", "layout_seconds") if key in summary}
    return {"loop_seconds": max(r["loop_seconds"] for r in records), "accuracy": summary["honest_mean_accuracy"], **picked}


class PlainLoop:
    """The scenario's rounds as plain PyTorch, one module per client (see the module docstring)."""

    def __init__(self, overrides: list[str], device: str = "cpu") -> None:
        import torch

        from dfedrw.peer.wiring.assembly import clients_data, initial_model, move, scenario_model
        from dfedrw.peer.config.scenario import load_scenario
        from dfedrw.peer.learning.datacache import test_set
        from dfedrw.peer.wiring.build import scenario_dataset
        from dfedrw.peer.wiring.plan import derive_seed, scenario_topology
        from dfedrw.peer.learning.training import BatchOrder

        self.scenario = sc = load_scenario(None, overrides)
        self.device = torch.device(device)
        topo = scenario_topology(sc)
        self.honest, self.byzantine = sorted(topo.honest()), sorted(topo.byzantine)
        self.neighbours = {k: sorted(topo.graph.neighbors(k)) for k in range(topo.num_clients)}
        self.data = {k: d.to(self.device) for k, d in clients_data(sc, topo, self.honest).items()}
        self.test = move(test_set(scenario_dataset(sc.data)), self.device)
        self.models = {k: initial_model(sc, k).to(self.device) for k in self.honest}
        self.scratch = scenario_model(sc).to(self.device)
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
            vectors[b] = base + 30.0 * torch.randn(base.shape, generator=self.noise[b]).to(base.device)
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
            synchronize(self.device)
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


def synchronize(device) -> None:
    """Wait for the device's queued work (a GPU's kernels run after the call that queued them)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(threads: int, device: str = "cpu") -> float:
    """FLOP/s of a float32 matrix product, best of several: 1024 x 1024 on the CPU, 8192 x 8192
    on a GPU (a 1024 product there is over before the card is busy)."""
    import torch

    torch.set_num_threads(threads)
    n = 1024 if torch.device(device).type == "cpu" else 8192
    a, b = torch.rand(n, n, device=device), torch.rand(n, n, device=device)
    a @ b
    synchronize(device)
    best = math.inf
    for _ in range(10):
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def load_average() -> list[float] | None:
    """The machine's 1, 5 and 15 minute load averages (on a shared machine, how busy it was)."""
    import os

    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def peak_memory(device) -> float | None:
    """MiB the GPU held at most since the last reset (None on the CPU), and a reset."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated(device) / 2**20
    torch.cuda.reset_peak_memory_stats(device)
    return round(peak, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both (engine.threads for the engine)")
    parser.add_argument("--layouts", default="loop", help="the engine's layouts to run, comma-separated: loop, vmap, auto (default: loop)")
    parser.add_argument("--vmap", action="store_true", help="the same as adding vmap to --layouts")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", help="leave out the untimed round of the engine run first")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where the engine and the plain loop compute (default: cpu)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a scenario override for every run")
    parser.add_argument("--json", type=Path, help="write every figure to this file too")
    args = parser.parse_args(argv)

    import torch

    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()] + (["vmap"] if args.vmap else [])
    layouts = list(dict.fromkeys(layouts))
    if not layouts or any(x not in ("loop", "vmap", "auto") for x in layouts):
        parser.error(f"--layouts {args.layouts!r}: expected a comma-separated list of loop, vmap, auto")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this machine has no CUDA device (torch.cuda.is_available() is False)")
    overrides = [*SCENARIO, f"rounds={args.rounds}", f"engine.threads={args.threads}", f"engine.device={args.device}", *args.set]
    torch.set_num_threads(args.threads)
    rate = matmul_rate(args.threads, args.device)
    where = f"{args.threads} thread(s)" if args.device == "cpu" else f"{args.device} ({torch.cuda.get_device_name(args.device)})"
    log(f"matrix product: {rate / 1e9:.1f} GFLOP/s on {where}")

    log("the plain loop")
    peak_memory(args.device)
    loop = PlainLoop(overrides, args.device)
    flops = loop.flops()
    plain = loop.run()
    plain["cuda_max_allocated_mib"] = peak_memory(args.device)
    log(f"plain loop: {plain['loop_seconds']:.1f} s, honest accuracy {plain['accuracy']:.2f} %")
    sc = loop.scenario
    evals = sum(eval_due(sc, r) for r in range(sc.rounds))
    total_flops = sc.rounds * flops["round"] + evals * flops["evaluation"]

    arithmetic = total_flops / rate
    machine = {"device": args.device, "where": where, "torch": torch.__version__, "threads": args.threads, "load_average_at_start": load_average()}
    rows: list[dict[str, Any]] = []

    def add(row: dict[str, Any]) -> None:
        """A row with its ratios, and --json written again: a run stopped part way keeps the
        rows it finished."""
        row["per_round"] = row["loop_seconds"] / sc.rounds
        row["vs_loop"] = row["loop_seconds"] / plain["loop_seconds"]
        row["vs_arithmetic"] = row["loop_seconds"] / arithmetic
        row["gflops"] = total_flops / row["loop_seconds"] / 1e9
        rows.append(row)
        machine["load_average_at_end"] = load_average()
        if args.json:
            ordered = [r for r in rows if r["what"] != "plain PyTorch loop"] + [r for r in rows if r["what"] == "plain PyTorch loop"]
            args.json.write_text(json.dumps({"flops": flops, "matmul_flops_per_s": rate, "rows": ordered, "overrides": overrides, "machine": machine}, indent=1) + "\n")

    add({"what": "plain PyTorch loop", **plain})
    if args.warmup:
        # The process's first engine run pays what later ones do not (kernel selection, CUDA's
        # start, the first touch of the data): one round of it, untimed, before the rows.
        log("the batched engine, one round untimed (warm-up)")
        engine_round_loop([*overrides, "rounds=1", "engine.layout=loop"])
    said = {"loop": "models called one by one", "vmap": "models vmapped", "auto": "the engine's pick"}
    for layout in layouts:
        log(f"the batched engine ({said[layout]})")
        torch.set_num_threads(args.threads)
        engine = engine_round_loop([*overrides, f"engine.layout={layout}"])
        engine["cuda_max_allocated_mib"] = peak_memory(args.device)
        what = f"batched engine ({layout}: {engine.get('layout', '?')})" if layout == "auto" else f"batched engine ({layout})"
        if layout == "auto":
            log(f"the engine picked {engine.get('layout')} ({engine.get('layout_choice')}; {engine.get('layout_seconds') or 'not timed'})")
        add({"what": what, **engine})
    rows.append(rows.pop(0))  # the plain loop last, as the reference under the engine's rows

    print(f"{sc.train.model}, {sc.data.name}, {len(loop.honest)} + {len(loop.byzantine)} clients, {sc.aggregation.rule}, "
          f"{sc.rounds} rounds ({evals} with an evaluation), {where}")
    print(f"arithmetic: {flops['round'] / 1e9:.2f} GFLOP a round, {flops['evaluation'] / 1e9:.2f} GFLOP an evaluation; "
          f"{total_flops / 1e9:.1f} GFLOP in all = {arithmetic:.2f} s at the matrix product's {rate / 1e9:.1f} GFLOP/s")
    print(f"{'':34} {'s / round':>10} {'total s':>9} {'vs loop':>8} {'vs arithmetic':>14} {'GFLOP/s':>8} {'accuracy %':>11}"
          + (f" {'GPU MiB':>8}" if args.device != "cpu" else ""))
    for row in rows:
        print(f"{row['what']:34} {row['per_round']:10.3f} {row['loop_seconds']:9.2f} {row['vs_loop']:7.2f}x {row['vs_arithmetic']:13.1f}x "
              f"{row['gflops']:8.1f} {row['accuracy']:11.2f}" + (f" {row['cuda_max_allocated_mib']:8.0f}" if args.device != "cpu" else ""))
    plain_rounds = plain["seconds"]["plain"]
    if plain_rounds:
        print(f"plain loop: {sum(plain_rounds) / len(plain_rounds):.3f} s a round without evaluation, "
              f"{sum(plain['seconds']['eval']) / max(1, evals):.3f} s with one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
