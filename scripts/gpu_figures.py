"""The client-process figures of scripts/gpu_check.sh, and its report.

    python scripts/gpu_figures.py clients --device cuda --out DIR --json F           # 12 client processes, dfedrw run
    python scripts/gpu_figures.py clients --torchrun 4 --transport torch --out DIR --json F
    python scripts/gpu_figures.py report --work WORK --cpu bench/results/gpu_check_cpu.json --out OUT

``clients`` runs bench/scenarios/gpu_clients.toml as client processes (``dfedrw run``, gRPC with
mutual TLS, ``engine.device`` as given), or with ``--torchrun N`` bench/scenarios/gpu_torchrun.toml
under ``torchrun --standalone --nproc-per-node N`` (a rank takes the GPU when it sees one;
``--transport``: grpc or torch). While it runs it reads, twice a second, what each process holds
on the GPU according to ``nvidia-smi`` (its CUDA context included; where the driver does not say,
nothing). It writes the run's figures as JSON: seconds, the honest mean accuracy, each client's
device, the GPU memory its process held (``torch.cuda.max_memory_allocated`` and
``max_memory_reserved`` from its final record, the most ``nvidia-smi`` saw), the transport's
backend and why.

``report`` gathers the figures JSON files of a gpu_check.sh work folder (bench/cnn_round.py's,
bench/engines.py's, ``clients``') into ``OUT/figures.json`` and a Markdown page of tables,
``OUT/figures.md``, each figure beside the CPU's from ``--cpu`` (the same commands run on a
CPU, committed in bench/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CLIENTS = REPO / "bench" / "scenarios" / "gpu_clients.toml"
TORCHRUN = REPO / "bench" / "scenarios" / "gpu_torchrun.toml"


def log(message: str) -> None:
    print(f"[gpu_figures] {message}", file=sys.stderr, flush=True)


class GpuSampler:
    """The most GPU memory (MiB) ``nvidia-smi`` reports for each process, read every
    ``interval`` seconds on a thread until :meth:`stop`."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.most: dict[int, float] = {}
        self.total_most = 0.0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.available = shutil.which("nvidia-smi") is not None

    def __enter__(self) -> "GpuSampler":
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _query(self, what: str) -> list[list[str]]:
        out = subprocess.run(
            ["nvidia-smi", f"--query-{what}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for pid, used in self._query("compute-apps=pid,used_memory"):
                    if used.replace(".", "", 1).isdigit():
                        self.most[int(pid)] = max(self.most.get(int(pid), 0.0), float(used))
                used = [float(row[0]) for row in self._query("gpu=memory.used") if row and row[0].replace(".", "", 1).isdigit()]
                if used:
                    self.total_most = max(self.total_most, used[0])
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                self.error = f"{type(exc).__name__}: {exc}"
            self._stop.wait(self.interval)


def clients(args: argparse.Namespace) -> int:
    out = Path(args.out)
    scenario = TORCHRUN if args.torchrun else CLIENTS
    overrides = [*(["--set", f"engine.device={args.device}"] if not args.torchrun else []), *(x for s in args.set for x in ("--set", s))]
    if args.torchrun:
        overrides += ["--set", f"network.transport={args.transport}"]
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.torchrun),
            "-m", "dfedrw.launch.torchrun", "--scenario", str(scenario), "--out", str(out), *overrides,
        ]
    else:
        cmd = [sys.executable, "-m", "dfedrw.experiments.cli", "run", str(scenario), "--out", str(out), *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a torchrun rank takes a GPU whenever it sees one
    log(" ".join(cmd))
    start = time.monotonic()
    with GpuSampler() as sampler:
        # Its own process group: on a timeout the launcher and every client it started go.
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, start_new_session=True)
        try:
            code: int | str = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            code = f"timed out after {args.timeout:g} s"
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=wait)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
    seconds = time.monotonic() - start
    figures: dict[str, Any] = {
        "what": f"torchrun, {args.torchrun} ranks, {args.transport}" if args.torchrun else "dfedrw run, client processes",
        "command": " ".join(cmd), "device": args.device, "exit_code": code, "seconds": round(seconds, 2),
    }
    summary_file = out / "summary.json"
    if summary_file.exists():
        summary = json.loads(summary_file.read_text())
        figures.update(
            clients=len(summary["peers"]), rounds=summary.get("rounds"), honest_mean_accuracy=summary.get("honest_mean_accuracy"),
            honest_mean_global_accuracy=summary.get("honest_mean_global_accuracy"), failed_peers=summary.get("failed_peers"),
            tls=summary.get("tls"), transport=summary.get("transport"), wall_seconds=summary.get("wall_seconds"),
        )
    per_client = []
    for path in sorted((out / "peers").glob("*.json"), key=lambda p: int(p.stem)) if (out / "peers").exists() else []:
        final = json.loads(path.read_text())
        keys = ("id", "role", "pid", "device", "loop_seconds", "accuracy", "cuda_max_allocated_mib", "cuda_max_reserved_mib", "transport_backend", "transport_backend_note")
        row = {key: final.get(key) for key in keys if key in final}
        if final.get("pid") in sampler.most:
            row["nvidia_smi_most_mib"] = sampler.most[final["pid"]]
        per_client.append(row)
    figures["clients_final"] = per_client
    figures["nvidia_smi"] = {
        "available": sampler.available, "processes_seen": len(sampler.most), "gpu_memory_used_most_mib": sampler.total_most or None,
        "error": sampler.error,
    }
    honest = [c for c in per_client if c.get("role") == "honest"]
    for key in ("cuda_max_allocated_mib", "cuda_max_reserved_mib", "nvidia_smi_most_mib"):
        values = [c[key] for c in per_client if c.get(key) is not None]
        if values:
            figures[f"{key}_per_client_max"] = max(values)
            figures[f"{key}_per_client_mean"] = round(sum(values) / len(values), 1)
    backends = sorted({c["transport_backend"] for c in per_client if c.get("transport_backend")})
    notes = sorted({c["transport_backend_note"] for c in per_client if c.get("transport_backend_note")})
    if backends:
        figures["transport_backend"] = backends
    if notes:
        figures["transport_backend_note"] = notes
    figures["honest_devices"] = sorted({str(c.get("device")) for c in honest})
    Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    log(f"{figures['what']}: exit {code}, {seconds:.1f} s, honest mean accuracy {figures.get('honest_mean_accuracy')}")
    return code if isinstance(code, int) else 124


