"""Each rule's batched path against the rule called once per client, on a batch's own rounds.

A rule may have a ``batched`` method: the round of many clients at once, bit for bit what the
rule's one-client call gives each of them. Without it the batched engine calls the rule once per
client (``rule(batch.one(c))``). Both are written for a rule that has one, so this bench says
what the second one buys: for each rule, a few runs of the Byzantine grid's setting
(``examples/byzantine_fmnist.toml``: Fashion-MNIST, 10 honest + 2 Gaussian clients, ER(0.7)),
differing in seed, run as one batch (as a sweep runs them), and the rule's batched calls of the
last ``--keep`` rounds are recorded with their inputs. Each recorded call is timed both ways on
the same inputs:

* ``batched``: ``rule.batched(batch)``, what the engine runs;
* ``per client``: each client's own rule called on its own inputs, what the engine would run
  were ``batched`` derived from the one-client call;

and how far apart their models are (0: the same to the bit; a rule whose batched path sums with
one matrix product for all clients is the same up to float rounding). Printed per rule: CPU
milliseconds per run and round of each (10 honest clients), and the ratio per client / batched.

    python bench/rules_batched.py
    python bench/rules_batched.py --rules median,krum --runs 4 --rounds 40 --keep 10 --repeat 5

CPU time (``time.process_time``), torch on one thread, as in a sweep's children.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from rules_floor import clock  # beside this script: CPU seconds a call, averaged

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "examples" / "byzantine_fmnist.toml"
# The one-client settings each rule needs beside the base scenario's.
SETTINGS: dict[str, list[str]] = {"flame": ["aggregation.flame_cluster_on=models"]}


def batched_rules() -> list[str]:
    from dfedrw.peer.aggregation import RULE_REGISTRY

    return [name for name in RULE_REGISTRY.names() if callable(getattr(RULE_REGISTRY.get(name), "batched", None))]


def record_calls(rule: str, runs: int, rounds: int, keep: int, overrides: list[str], work: Path) -> list:
    """The rule's batched calls in the last ``keep`` rounds of ``runs`` seeds run as one batch."""
    from dfedrw.engines.run import BatchedRun
    from dfedrw.engines.together import run_together
    from dfedrw.peer.aggregation import RULE_REGISTRY
    from dfedrw.peer.config.scenario import load_scenario

    cls = RULE_REGISTRY.get(rule)
    original = cls.batched
    calls = []

    def recorded(self, batch):
        if batch.round >= rounds - keep:
            calls.append((self, batch))
        return original(self, batch)

    scenarios = [
        load_scenario(BASE, [*overrides, f"aggregation.rule={rule}", *SETTINGS.get(rule, []), f"seed={43 + i}", f"rounds={rounds}", "engine.name=batched", "eval.every=0"])
        for i in range(runs)
    ]
    cls.batched = recorded
    try:
        run_together([BatchedRun(sc, work / rule / f"run-{i}") for i, sc in enumerate(scenarios)])
    finally:
        cls.batched = original
    return calls


def per_client(rule, batch) -> list:
    rules = batch.rules or (rule,) * len(batch)
    return [rules[c](batch.one(c)) for c in range(len(batch))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", default=None, help="comma-separated rule names (default: every rule with a batched path)")
    parser.add_argument("--runs", type=int, default=4, help="runs of each rule, all in one batch (default 4)")
    parser.add_argument("--rounds", type=int, default=30, help="rounds the batch runs (default 30)")
    parser.add_argument("--keep", type=int, default=10, help="last rounds whose calls are timed (default 10)")
    parser.add_argument("--repeat", type=int, default=3, help="timings of each call, averaged (default 3)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="a setting of the base scenario")
    args = parser.parse_args(argv)
    if min(args.runs, args.rounds, args.keep, args.repeat) < 1 or args.keep > args.rounds:
        parser.error("--runs, --rounds, --keep and --repeat must be at least 1, and --keep at most --rounds")
    known = batched_rules()
    names = known if args.rules is None else [n.strip() for n in args.rules.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"--rules: {', '.join(unknown)} has no batched path; those that have: {', '.join(known)}")
    torch.set_num_threads(1)
    print(f"{'rule':22} {'batched':>9} {'per client':>11} {'per client / batched':>21}  {'models apart':>12}")
    work = Path(tempfile.mkdtemp(prefix="rules-batched-"))
    try:
        for name in names:
            calls = record_calls(name, args.runs, args.rounds, args.keep, args.overrides, work)
            totals = collections.Counter()
            apart = 0.0
            for rule, batch in calls:
                totals["batched"] += clock(lambda: rule.batched(batch), args.repeat)
                totals["per client"] += clock(lambda: per_client(rule, batch), args.repeat)
                for a, b in zip(rule.batched(batch), per_client(rule, batch), strict=True):
                    apart = max(apart, float((a.model.double() - b.model.double()).abs().max() / b.model.double().abs().max().clamp_min(1e-300)))
            ms = {k: 1000 * v / (args.runs * args.keep) for k, v in totals.items()}
            print(f"{name:22} {ms['batched']:9.2f} {ms['per client']:11.2f} {ms['per client'] / ms['batched']:21.2f}  {apart:10.1e}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("ms: CPU milliseconds per run and round (one run's 10 honest clients), the rule's aggregation only")
    print("models apart: largest |difference| of a client's model over its largest |entry| (0: the same to the bit)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
