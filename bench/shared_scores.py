"""What sharing scores costs: bytes per link with and without them, and seconds per round of the
batched engine with and without them, in one invocation.

The robustness table's setting (``examples/byzantine_fmnist.toml``: Fashion-MNIST, softmax
regression, 10 honest + 2 Byzantine clients on ER(0.7), the batched engine) with the
neighbourhood rule (``aggregation.rule = "neighbourhood_reweighting"``, TPM loss, CRS
``loss_drop_highest`` with inverse weights), ``network.share_scores`` off and on, on with the
rule's memory (``memory = 0.9``: the left-out rates it keeps from round to round), and the
screened rule for reference. Each configuration runs ``--repeats`` times, interleaved (A B C D A
B C D ...), so that a machine that gets busier during the invocation slows each alike; the figures
are the median and the minimum of the round loops (the batched engine's ``loop_seconds`` over
the rounds).

Bytes: with emulated links (``links.latency``, which gives the batched engine a clock, so that
it counts each link's bytes as a client does), the honest clients' mean bytes per message, from
their round records (``bytes_sent`` over the messages of the round, one to each neighbour),
without scores and with them, from round 1 on (a client has none to send before its first
aggregation).

    python bench/shared_scores.py
    python bench/shared_scores.py --rounds 100 --repeats 5 --json bench/results/shared_scores.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "examples" / "byzantine_fmnist.toml"
NEIGHBOURHOOD = (
    "aggregation.rule=neighbourhood_reweighting", "aggregation.tpm=loss", "aggregation.crs=loss_drop_highest",
    "aggregation.crs_params.loss_drop_highest.weighting=inverse",
)
SCREENED = (
    "aggregation.rule=screened_reweighting", "aggregation.tpm=loss", "aggregation.crs=loss_drop_highest",
    "aggregation.crs_params.loss_drop_highest.weighting=inverse",
)
CONFIGS = {
    "neighbourhood, no scores": (*NEIGHBOURHOOD, "network.share_scores=false"),
    "neighbourhood, scores": (*NEIGHBOURHOOD, "network.share_scores=true"),
    "neighbourhood, memory": (*NEIGHBOURHOOD, "network.share_scores=true", "aggregation.neighbourhood_reweighting.memory=0.9"),
    "screened": SCREENED,
}


def _run(settings: list[str], out: Path) -> tuple[Path, dict]:
    from dfedrw.launch.runner import run_scenario
    from dfedrw.peer.config.scenario import load_scenario
    from tests.support.runs import quiet_console

    return run_scenario(load_scenario(BASE, settings), out, console=quiet_console())


def round_seconds(common: list[str], repeats: int, rounds: int, work: Path) -> dict[str, dict[str, float]]:
    """Per configuration: the median and minimum seconds per round of its round loop."""
    from dfedrw.peer.results.records import read_final

    loops: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for i in range(repeats):
        for name, settings in CONFIGS.items():
            out, _ = _run([*common, *settings], work / f"{i}-{name.replace(' ', '_').replace(',', '')}")
            loops[name].append(read_final(out, 0)["loop_seconds"] / rounds)
            print(f"  {name}: run {i + 1}/{repeats}, {loops[name][-1] * 1e3:.2f} ms a round", file=sys.stderr)
    return {name: {"median": statistics.median(v), "min": min(v)} for name, v in loops.items()}


def message_bytes(common: list[str], work: Path) -> dict[str, float]:
    """The honest clients' mean bytes per message, without scores and with them."""
    from dfedrw.peer.results.records import read_rounds

    clocked = [*common, "links.latency=0.001"]
    out = {}
    for name, settings in (("no scores", CONFIGS["neighbourhood, no scores"]), ("scores", CONFIGS["neighbourhood, scores"])):
        folder, summary = _run([*clocked, *settings], work / f"bytes-{name.replace(' ', '_')}")
        per_message = []
        for k, peer in summary["peers"].items():
            if peer["role"] != "honest":
                continue
            for record in read_rounds(folder, int(k))[1:]:
                receivers = len(record["weights"]) - 1 + len(record["missing"])
                if receivers:
                    per_message.append(record["bytes_sent"] / receivers)
        out[name] = statistics.mean(per_message)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=44)
    parser.add_argument("--partition", default="dirichlet:0.1")
    parser.add_argument("--attack", default="label_flip")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    common = [
        f"rounds={args.rounds}", "eval.every=0", "engine.name=batched", f"seed={args.seed}", f"data.partition={args.partition}",
        f"attack.name={args.attack}",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sizes = message_bytes(common, work)
        timing = round_seconds(common, args.repeats, args.rounds, work)
    base = timing["neighbourhood, no scores"]["median"]
    print(f"{args.rounds} rounds, {args.partition}, attack {args.attack}, seed {args.seed}, {args.repeats} runs each, interleaved")
    print(f"bytes per message: {sizes['no scores']:.1f} without scores, {sizes['scores']:.1f} with them "
          f"(+{sizes['scores'] - sizes['no scores']:.1f}, x{sizes['scores'] / sizes['no scores']:.4f})")
    for name, t in timing.items():
        print(f"{name:<26} {t['median'] * 1e3:8.2f} ms a round (min {t['min'] * 1e3:.2f})  x{t['median'] / base:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"settings": vars(args) | {"json": str(args.json)}, "bytes": sizes, "seconds_per_round": timing}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