# -- the report ---------------------------------------------------------------------------------
def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return f"{value:{spec}}"
    return str(value)


def cnn_rows(figures: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    if not figures:
        return {}
    # "batched engine (auto: vmap)" and "(auto: loop)" are one row: the engine's pick.
    return {(row["what"].split(":")[0] + ")" if ":" in row["what"] else row["what"]): row for row in figures["rows"]}


def cnn_table(name: str, gpu: dict[str, Any] | None, cpu: dict[str, Any] | None, here: str = "GPU") -> list[str]:
    lines = [f"### {name}", ""]
    if gpu is None and cpu is None:
        return lines + ["(not run)", ""]
    for label, figs in ((here, gpu), ("CPU", cpu)):
        if figs:
            lines.append(f"- {label}: {figs.get('machine', {}).get('where', '?')}, torch {figs.get('machine', {}).get('torch', '?')}; "
                         f"the float32 product at {figs['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s")
    lines += ["", f"| | {here} s / round | {here} MiB | CPU s / round | {here} / CPU | layout ({here}) |", "|---|---:|---:|---:|---:|---|"]
    rows_gpu, rows_cpu = cnn_rows(gpu), cnn_rows(cpu)
    for what in dict.fromkeys([*rows_gpu, *rows_cpu]):
        g, c = rows_gpu.get(what, {}), rows_cpu.get(what, {})
        ratio = g["per_round"] / c["per_round"] if g.get("per_round") and c.get("per_round") else None
        layout = g.get("layout", "")
        if g.get("layout_choice"):
            layout += f" ({g['layout_choice']}" + (f": {g['layout_seconds']}" if g.get("layout_seconds") else "") + ")"
        lines.append(f"| {what} | {_fmt(g.get('per_round'))} | {_fmt(g.get('cuda_max_allocated_mib'), '.0f')} | {_fmt(c.get('per_round'))} | "
                     f"{_fmt(ratio, '.3f')} | {layout} |")
    return lines + [""]


def scale_table(name: str, gpu: dict[str, Any] | None, cpu: dict[str, Any] | None, here: str = "GPU") -> list[str]:
    lines = [f"### {name}", ""]
    if gpu is None and cpu is None:
        return lines + ["(not run)", ""]
    lines += [f"| clients | rounds ({here}) | {here} median s / round | {here} s / round | {here} MiB | rounds (CPU) | CPU median s / round | "
              f"CPU s / round | CPU peak RSS MiB | layout ({here}) |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    by_gpu = {r["clients"]: r for r in (gpu or {}).get("scale", [])}
    by_cpu = {r["clients"]: r for r in (cpu or {}).get("scale", [])}
    for n in sorted({*by_gpu, *by_cpu}):
        g, c = by_gpu.get(n, {}), by_cpu.get(n, {})
        status = "" if g.get("ok", True) else f" ({here} failed: {g.get('error')})"
        if not g.get("ok", True) and g.get("rounds_done") is not None:
            g = {**g, "rounds": f"{g['rounds_done']} of {g.get('rounds')}"}
        lines.append(
            f"| {n} | {_fmt(g.get('rounds'), 'd')} | {_fmt(g.get('median_round_seconds'), '.4f')} | {_fmt(g.get('seconds_per_round'), '.4f')} | "
            f"{_fmt(g.get('cuda_max_allocated_mib') or g.get('peak_rss_mib'), '.0f')} | {_fmt(c.get('rounds'), 'd')} | {_fmt(c.get('median_round_seconds'), '.4f')} | "
            f"{_fmt(c.get('seconds_per_round'), '.4f')} | {_fmt(c.get('peak_rss_mib'), '.0f')} | {g.get('layout', '')}{status} |"
        )
    return lines + [""]


def clients_table(names: list[str], gpu: dict[str, Any], cpu: dict[str, Any]) -> list[str]:
    lines = ["| run | device | s | honest mean accuracy % | CPU's | per client: allocated MiB (max) | reserved MiB (max) | nvidia-smi MiB (max) | backend |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for name in names:
        g, c = gpu.get(name) or {}, cpu.get(name) or {}
        if not g and not c:
            continue
        backend = ", ".join(g.get("transport_backend", [])) + (f" ({'; '.join(g['transport_backend_note'])})" if g.get("transport_backend_note") else "")
        lines.append(
            f"| {g.get('what', c.get('what', name))} | {', '.join(g.get('honest_devices', [])) or '-'} | {_fmt(g.get('seconds'), '.1f')} | "
            f"{_fmt(g.get('honest_mean_accuracy'), '.2f')} | {_fmt(c.get('honest_mean_accuracy'), '.2f')} | "
            f"{_fmt(g.get('cuda_max_allocated_mib_per_client_max'), '.0f')} | {_fmt(g.get('cuda_max_reserved_mib_per_client_max'), '.0f')} | "
            f"{_fmt(g.get('nvidia_smi_most_mib_per_client_max'), '.0f')} | {backend or '-'} |"
        )
    return lines + [""]


def report(args: argparse.Namespace) -> int:
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = {path.stem: _load(path) for path in sorted((work / "fig").glob("*.json"))}
    cpu = (_load(Path(args.cpu)) or {}).get("figures", {}) if args.cpu else {}
    steps = _load(work / "steps.json") or []
    env = _load(work / "env.json") or {}
    (out / "figures.json").write_text(json.dumps({"env": env, "steps": steps, "figures": gpu, "cpu_figures_from": args.cpu}, indent=1) + "\n")
    lines = ["# scripts/gpu_check.sh: figures", ""]
    lines += [f"- {key}: {value}" for key, value in env.items() if not isinstance(value, (dict, list))]
    lines += ["", "| step | status | seconds |", "|---|---|---:|"]
    lines += [f"| {s['name']} | {s['status']} | {s['seconds']} |" for s in steps]
    # This run's columns: "GPU" on one, "here" on a CPU (a dry run, or the CPU's own figures).
    here = "GPU" if env.get("device", "cuda").startswith("cuda") else "here"
    lines += ["", f"MiB: on a GPU the most the process's tensors held there (torch.cuda.max_memory_allocated); on a CPU the peak resident memory, where known.", ""]
    lines += ["## The CNN round (bench/cnn_round.py)", ""]
    lines += cnn_table("LeNet-5", gpu.get("cnn_lenet5"), cpu.get("cnn_lenet5"), here)
    lines += cnn_table("ResNet-20", gpu.get("cnn_resnet20"), cpu.get("cnn_resnet20"), here)
    lines += ["## Scale (bench/engines.py --scale)", ""]
    lines += scale_table("Softmax regression", _merge_scale(gpu, "scale_softmax"), _merge_scale(cpu, "scale_softmax"), here)
    lines += scale_table("LeNet-5", _merge_scale(gpu, "scale_lenet5"), _merge_scale(cpu, "scale_lenet5"), here)
    lines += ["## Client processes on one GPU (scripts/gpu_figures.py clients)", ""]
    lines += clients_table(["clients_12", "torchrun_grpc", "torchrun_torch"], gpu, cpu)
    (out / "figures.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _merge_scale(figures: dict[str, Any], prefix: str) -> dict[str, Any] | None:
    """The scale points of every file named ``prefix*`` (one per client count, say)."""
    parts = [f for name, f in sorted(figures.items()) if name.startswith(prefix) and f]
    return {"scale": [row for f in parts for row in f.get("scale", [])]} if parts else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("clients", help="run the client-process scenario and write its figures")
    c.add_argument("--device", default="cuda", help="engine.device of dfedrw run's clients (torchrun: cpu hides the GPUs)")
    c.add_argument("--torchrun", type=int, default=0, metavar="N", help="run the torchrun scenario with N ranks instead")
    c.add_argument("--transport", default="grpc", choices=["grpc", "torch"], help="the torchrun scenario's transport")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a scenario override")
    c.add_argument("--out", required=True, help="the run's results folder")
    c.add_argument("--json", required=True, help="the figures file to write")
    c.add_argument("--timeout", type=float, default=600.0)
    r = sub.add_parser("report", help="gather a work folder's figures into figures.json and figures.md")
    r.add_argument("--work", required=True)
    r.add_argument("--cpu", default=None, help="the CPU's figures (bench/results/gpu_check_cpu.json)")
    r.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    return clients(args) if args.command == "clients" else report(args)


if __name__ == "__main__":
    sys.exit(main())
