"""The figures of two seeded runs, kept in ``tests/data/seeded_runs.json`` so that a change
meant to change nothing (data loading, process start, threads) is checked to leave every
accuracy, loss and weight the same to the last bit.

Each scenario runs in one process (the in-process transport: the same client code as a client
process), and what its clients wrote is kept, less what depends on the clock or on when
messages arrived (times, process ids, addresses, byte counts).

The last bit is a property of the code *and* of the floating-point kernels it runs on: torch
and MKL pick their vector instructions by CPU (AVX2, AVX-512, ...), and a sum taken in other
lanes can round otherwise. So the file also keeps a fingerprint of those kernels (a digest of
a few products, reductions and activations on fixed inputs). Where this machine's fingerprint
is the stored one, the figures must be equal to the last bit; elsewhere every number must be
within a relative 1e-4 of the stored one and everything else equal (two CPUs seen so far
differ by at most 6e-6).

    python scripts/seeded_runs.py --write      # after a change that is meant to change results
    python scripts/seeded_runs.py              # compare with the stored figures (exit 1 if they differ)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
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
_TIMING = {"wall_seconds", "loop_seconds", "loop_cpu_seconds", "loop_started_at", "pid", "launcher_pid", "pids", "address", "seconds"}


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
    from dfedrw.peer.config.scenario import load_scenario

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


def numerics() -> dict:
    """This machine's floating-point kernels as a seeded run meets them: a digest of float32
    products, reductions, activations and a float64 product on fixed inputs, with torch's
    version and the CPU capability it dispatches to (for the reader; the digest decides)."""
    import torch
    import torch.nn.functional as F

    def grid(rows: int, cols: int, step: int, modulus: int) -> torch.Tensor:
        # Inputs from exact integer arithmetic: the same on every machine.
        return (torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols) * step % modulus / modulus - 0.5).float()

    x, w, b = grid(96, 784, 13, 97), grid(10, 784, 7, 89), grid(1, 10, 3, 11)[0]
    labels = torch.arange(96) % 10
    logits = F.linear(x, w, b)
    outputs = [
        logits, F.log_softmax(logits, dim=1), F.cross_entropy(logits, labels), x.sum(dim=1), x.exp().sum(),
        torch.tanh(x[:8]), x.double() @ w.double().T, (x * x).sum(dim=1).sqrt(),
    ]
    digest = hashlib.sha256()
    for value in outputs:
        digest.update(value.detach().contiguous().numpy().tobytes())
    return {"digest": digest.hexdigest()[:16], "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


REL_TOL = 1e-4  # between machines whose kernels differ
ABS_TOL = 2e-6  # weights and scores are written with 6 decimals


def differences(now, stored, exact: bool, path: str = "") -> list[str]:
    """Where ``now`` differs from ``stored``: everything to the last bit when ``exact``, else
    numbers within ``REL_TOL`` (or ``ABS_TOL``) and everything else (keys, lengths, ids,
    counts, strings) equal."""
    if isinstance(stored, dict) and isinstance(now, dict):
        if set(now) != set(stored):
            return [f"{path or '/'}: keys {sorted(set(now) ^ set(stored))} on one side only"]
        return [d for k in sorted(stored) for d in differences(now[k], stored[k], exact, f"{path}/{k}")]
    if isinstance(stored, list) and isinstance(now, list):
        if len(now) != len(stored):
            return [f"{path}: {len(now)} entries, stored {len(stored)}"]
        return [d for i, (a, b) in enumerate(zip(now, stored)) for d in differences(a, b, exact, f"{path}/{i}")]
    loose = not exact and isinstance(now, float) and isinstance(stored, float)
    same = math.isclose(now, stored, rel_tol=REL_TOL, abs_tol=ABS_TOL) if loose else now == stored
    return [] if same else [f"{path}: {now!r}, stored {stored!r}"]


def check(stored: dict) -> tuple[dict, bool, dict[str, list[str]]]:
    """Run every scenario and compare with ``stored`` (the file's contents): this machine's
    :func:`numerics`, whether the comparison was to the last bit (its kernels are the stored
    ones), and each scenario's differences."""
    here = numerics()
    exact = here["digest"] == stored["numerics"]["digest"]
    return here, exact, {name: differences(figures(name), stored["runs"][name], exact) for name in SCENARIOS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="store the figures of this code instead of comparing")
    args = parser.parse_args(argv)
    if args.write:
        stored = {"numerics": numerics(), "runs": {name: figures(name) for name in SCENARIOS}}
        STORED.write_text(json.dumps(stored, sort_keys=True, separators=(",", ":")) + "\n")
        print(f"wrote {STORED}")
        return 0
    stored = json.loads(STORED.read_text())
    here, exact, found = check(stored)
    print(
        "to the last bit (this machine's kernels are the stored ones)" if exact
        else f"within {REL_TOL:g} (kernels differ: here {here}, stored {stored['numerics']})"
    )
    for name, diffs in found.items():
        agree = "identical" if exact else f"within {REL_TOL:g}"
        print(f"{name}: " + (agree if not diffs else f"{len(diffs)} differ, first {diffs[0]}"))
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    sys.path[:0] = [str(REPO.parent)]
    sys.exit(main())
