"""What emulated links and a slow client cost a round: client processes over gRPC with mutual
TLS, the built-in default scenario without Byzantine clients, run four times in one invocation:
with perfect links, with ``--latency`` and ``--bandwidth`` on every link (``[links]``), with
``--loss`` besides, on perfect links with client 0 at ``--speed`` (``peers.0.speed``), and the
same with a round deadline (``--cutoff``, ``network.round_timeout``) shorter than its lag.

    python bench/emulated_links.py                              # 50 ms, 10 Mbit/s, 10 % loss, 60 rounds
    python bench/emulated_links.py --hidden 2000 --rounds 30    # a larger model (an MLP): bandwidth shows
    python bench/emulated_links.py --clients 2                  # fewer processes than cores: nothing hides the wait
    python bench/emulated_links.py --json out.json

Printed for the first two runs: each client's round loop seconds per round (the median over
the clients), the increase the links gave, and what the profile predicts for it: a synchronous
round waits for the neighbours' models, each of which now arrives ``latency + size / bandwidth``
later (its links run side by side, one message at a time each), ``size`` the model message's
bytes on the wire as the clients' records count them. The ratio increase / prediction is 1 when
the emulation costs exactly what the profile says; on a machine with fewer cores than clients
it is below 1, as a client waiting on its links leaves its core to the others' local steps.
Also printed: the round over the links against a perfect round plus that prediction. For the lossy run: the messages the senders'
links lost (their final records), the models the receivers missed (their round records), and
whether every client completed. For the straggler: its round loop seconds per round against
the others' (the median), which in the synchronous protocol wait for it, and the seconds it
waited out; with the short deadline, the others' round against a perfect one, and how many of
the straggler's models they missed (after ``network.max_missed_rounds`` misses they presume it
gone and no longer wait for it). Under asynchronous gossip: each client's local steps per
second, the others' (the median) with the straggler against without it (no barrier: the
straggler does not slow them), and the straggler's own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one_run(work: Path, name: str, rounds: int, hidden: int, steps: int, clients: int, extra: list[str], timeout: float) -> dict:
    out = work / name
    model = ["--set", "train.model=mlp", "--set", f"train.hidden={hidden}"] if hidden else []
    model += ["--set", f"train.local_steps={steps}"]
    cmd = [
        sys.executable, "-m", "dfedrw.experiments.cli", "run", "--out", str(out),
        "--set", f"topology.honest={clients}", "--set", "topology.byzantine=0", "--set", "attack.name=none", "--set", f"rounds={rounds}", "--set", "eval.every=0",
        "--set", "network.transport=grpc", "--set", "network.tls=mutual", *model, *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO.parent)}
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    finals = [json.loads(p.read_text()) for p in sorted((out / "peers").glob("*.json"))]
    per_message, missed, missed_from_0 = [], 0, 0
    for p in sorted((out / "peers").glob("*.jsonl")):
        for line in p.read_text().splitlines():
            record = json.loads(line)
            receivers = len(record.get("weights", {})) - 1
            if receivers > 0 and record.get("bytes_sent"):
                per_message.append(record["bytes_sent"] / receivers)
            missed += len(record.get("missing", []))
            missed_from_0 += 0 in record.get("missing", [])
    summary = json.loads((out / "summary.json").read_text())
    return {
        "run": name,
        "seconds_per_round": statistics.median(f["loop_seconds"] for f in finals) / rounds,
        "others_seconds_per_round": statistics.median(f["loop_seconds"] for f in finals if f.get("id", 0) != 0) / rounds
        if len(finals) > 1 else 0.0,
        "client0": next((f for f in finals if f.get("id") == 0), {}),
        "message_bytes": statistics.median(per_message) if per_message else 0.0,
        "lost": sum(f.get("links", {}).get("lost", 0) for f in finals),
        "missed": missed,
        "missed_from_0": missed_from_0,
        "completed": summary.get("honest_completed"),
        "clients": len(finals),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds on every link (default 0.05)")
    parser.add_argument("--bandwidth", type=float, default=10e6, help="bits per second per link (default 10e6)")
    parser.add_argument("--loss", type=float, default=0.1, help="message loss of the third run (default 0.1)")
    parser.add_argument("--round-timeout", type=float, default=1.0, help="network.round_timeout of the lossy run (default 1 s)")
    parser.add_argument("--hidden", type=int, default=0, help="an MLP of this hidden width instead of softmax regression")
    parser.add_argument("--local-steps", type=int, default=1, help="train.local_steps (default 1)")
    parser.add_argument("--clients", type=int, default=10, help="honest clients (default 10, the default scenario's)")
    parser.add_argument("--speed", type=float, default=0.2, help="client 0's speed in the straggler run (default 0.2)")
    parser.add_argument("--cutoff", type=float, default=0.05, help="network.round_timeout of the straggler's second run (default 0.05 s)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds each run may take")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    links = ["--set", f"links.latency={args.latency}", "--set", f"links.bandwidth={args.bandwidth}"]
    with tempfile.TemporaryDirectory(prefix="dfedrw-links-") as tmp:
        work = Path(tmp)
        steps, n = args.local_steps, args.clients
        base = one_run(work, "perfect", args.rounds, args.hidden, steps, n, [], args.timeout)
        slow = one_run(work, "links", args.rounds, args.hidden, steps, n, links, args.timeout)
        lossy = one_run(
            work, "lossy", args.rounds, args.hidden, steps, n,
            [*links, "--set", f"links.loss={args.loss}", "--set", f"network.round_timeout={args.round_timeout}"], args.timeout,
        )
        lag = one_run(work, "straggler", args.rounds, args.hidden, steps, n, ["--set", f"peers.0.speed={args.speed}"], args.timeout)
        cut = one_run(
            work, "cut off", args.rounds, args.hidden, steps, n,
            ["--set", f"peers.0.speed={args.speed}", "--set", f"network.round_timeout={args.cutoff}"], args.timeout,
        )
        gossip = ["--set", "network.protocol=async"]
        free = one_run(work, "async", args.rounds, args.hidden, steps, n, gossip, args.timeout)
        free_lag = one_run(work, "async straggler", args.rounds, args.hidden, steps, n, [*gossip, "--set", f"peers.0.speed={args.speed}"], args.timeout)
    # The message's size from the perfect run: over the links a round's bytes_sent counts the
    # messages its links released during it, which need not be the round's own.
    transfer = base["message_bytes"] * 8 / args.bandwidth if args.bandwidth else 0.0
    predicted = args.latency + transfer
    increase = slow["seconds_per_round"] - base["seconds_per_round"]
    figures = {
        "rounds": args.rounds, "clients": args.clients, "latency": args.latency, "bandwidth": args.bandwidth, "hidden": args.hidden,
        "message_bytes": base["message_bytes"],
        "perfect_seconds_per_round": round(base["seconds_per_round"], 4),
        "links_seconds_per_round": round(slow["seconds_per_round"], 4),
        "increase_seconds": round(increase, 4), "predicted_seconds": round(predicted, 4),
        "increase_over_predicted": round(increase / predicted, 3) if predicted else None,
        # A round over the links as the profile predicts it: a perfect round plus the wait.
        "predicted_seconds_per_round": round(base["seconds_per_round"] + predicted, 4),
        "round_over_predicted": round(slow["seconds_per_round"] / (base["seconds_per_round"] + predicted), 3),
        "loss": args.loss, "lost": lossy["lost"], "missed": lossy["missed"],
        "lossy_completed": f"{lossy['completed']} of {lossy['clients']}",
        "lossy_seconds_per_round": round(lossy["seconds_per_round"], 4),
        "straggler_speed": args.speed,
        "straggler_seconds_per_round": round(lag["client0"].get("loop_seconds", 0.0) / args.rounds, 4),
        "straggler_waited_seconds": lag["client0"].get("speed", {}).get("waited_seconds"),
        "others_seconds_per_round_with_straggler": round(lag["others_seconds_per_round"], 4),
        "others_seconds_per_round_perfect": round(base["others_seconds_per_round"], 4),
        "cutoff": args.cutoff,
        "others_seconds_per_round_cut_off": round(cut["others_seconds_per_round"], 4),
        "straggler_models_missed_cut_off": cut["missed_from_0"],
        "straggler_models_missed_waiting": lag["missed_from_0"],
        "cut_off_completed": f"{cut['completed']} of {cut['clients']}",
        # Asynchronous gossip: local steps per second (rounds over each client's loop seconds).
        "async_others_steps_per_second_perfect": round(1 / free["others_seconds_per_round"], 2),
        "async_others_steps_per_second_with_straggler": round(1 / free_lag["others_seconds_per_round"], 2),
        "async_straggler_steps_per_second": round(args.rounds / free_lag["client0"].get("loop_seconds", float("inf")), 2),
        "async_completed": f"{free_lag['completed']} of {free_lag['clients']}",
    }
    print(f"model message: {base['message_bytes']:.0f} bytes; links: {args.latency * 1e3:g} ms, {args.bandwidth / 1e6:g} Mbit/s")
    print(f"round loop, median client: {base['seconds_per_round'] * 1e3:.1f} ms/round perfect, "
          f"{slow['seconds_per_round'] * 1e3:.1f} ms/round over the links")
    print(f"increase {increase * 1e3:.1f} ms/round; predicted {predicted * 1e3:.1f} ms "
          f"(latency {args.latency * 1e3:g} + transfer {transfer * 1e3:.1f}); ratio {figures['increase_over_predicted']}")
    print(f"a round over the links: {slow['seconds_per_round'] * 1e3:.1f} ms, predicted "
          f"{figures['predicted_seconds_per_round'] * 1e3:.1f} (a perfect round plus the wait); ratio {figures['round_over_predicted']}")
    print(f"loss {args.loss:g}: {lossy['lost']} messages lost by the senders' links, {lossy['missed']} models missed by the "
          f"receivers; completed {figures['lossy_completed']}; {lossy['seconds_per_round'] * 1e3:.1f} ms/round "
          f"(round_timeout {args.round_timeout:g} s)")
    print(f"client 0 at speed {args.speed:g}: {figures['straggler_seconds_per_round'] * 1e3:.1f} ms/round "
          f"(waited {figures['straggler_waited_seconds']} s in all); the others "
          f"{figures['others_seconds_per_round_with_straggler'] * 1e3:.1f} ms/round, against "
          f"{figures['others_seconds_per_round_perfect'] * 1e3:.1f} without it")
    print(f"the same with round_timeout {args.cutoff:g} s: the others {figures['others_seconds_per_round_cut_off'] * 1e3:.1f} ms/round; "
          f"they missed {cut['missed_from_0']} of client 0's models (waiting for it: {lag['missed_from_0']}); completed {figures['cut_off_completed']}")
    print(f"asynchronous gossip: the others take {figures['async_others_steps_per_second_with_straggler']} steps/s with client 0 at "
          f"speed {args.speed:g}, {figures['async_others_steps_per_second_perfect']} without it; client 0 "
          f"{figures['async_straggler_steps_per_second']} steps/s; completed {figures['async_completed']}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
