"""A decentralized run's honest mean accuracy against one model trained centrally on the same
data with the same steps, in one invocation.

    python bench/centralized.py                      # LeNet-5, Fashion-MNIST, 10 honest clients, IID, DFedAvg, 300 rounds
    python bench/centralized.py --rounds 600 --set train.local_steps=2
    python bench/centralized.py --set train.model=resnet20 --set data.name=cifar10 --set data.dir=DIR

The decentralized run is the scenario in the batched engine (``dfedrw run``, in this process):
10 honest clients on the default Erdos-Renyi graph (rho 0.7), IID shards, DFedAvg, each round
``train.local_steps`` SGD steps of ``train.batch_size`` rows with ``train.lr``,
``train.momentum`` and ``train.weight_decay``. Its figure is the honest clients' mean accuracy
on the global test set after the last round.

The centralized model is trained here on the union of the clients' shards (the same rows),
from the same initial model, with the same optimizer settings and as many steps as one client
takes (rounds x local steps), each on a minibatch of clients x batch rows (so it sees as many
rows as all the clients together; averaging the clients' models is, on IID data, close to
averaging their gradients), the minibatches drawn from a seeded permutation of the union. Its
figure is its accuracy on the same test set. Both are printed, with their difference: the
acceptance of "real models at real sizes" asks for at most 2 points.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCENARIO = [
    "seed=43", "data.name=fashion-mnist", "data.partition=iid", "topology.kind=erdos_renyi", "topology.rho=0.7",
    "topology.honest=10", "topology.byzantine=0", "attack.name=none", "aggregation.rule=dfedavg", "train.model=lenet5",
    "train.lr=0.05", "train.momentum=0.9", "train.batch_size=32", "train.local_steps=5", "eval.every=100", "engine.name=batched",
]


def log(message: str) -> None:
    print(f"[centralized] {message}", file=sys.stderr, flush=True)


def decentralized(scenario) -> dict[str, Any]:
    from rich.console import Console

    from dfedrw.launch.runner import run_scenario

    root = Path(tempfile.mkdtemp(prefix="dfedrw-centralized-"))
    try:
        start = time.monotonic()
        _, summary = run_scenario(scenario, root / "run", console=Console(stderr=True))
        return {"accuracy": summary["honest_mean_global_accuracy"], "seconds": time.monotonic() - start}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def centralized(scenario) -> dict[str, Any]:
    import torch
    from torch.nn import functional as F

    from dfedrw.peer.wiring.assembly import clients_data, initial_model
    from dfedrw.peer.learning.datacache import test_set
    from dfedrw.peer.wiring.build import scenario_dataset
    from dfedrw.peer.wiring.plan import derive_seed, scenario_topology
    from dfedrw.peer.learning.training import BatchOrder, evaluate, learning_rate, sgd_update

    t = scenario.train
    topology = scenario_topology(scenario)
    honest = sorted(topology.honest())
    data = clients_data(scenario, topology, honest)
    x = torch.cat([data[k].train.x for k in honest])
    y = torch.cat([data[k].train.y for k in honest])
    model = initial_model(scenario, honest[0])
    order = BatchOrder(len(y), t.batch_size * len(honest), derive_seed(scenario.seed, "centralized"))
    params = list(model.parameters())
    buffers: list[Any] = [None] * len(params)
    start = time.monotonic()
    for r in range(scenario.rounds):
        lr = learning_rate(t.lr, t.lr_schedule, r, scenario.rounds, gamma=t.lr_gamma, step=t.lr_step)
        for _ in range(t.local_steps):
            idx = order.next()
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            with torch.no_grad():
                buffers = [sgd_update(p, p.grad, b, lr=lr, momentum=t.momentum, weight_decay=t.weight_decay) for p, b in zip(params, buffers, strict=True)]
        if (r + 1) % max(1, scenario.rounds // 10) == 0:
            log(f"centralized: round {r + 1}/{scenario.rounds}")
    accuracy = 100.0 * evaluate(model, test_set(scenario_dataset(scenario.data)))["accuracy"]
    return {"accuracy": accuracy, "seconds": time.monotonic() - start, "steps": scenario.rounds * t.local_steps, "rows": len(y)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (engine.threads for the decentralized run)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a scenario override")
    parser.add_argument("--json", type=Path, help="write the figures to this file too")
    args = parser.parse_args(argv)

    import torch

    from dfedrw.peer.config.scenario import load_scenario

    scenario = load_scenario(None, [*SCENARIO, f"rounds={args.rounds}", f"engine.threads={args.threads}", *args.set])
    torch.set_num_threads(args.threads)
    log("the decentralized run")
    dfl = decentralized(scenario)
    torch.set_num_threads(args.threads)
    log("the centralized model")
    central = centralized(scenario)
    t = scenario.train
    print(f"{t.model}, {scenario.data.name} ({scenario.data.partition}), {scenario.topology.honest} clients, {scenario.aggregation.rule}, "
          f"{scenario.rounds} rounds of {t.local_steps} step(s) of {t.batch_size} rows, lr {t.lr}, momentum {t.momentum}, weight decay {t.weight_decay}")
    print(f"decentralized: honest mean accuracy {dfl['accuracy']:.2f} % ({dfl['seconds']:.0f} s)")
    print(f"centralized:   accuracy {central['accuracy']:.2f} % ({central['steps']} steps of {t.batch_size * scenario.topology.honest} rows "
          f"of the clients' {central['rows']} rows, {central['seconds']:.0f} s)")
    print(f"difference: {dfl['accuracy'] - central['accuracy']:+.2f} points")
    if args.json:
        args.json.write_text(json.dumps({"decentralized": dfl, "centralized": central, "overrides": args.set, "rounds": args.rounds}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
