"""The figures of two seeded runs, kept in ``tests/data/seeded_runs.json`` so that a change
meant to change nothing (data loading, process start, threads) is checked to leave every
accuracy, loss and weight the same to the last bit.

Each scenario runs in one process (the in-process transport: the same client code as a client
process), and what its clients wrote is kept, less what depends on the clock or on when
messages arrived (times, process ids, addresses, byte counts).

    python scripts/seeded_runs.py --write      # after a change that is meant to change results
    python scripts/seeded_runs.py              # compare with the stored figures (exit 1 if they differ)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STORED = REPO / "tests" / "data" / "seeded_runs.json"
SCENARIOS = {
    "digits": ["rounds=30", "eval.every=10", "seed=43", "train.lr=0.01", "network.transport=inproc", "aggregation.rule=dfedreweighting", "attack.name=gaussian"],
    "fashion-mnist": [
        "rounds=10", "eval.every=5", "seed=43", "train.lr=0.01", "network.transport=inproc", "data.name=fashion-mnist",
        "aggregation.rule=dfedreweighting", "attack.name=alie",
    ],
}
# What depends on the clock or on when messages arrived, not on the seed.
_TIMING = {"wall_seconds", "loop_seconds", "loop_cpu_seconds", "loop_started_at", "pid", "launcher_pid", "pids", "address"}


def _kept(value):
    if isinstance(value, dict):
        return {k: _kept(v) for k, v in value.items() if k not in _TIMING and not k.startswith("bytes_")}
    if isinstance(value, list):
        return [_kept(v) for v in value]
    return value


def figures(name: str) -> dict:
    """Every client's round records and final record of scenario ``name``, as run now."""
    from rich.console import Console

    from dfedrw.launch.inproc import run_inproc
    from dfedrw.peer.config import load_scenario

    scenario = load_scenario(None, SCENARIOS[name])
    with tempfile.TemporaryDirectory() as out:
        run_inproc(scenario, Path(out), console=Console(stderr=True, quiet=True))
        peers = {}
        for f in sorted((Path(out) / "peers").iterdir()):
            if f.suffix == ".jsonl":
                peers[f.name] = _kept([json.loads(line) for line in f.read_text().splitlines()])
            elif f.suffix == ".json":
                peers[f.name] = _kept(json.loads(f.read_text()))
    return peers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="store the figures of this code instead of comparing")
    args = parser.parse_args(argv)
    if args.write:
        STORED.write_text(json.dumps({name: figures(name) for name in SCENARIOS}, sort_keys=True, separators=(",", ":")) + "\n")
        print(f"wrote {STORED}")
        return 0
    stored = json.loads(STORED.read_text())
    differing = [name for name in SCENARIOS if figures(name) != stored[name]]
    print("identical" if not differing else f"differ: {', '.join(differing)}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.path[:0] = [str(REPO.parent)]
    sys.exit(main())
