"""How steadily each honest client leaves out each Byzantine neighbour, round after round: what
reputation kept over rounds could add to a rule that decides each round alone.

For every run folder given (a run's ``summary.json`` and its round records ``peers/K.jsonl``,
as ``dfedrw run`` or ``dfedrw sweep`` leave them), every honest client and every Byzantine
neighbour it heard: the share of the rounds in which that neighbour's model was a candidate, and
it attacked (its own round record's attack note), that the client gave it weight 0. A pair
left out in nearly every such round gains nothing from memory; one left out in nearly none
gives memory nothing to build on (the client never saw it as bad); only the pairs in between
are where a rule that remembers who it left out could do better. The figures are the count of
pairs in each band (under 10 %, 10 to 90 %, 90 % and over), over all the runs given, and each
run's pairs.

    python bench/left_out.py sweeps/study_neighbourhood_time/runs/*_dirichlet-0-1_twins_*
    python bench/left_out.py RUN... --json bench/results/left_out_twins_dirichlet.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

BANDS = ("under 10 %", "10 to 90 %", "90 % and over")


def attacked(record: Mapping) -> bool:
    """Whether a Byzantine client's round record says it attacked that round (outside its
    window, or in an off round, its note is ``{"attacking": false}``)."""
    return bool(record.get("attack", {}).get("attacking", True))


def left_out_shares(honest: Mapping[int, Sequence[Mapping]], byzantine: Mapping[int, Sequence[Mapping]]) -> dict[tuple[int, int], tuple[int, int]]:
    """(client, attacker) -> (rounds it was left out, rounds it was a candidate), over the
    rounds the attacker attacked; ``honest`` and ``byzantine``: each client's round records."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for k, records in honest.items():
        for b, own in byzantine.items():
            attacking = {r["round"] for r in own if attacked(r)}
            rounds = [r for r in records if r["round"] in attacking and str(b) in r.get("weights", {})]
            if rounds:
                out[(k, b)] = (sum(1 for r in rounds if r["weights"][str(b)] == 0.0), len(rounds))
    return out


def band(left: int, candidate: int) -> str:
    share = left / candidate
    return BANDS[0] if share < 0.1 else BANDS[2] if share >= 0.9 else BANDS[1]


def read_run(folder: Path) -> tuple[dict[int, list[dict]], dict[int, list[dict]], float]:
    """The honest and the Byzantine clients' round records of run ``folder``, and its honest
    mean global accuracy."""
    summary = json.loads((folder / "summary.json").read_text())
    records: dict[str, dict[int, list[dict]]] = {"honest": {}, "byzantine": {}}
    for k, peer in summary["peers"].items():
        lines = (folder / "peers" / f"{k}.jsonl").read_text().splitlines()
        records[peer["role"]][int(k)] = [json.loads(line) for line in lines if line.strip()]
    return records["honest"], records["byzantine"], summary["honest_mean_global_accuracy"]


def tally(folders: Iterable[Path]) -> dict:
    runs, bands = {}, dict.fromkeys(BANDS, 0)
    for folder in folders:
        honest, byzantine, accuracy = read_run(folder)
        pairs = left_out_shares(honest, byzantine)
        for left, candidate in pairs.values():
            bands[band(left, candidate)] += 1
        runs[folder.name] = {
            "honest_mean_global_accuracy": accuracy,
            "pairs": [{"client": k, "attacker": b, "left_out": left, "rounds": n} for (k, b), (left, n) in sorted(pairs.items())],
        }
    return {"bands": bands, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (each with summary.json and peers/)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.runs if not (f / "summary.json").is_file()]
    if missing:
        parser.error(f"not a finished run folder (no summary.json): {', '.join(missing)}")
    figures = tally(args.runs)
    for name, run in figures["runs"].items():
        shares = "  ".join(f"{p['client']}<-{p['attacker']}: {p['left_out']}/{p['rounds']}" for p in run["pairs"])
        print(f"{name} ({run['honest_mean_global_accuracy']:.2f} %)\n  {shares}")
    total = sum(figures["bands"].values())
    print(f"{total} (client, attacker) pairs over {len(figures['runs'])} runs, by the share of its attacking rounds left out:")
    for name, count in figures["bands"].items():
        print(f"  {name:<14} {count:4d}  ({100 * count / max(total, 1):.1f} %)")
    if args.json:
        args.json.write_text(json.dumps({"runs_given": [f.name for f in args.runs]} | figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
