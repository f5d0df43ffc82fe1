"""Round-loop time of the batched engine against the clients engines, and the batched engine's scale sweep.

One scenario runs in the batched engine (every honest client's model a row of one tensor) and
in the threads engine (``engine.name=clients``, ``network.transport=inproc``), optionally also
as gRPC client processes, in one invocation, and their ratios are printed; ``--scale`` runs the
batched engine alone at growing client counts (seconds per round and peak memory).

    python bench/engines.py                              # both built-in comparisons (--case all)
    python bench/engines.py --case dfedavg               # Fashion-MNIST IID, 10 honest, DFedAvg, 3000 rounds
    python bench/engines.py --case reweighting           # Fashion-MNIST IID, 10 honest + 2 Byzantine (Gaussian),
                                                         # DFedReweighting loss / loss_clip_mean, 600 rounds
    python bench/engines.py --case reweighting --rounds 60 --grpc --set eval.every=20
    python bench/engines.py --scale                      # batched only: 100 and 1000 clients on a ring,
                                                         # digits, DFedReweighting loss-clip, 100 rounds
    python bench/engines.py --scale --clients 100,1000,4096 --scale-data fashion-mnist --device cuda --json scale.json
    python bench/engines.py --scale --clients 1000,10000 --scale-degree 10 --rounds 20 --set train.model=lenet5 \
        --scale-data fashion-mnist --set data.dir=DIR --device cuda      # a sparse random graph, about 10 neighbours each

What it measures. Comparison (``--case``): for each engine the round loop (the slowest honest
client's ``loop_seconds``, from its final record: process start, imports and data loading left
out; the batched engine reports one figure for all clients), the run's wall time, the CPU time
of the round loops and the honest mean accuracy, then the ratios threads/batched (and
grpc/batched). The engines run the same experiment (same partition, graph, initial models,
minibatch order, attack noise), so the accuracies agree up to float rounding (see
tests/integration/test_engine_parity.py). Scale sweep (``--scale``): each client count runs in a
fresh subprocess of this script (hidden ``--one`` mode), so points share no memory; it reports
seconds per round (round loop / rounds), the process's peak resident memory
(``getrusage(RUSAGE_SELF).ru_maxrss``, which includes torch and the data set) and, with
``--device cuda``, ``torch.cuda.max_memory_allocated()``. A point that fails (out of memory, a
scenario error such as more clients than ``MAX_CLIENTS`` or too few samples per client, or
``--point-timeout``) is reported with the last line of its reason and the sweep goes on (exit
status 0; a failed comparison run makes it 1).

Runs happen back to back in one invocation, so on a shared or busy machine the ratios are
the figures to quote, not the absolute times. The batched engine computes with
``engine.threads`` torch intra-op threads (``--torch-threads``, default 1, the engine's default)
while every clients-engine client runs on one thread; on a machine whose cores are busy with
other work, more intra-op threads wait on each other and the batched engine slows down badly.
Each run writes to a fresh temporary folder that is removed afterwards unless ``--keep DIR`` is
given. ``--set key=value`` applies to every run of the invocation (comparisons and sweep
points). Progress goes to stderr, the results table to stdout; ``--json FILE`` writes every
figure to a file as well.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

# The paper's IID setting on Fashion-MNIST, on the default graph (Erdos-Renyi, rho 0.7).
COMMON = ["data.name=fashion-mnist", "data.partition=iid", "seed=43", "topology.kind=erdos_renyi", "topology.rho=0.7"]
CASES: dict[str, list[str]] = {
    "dfedavg": [*COMMON, "topology.honest=10", "topology.byzantine=0", "attack.name=none", "aggregation.rule=dfedavg", "rounds=3000"],
    "reweighting": [
        *COMMON, "topology.honest=10", "topology.byzantine=2", "attack.name=gaussian",
        "aggregation.rule=dfedreweighting", "aggregation.tpm=loss", "aggregation.crs=loss_clip_mean", "rounds=600",
    ],
}
# The engines as overrides, applied last so that they win over --set.
ENGINES: dict[str, list[str]] = {
    "batched": ["engine.name=batched"],
    "threads": ["engine.name=clients", "network.transport=inproc"],
    "grpc": ["engine.name=clients", "network.transport=grpc"],
}
# The sweep: a sparse graph (a ring: two neighbours each, whatever the count), honest clients
# only, DFedReweighting with the loss TPM and the loss-clip CRS.
SCALE = [
    "data.partition=iid", "seed=43", "topology.kind=ring", "topology.byzantine=0", "attack.name=none",
    "aggregation.rule=dfedreweighting", "aggregation.tpm=loss", "aggregation.crs=loss_clip_mean",
]
SCALE_ROUNDS = 100
# Each round's end (monotonic seconds) as a point's batched run finishes it, in its results folder.
ROUND_ENDS = "round_ends.txt"


def log(message: str) -> None:
    print(f"[engines] {message}", file=sys.stderr, flush=True)


def last_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def loop_figures(out: Path, summary: dict[str, Any]) -> tuple[float, float]:
    """(slowest honest client's round-loop wall seconds, CPU seconds of all round loops) from the
    clients' final records. A final record holds its whole process's CPU time, so clients that
    share a process (threads, batched) count once: the largest per process, summed over processes."""
    wall: list[float] = []
    per_process: dict[Any, float] = {}
    for k, peer in summary["peers"].items():
        path = out / "peers" / f"{k}.json"
        if not path.exists():
            continue
        record = json.loads(path.read_text())
        if peer.get("role") == "honest":
            wall.append(float(record.get("loop_seconds", 0.0)))
        pid = peer.get("pid") or record.get("pid")
        per_process[pid] = max(per_process.get(pid, 0.0), float(record.get("loop_cpu_seconds", 0.0)))
    return max(wall, default=float("nan")), sum(per_process.values())


class RunDir:
    """A fresh folder for one run: under ``--keep DIR`` (kept), else a temporary one (removed)."""

    def __init__(self, keep: Path | None, name: str) -> None:
        self.keep = keep
        if keep is not None:
            self.root = keep
            self.path = keep / name
            if self.path.exists():
                raise SystemExit(f"--keep: {self.path} exists already; choose an empty folder")
            keep.mkdir(parents=True, exist_ok=True)
        else:
            self.root = Path(tempfile.mkdtemp(prefix=f"dfedrw-engines-{name}-"))
            self.path = self.root / "run"

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        if self.keep is None:
            shutil.rmtree(self.root, ignore_errors=True)


# -- the comparison ----------------------------------------------------------------------------
def run_engine(case: str, engine: str, overrides: list[str], keep: Path | None, threads: int) -> dict[str, Any]:
    """One scenario in one engine, in this process; a failure is a row with its reason.
    ``threads``: torch's intra-op threads for the run. It is set before every run because a
    clients-engine client sets ``torch.set_num_threads(1)`` for its whole process (so a later
    batched run in this process would otherwise run on one thread)."""
    import torch
    from rich.console import Console

    from dfedrw.launch.runner import run_scenario
    from dfedrw.peer.config.scenario import ScenarioError, load_scenario

    row: dict[str, Any] = {"case": case, "engine": engine, "overrides": overrides, "ok": False}
    # The clients engines' clients run on one thread each, whatever is set here.
    row["torch_threads"] = threads if engine == "batched" else "1/client"
    torch.set_num_threads(threads)
    try:
        scenario = load_scenario(None, overrides)
        row["rounds"] = scenario.rounds
        with RunDir(keep, f"{case}-{engine}") as path:
            log(f"{case}: {engine} engine, {scenario.rounds} rounds, results in {path}")
            out, summary = run_scenario(scenario, path, console=Console(stderr=True))
            loop, loop_cpu = loop_figures(out, summary)
            row.update(
                ok=not summary.get("failed_peers"),
                loop_seconds=loop,
                loop_cpu_seconds=loop_cpu,
                wall_seconds=summary["wall_seconds"],
                honest_mean_accuracy=summary["honest_mean_accuracy"],
                failed_peers=summary.get("failed_peers", []),
                out=str(out) if keep else None,
            )
            if summary.get("failed_peers"):
                row["error"] = f"clients failed: {summary['failed_peers']}"
    except Exception as exc:  # noqa: BLE001 - a benchmark reports a failed run and goes on
        if not isinstance(exc, ScenarioError):  # that one's message says it all
            traceback.print_exc(file=sys.stderr)
        row["error"] = last_line(f"{type(exc).__name__}: {exc}")
    if row["ok"]:
        log(f"{case}: {engine}: round loop {row['loop_seconds']:.1f} s, wall {row['wall_seconds']:.1f} s, "
            f"honest acc {row['honest_mean_accuracy']:.2f}%")
    else:
        log(f"{case}: {engine}: FAILED: {row.get('error')}")
    return row


def compare(args: argparse.Namespace, cases: list[str]) -> list[dict[str, Any]]:
    engines = ["batched", "threads", *(["grpc"] if args.grpc else [])]
    rows = []
    for case in cases:
        base = [*CASES[case], *([f"rounds={args.rounds}"] if args.rounds else []), *args.set]
        device = [f"engine.device={args.device}", f"engine.threads={args.torch_threads}"]
        for engine in engines:
            overrides = [*base, *ENGINES[engine], *(device if engine == "batched" else [])]
            rows.append(run_engine(case, engine, overrides, args.keep, args.torch_threads))
    # Ratios against the batched run of the same case.
    for row in rows:
        ref = next((r for r in rows if r["case"] == row["case"] and r["engine"] == "batched"), None)
        if row["ok"] and ref and ref["ok"]:
            row["loop_ratio"] = row["loop_seconds"] / ref["loop_seconds"] if ref["loop_seconds"] else float("nan")
            row["wall_ratio"] = row["wall_seconds"] / ref["wall_seconds"] if ref["wall_seconds"] else float("nan")
            row["cpu_ratio"] = row["loop_cpu_seconds"] / ref["loop_cpu_seconds"] if ref["loop_cpu_seconds"] else float("nan")
            accs = (row["honest_mean_accuracy"], ref["honest_mean_accuracy"])
            row["accuracy_difference"] = accs[0] - accs[1] if None not in accs else None
    return rows


# -- the scale sweep ---------------------------------------------------------------------------
def one_point(spec: dict[str, Any]) -> int:
    """Hidden ``--one`` mode: run one batched scenario in this (fresh) process and print its
    figures as one JSON line on stdout."""
    result: dict[str, Any] = {"ok": False}
    try:
        import torch
        from rich.console import Console

        from dfedrw.peer.config.scenario import load_scenario

        if spec.get("torch_threads"):
            torch.set_num_threads(spec["torch_threads"])
        result["rss_after_imports_mib"] = peak_rss_mib()
        scenario = load_scenario(None, spec["overrides"])
        cuda = scenario.engine.device.startswith("cuda")
        if cuda and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        if scenario.engine.name == "batched" and not scenario.network.asynchronous:
            out, summary, rounds = batched_rounds(scenario, Path(spec["out"]))
            result.update(rounds)
        else:
            from dfedrw.launch.runner import run_scenario  # the clients engines need the network libraries

            out, summary = run_scenario(scenario, Path(spec["out"]), console=Console(stderr=True))
        loop, loop_cpu = loop_figures(out, summary)
        result.update(
            ok=not summary.get("failed_peers"),
            clients=scenario.topology.num_clients,
            rounds=scenario.rounds,
            loop_seconds=loop,
            loop_cpu_seconds=loop_cpu,
            seconds_per_round=loop / scenario.rounds,
            wall_seconds=summary["wall_seconds"],
            honest_mean_accuracy=summary["honest_mean_accuracy"],
            peak_rss_mib=peak_rss_mib(),
            cuda_max_allocated_mib=torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
            torch_threads=torch.get_num_threads(),
            **{key: summary[key] for key in ("layout", "layout_choice", "layout_seconds") if key in summary},
        )
        if summary.get("failed_peers"):
            result["error"] = f"clients failed: {summary['failed_peers']}"
    except BaseException as exc:  # noqa: BLE001 - MemoryError and KeyboardInterrupt too: say why
        if type(exc).__name__ != "ScenarioError":  # that one's message says it all
            traceback.print_exc(file=sys.stderr)
        result["error"] = last_line(f"{type(exc).__name__}: {exc}")
        result["peak_rss_mib"] = peak_rss_mib()
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


def batched_rounds(scenario, out: Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """A batched run as ``dfedrw run`` makes it, timing each round (from the end of the one
    before; the first from the start of the loop): the results folder, the summary, and
    ``round_seconds`` with ``median_round_seconds``, the median of the rounds without an
    evaluation (what a round costs, the test set left out)."""
    from dfedrw.engines.together import run_together
    from dfedrw.engines.run import BatchedRun
    from dfedrw.launch.preflight import preflight
    from dfedrw.peer.round.records import evaluation_due

    preflight(scenario)
    run = BatchedRun(scenario, out)
    ends: list[float] = []
    out.mkdir(parents=True, exist_ok=True)
    progress = (out / ROUND_ENDS).open("a")  # for the sweep to read if this point is stopped

    def on_round(r: int) -> None:
        ends.append(time.monotonic())
        progress.write(f"{r} {ends[-1]!r}\n")
        progress.flush()
        if (r + 1) % max(1, scenario.rounds // 10) == 0:
            log(f"round {r + 1}/{scenario.rounds}")

    summary = run_together([run], on_round)[0]
    progress.close()
    loop = json.loads((out / "peers" / f"{run.honest[0]}.json").read_text())["loop_seconds"]
    # The loop's start is not reported to the callback: the first round is what the loop took
    # beyond the others.
    steps = [b - a for a, b in zip(ends, ends[1:])]
    seconds = [max(0.0, loop - sum(steps)), *steps] if ends else []
    plain = sorted(t for r, t in enumerate(seconds) if not evaluation_due(r, scenario.rounds, scenario.eval.every))
    median = plain[len(plain) // 2] if plain else None
    return out, summary, {"round_seconds": [round(t, 4) for t in seconds], "median_round_seconds": median}


def partial_rounds(path: Path) -> dict[str, Any]:
    """What a stopped point had done: the rounds it finished and the median of their seconds
    (each from the end of the one before: the first round is not among them)."""
    try:
        ends = [float(line.split()[1]) for line in (path / ROUND_ENDS).read_text().splitlines() if line.strip()]
    except (OSError, ValueError, IndexError):
        return {}
    steps = sorted(b - a for a, b in zip(ends, ends[1:]))
    return {"rounds_done": len(ends), "median_round_seconds": steps[len(steps) // 2] if steps else None}


def run_point(clients: int, rounds: int, overrides: list[str], timeout: float, keep: Path | None, threads: int) -> dict[str, Any]:
    """One sweep point in a fresh subprocess; its stderr passes through (the last lines are kept
    for the reason of a failure the child could not report itself, e.g. a kill)."""
    row: dict[str, Any] = {"clients": clients, "rounds": rounds, "overrides": overrides, "ok": False}
    with RunDir(keep, f"scale-{clients}") as path:
        spec = json.dumps({"overrides": overrides, "out": str(path), "torch_threads": threads})
        log(f"scale: {clients} clients in a fresh process, results in {path}")
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--one", spec], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        tail: collections.deque[str] = collections.deque(maxlen=20)

        def forward() -> None:
            assert proc.stderr is not None
            for raw in iter(proc.stderr.readline, b""):
                line = raw.decode(errors="replace")
                tail.append(line)
                sys.stderr.write(line)
                sys.stderr.flush()

        chunks: list[bytes] = []

        def collect() -> None:
            assert proc.stdout is not None
            chunks.extend(iter(lambda: proc.stdout.read(65536), b""))

        readers = [threading.Thread(target=forward, daemon=True), threading.Thread(target=collect, daemon=True)]
        for reader in readers:
            reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            proc.wait()
        for reader in readers:
            reader.join(timeout=10)
        stdout = b"".join(chunks).decode(errors="replace")
        row["process_seconds"] = round(time.monotonic() - started, 3)
        result = None
        for line in reversed(stdout.splitlines()):
            try:
                result = json.loads(line)
                break
            except ValueError:
                continue
        if result is not None:
            row.update(result)
        if timed_out:
            row.update(ok=False, error=f"timed out after --point-timeout {timeout:g} s", **partial_rounds(path))
        elif result is None:
            rc = proc.returncode
            if rc is not None and rc < 0:
                name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
                why = f"killed by {name}" + (" (out of memory?)" if -rc == signal.SIGKILL else "")
            else:
                why = f"exited with status {rc}"
            row.update(ok=False, error=last_line("".join(tail)) or why)
            if last_line("".join(tail)):
                row["error"] = f"{why}: {row['error']}"
    if row["ok"]:
        cuda = row.get("cuda_max_allocated_mib")
        log(f"scale: {clients} clients: {row['seconds_per_round']:.4f} s/round, peak RSS {row['peak_rss_mib']:.0f} MiB"
            + (f", CUDA max allocated {cuda:.0f} MiB" if cuda is not None else ""))
    else:
        log(f"scale: {clients} clients: FAILED: {row.get('error')}")
    return row


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    rounds = args.rounds or SCALE_ROUNDS
    for n in args.clients:
        # A sparse random graph of about --scale-degree neighbours each, whatever the count
        # (networkx draws G(10,000, 0.001) in about 3 s), in place of the ring.
        graph = [] if args.scale_degree is None else ["topology.kind=erdos_renyi", f"topology.rho={min(1.0, args.scale_degree / max(1, n - 1))!r}"]
        overrides = [
            *SCALE, *graph, f"data.name={args.scale_data}", f"topology.honest={n}", f"rounds={rounds}",
            *args.set, *ENGINES["batched"], f"engine.device={args.device}", f"engine.threads={args.torch_threads}",
        ]
        rows.append(run_point(n, rounds, overrides, args.point_timeout, args.keep, args.torch_threads))
    return rows


# -- output ------------------------------------------------------------------------------------
def table(header: list[str], rows: list[list[str]], left: tuple[int, ...] = (0,)) -> str:
    """A plain aligned table: numbers right-aligned, the columns in ``left`` left-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def print_comparison(rows: list[dict[str, Any]]) -> None:
    print("Engine comparison (ratios are against the batched run of the same case; the ratios are what to compare):")
    body = []
    for r in rows:
        if r["ok"]:
            body.append([
                r["case"], r["engine"], str(r["torch_threads"]), str(r["rounds"]), fmt(r["loop_seconds"], ".2f"), fmt(r["wall_seconds"], ".2f"),
                fmt(r["loop_cpu_seconds"], ".2f"), fmt(r["honest_mean_accuracy"], ".2f"),
                fmt(r.get("loop_ratio"), ".2f", "x"), fmt(r.get("wall_ratio"), ".2f", "x"), fmt(r.get("cpu_ratio"), ".2f", "x"), "ok",
            ])
        else:
            body.append([r["case"], r["engine"], str(r["torch_threads"]), str(r.get("rounds", "-")), *["-"] * 7,
                         "failed: " + str(r.get("error"))])
    print(table(["case", "engine", "torch threads", "rounds", "round loop s", "wall s", "loop CPU s", "honest acc %",
                 "loop ratio", "wall ratio", "CPU ratio", "status"], body, left=(0, 1, 11)))
    for case in dict.fromkeys(r["case"] for r in rows):
        for r in rows:
            if r["case"] == case and r["engine"] != "batched" and "loop_ratio" in r:
                print(f"{case}: ratio {r['engine']}/batched: round loop {r['loop_ratio']:.2f}x   wall {r['wall_ratio']:.2f}x   "
                      f"round-loop CPU {r['cpu_ratio']:.2f}x   (accuracy difference {fmt(r['accuracy_difference'], '+.2f')} points)")


def print_sweep(rows: list[dict[str, Any]], data: str, device: str, degree: float | None = None) -> None:
    rounds = next((r["rounds"] for r in rows if r.get("rounds")), None)
    graph = "ring" if degree is None else f"Erdos-Renyi of mean degree {degree:g}"
    print(f"Scale sweep: batched engine on {device}, {data}, {graph}, DFedReweighting loss / loss_clip_mean"
          + (f", {rounds} rounds" if rounds else "") + ", one fresh process per point:")
    body = []
    for r in rows:
        if r["ok"]:
            body.append([
                str(r["clients"]), str(r["rounds"]), str(r.get("torch_threads", "-")), fmt(r["seconds_per_round"], ".4f"),
                fmt(r.get("median_round_seconds"), ".4f"), fmt(r["loop_seconds"], ".2f"),
                fmt(r["wall_seconds"], ".2f"), fmt(r["peak_rss_mib"], ".0f"), fmt(r.get("cuda_max_allocated_mib"), ".0f"),
                fmt(r["honest_mean_accuracy"], ".2f"), "ok",
            ])
        else:
            done = f" ({r['rounds_done']} rounds done)" if r.get("rounds_done") is not None else ""
            body.append([str(r["clients"]), str(r.get("rounds", "-")), "-", "-", fmt(r.get("median_round_seconds"), ".4f"), "-", "-",
                         fmt(r.get("peak_rss_mib"), ".0f"), "-", "-", "failed: " + str(r.get("error")) + done])
    print(table(["clients", "rounds", "torch threads", "s/round", "median s/round", "round loop s", "wall s", "peak RSS MiB", "CUDA max MiB",
                 "honest acc %", "status"], body, left=(0, 10)))
    print("(s/round: the round loop over the rounds, evaluations in; median s/round: the median round without an evaluation)")


def machine() -> dict[str, Any]:
    import torch

    return {
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": sys.version.split()[0],
    }


def client_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 100,1000") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected client counts >= 1")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=[*CASES, "all"], default=None,
                        help="built-in comparison to run (default: all, unless --scale is given alone)")
    parser.add_argument("--grpc", action="store_true", help="also run the comparison as gRPC client processes")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every run (default: the case's; 100 for --scale)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra scenario override for every run (repeatable)")
    parser.add_argument("--scale", action="store_true", help="run the batched engine's scale sweep")
    parser.add_argument("--clients", type=client_counts, default=client_counts("100,1000"), help="sweep client counts (default: 100,1000)")
    parser.add_argument("--scale-data", choices=["digits", "fashion-mnist", "mnist"], default="digits", help="the sweep's data set (default: digits)")
    parser.add_argument("--scale-degree", type=float, default=None, metavar="D",
                        help="the sweep's graph: Erdos-Renyi with rho = D / (clients - 1), about D neighbours each (default: a ring)")
    parser.add_argument("--device", default="cpu", help="engine.device of the batched runs: cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--torch-threads", type=int, default=1, metavar="N",
                        help="torch intra-op threads of the batched runs, its engine.threads (default: 1, the engine's default)")
    parser.add_argument("--point-timeout", type=float, default=1800.0, help="seconds a sweep point may take (default: 1800)")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR", help="keep every run's results under DIR (default: temp folders, removed)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write every figure to FILE as JSON too")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.one is not None:
        return one_point(json.loads(args.one))
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.point_timeout <= 0:
        parser.error("--point-timeout must be > 0")
    if args.torch_threads < 1:
        parser.error("--torch-threads must be >= 1")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print(f"--device {args.device}: CUDA is not available on this machine (torch.cuda.is_available() is False)", file=sys.stderr)
            return 2
    cases = [] if args.scale and args.case is None else list(CASES) if args.case in (None, "all") else [args.case]

    info = machine()
    args.torch_threads = args.torch_threads or info["torch_threads"]
    info["batched_torch_threads"] = args.torch_threads
    log(f"machine: {info['cpus']} CPUs, load average {info['load_average']}, torch {info['torch']} "
        f"({info['torch_threads']} threads), CUDA {info['cuda'] or 'none'}")
    results: dict[str, Any] = {"machine": info, "argv": sys.argv[1:], "comparison": [], "scale": []}
    if cases:
        results["comparison"] = compare(args, cases)
    if args.scale:
        results["scale"] = sweep(args)

    print(f"# {info['cpus']} CPUs, load average at start {info['load_average']}, torch {info['torch']} "
          f"(default {info['torch_threads']} intra-op threads), CUDA {info['cuda'] or 'none'}")
    if results["comparison"]:
        print_comparison(results["comparison"])
    if results["scale"]:
        if results["comparison"]:
            print()
        print_sweep(results["scale"], args.scale_data, args.device, args.scale_degree)
    if args.keep:
        print(f"runs kept in {args.keep}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"figures written to {args.json}")
    # A failed comparison run is an error; a failed sweep point is a result (where scaling stops).
    return 1 if any(not r["ok"] for r in results["comparison"]) else 0


if __name__ == "__main__":
    sys.exit(main())
