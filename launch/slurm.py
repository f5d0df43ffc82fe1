"""``dfedrw slurm SCENARIO --out DIR``: one peer network across a Slurm allocation.

It writes, in ``DIR``: the resolved scenario (``scenario.toml``), the run's certificates
(``certs/``: a CA and one key and certificate per client, as ``dfedrw certs``; each client reads
only its own key), and ``job.sbatch``, which ``sbatch DIR/job.sbatch`` submits. The job asks one
Slurm task per client and starts each client as a job step of its own (``srun --ntasks=1``):
client K is step ``client-K``, so Slurm accounts, signals and cancels each client alone
(``scancel JOBID.STEP`` stops one client and the others go on, as a peer network must).
The clients meet through torch.distributed's TCP store (the c10d rendezvous that torchrun
uses, :mod:`dfedrw.launch.torchrun`): client 0 runs on the allocation's first node and hosts
it, each client publishes its gRPC address there and reads its neighbours', and client 0
writes ``DIR/run/summary.json`` when every client is done (or its wait is up), as ``dfedrw run``
writes it. Models go between clients over gRPC with mutual TLS, as everywhere. The results
folder ``DIR/run`` must be one folder every node writes to (a shared file system, as Slurm
clusters have). A scenario whose ``engine.device`` names a GPU asks one GPU per task
(``--gpus-per-task=1``); one on the CPU asks none.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from dfedrw.peer.config.scenario import Scenario, dump_scenario

SCRIPT = "job.sbatch"
RUN_DIR = "run"
CERTS_DIR = "certs"
LOGS_DIR = "logs"
# The c10d store's port on the first node: this plus the job id modulo 10,000.
STORE_PORT_BASE = 29500


class SlurmError(ValueError):
    """A Slurm job that cannot be written (one line)."""


def check_job(scenario: Scenario, ntasks: int | None) -> int:
    """The number of tasks: one per client; a bad request refused in one line."""
    clients = scenario.num_clients
    if ntasks is not None and ntasks < clients:
        raise SlurmError(
            f"--ntasks {ntasks} is fewer than the scenario's {clients} clients (topology.honest + topology.byzantine): "
            "each client is one Slurm task"
        )
    if ntasks is not None and ntasks > clients:
        raise SlurmError(f"--ntasks {ntasks} is more than the scenario's {clients} clients: each Slurm task runs one client, and a task left over would wait for nothing")
    if scenario.engine.name != "clients":
        raise SlurmError(f"engine.name = {scenario.engine.name!r}: a peer network on Slurm runs client processes (engine.name = \"clients\")")
    from dfedrw.peer.wiring.build import scenario_transport

    kind = scenario_transport(scenario)
    if kind.placement not in ("processes", "torchrun"):
        raise SlurmError(f"network.transport = {scenario.network.transport!r} runs its clients as {kind.placement}, not as processes of their own")
    return clients


def job_script(
    scenario: Scenario, out: Path, *, python: str, cpus_per_task: int = 1, partition: str | None = None, time_limit: str | None = None,
    name: str | None = None, certs: bool = True,
) -> str:
    """The sbatch script of the job (see the module docstring); ``certs``: whether the clients
    load their identities from ``DIR/certs`` (mutual TLS)."""
    out = Path(out).resolve()
    n = scenario.num_clients
    q = shlex.quote
    gpu = scenario.engine.device.startswith("cuda")
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name or 'dfedrw'}",
        f"#SBATCH --ntasks={n}",
        f"#SBATCH --cpus-per-task={cpus_per_task}",
        f"#SBATCH --output={out / LOGS_DIR / 'job-%j.out'}",
    ]
    if gpu:
        lines.append("#SBATCH --gpus-per-task=1")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if time_limit:
        lines.append(f"#SBATCH --time={time_limit}")
    step_gpu = " --gpus-per-task=1" if gpu else ""
    certs_flag = f' --certs "$DIR/{CERTS_DIR}"' if certs else ""
    lines += [
        "# Written by dfedrw slurm: one client per Slurm task, each a job step of its own (step name",
        "# client-K), meeting through the c10d store that client 0 hosts on the first node.",
        "set -uo pipefail",
        f"DIR={q(str(out))}",
        f"PYTHON={q(python)}",
        f"CLIENTS={n}",
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"PORT=$(( {STORE_PORT_BASE} + SLURM_JOB_ID % 10000 ))",
        'echo "dfedrw: $CLIENTS clients, the store on $HEAD:$PORT, results in $DIR/run"',
        'for ((k = 0; k < CLIENTS; k++)); do',
        '    where=()',
        '    if [ "$k" = 0 ]; then where=(--nodelist "$HEAD"); fi',
        f'    srun --ntasks=1 --nodes=1 --cpus-per-task={cpus_per_task}{step_gpu} --job-name="client-$k" "${{where[@]}}" \\',
        '        --export="ALL,RANK=$k,WORLD_SIZE=$CLIENTS,LOCAL_RANK=0,LOCAL_WORLD_SIZE=1,MASTER_ADDR=$HEAD,MASTER_PORT=$PORT" \\',
        f'        "$PYTHON" -m dfedrw.launch.torchrun --scenario "$DIR/scenario.toml" --out "$DIR/{RUN_DIR}"{certs_flag} \\',
        f'        > "$DIR/{LOGS_DIR}/client-$k.out" 2>&1 &',
        "done",
        "wait",
        f'if [ -f "$DIR/{RUN_DIR}/summary.json" ]; then echo "dfedrw: summary in $DIR/{RUN_DIR}/summary.json"; else echo "dfedrw: no summary (client 0 failed: see $DIR/{LOGS_DIR}/client-0.out)"; exit 1; fi',
    ]
    return "\n".join(lines) + "\n"


def write_job(
    scenario: Scenario, out: Path, *, ntasks: int | None = None, python: str | None = None, cpus_per_task: int = 1,
    partition: str | None = None, time_limit: str | None = None, days: int = 30,
) -> Path:
    """Write the job's folder ``out`` (new or empty); returns its sbatch script."""
    from dfedrw.peer.transport.identity import make_certificates

    check_job(scenario, ntasks)
    if cpus_per_task < 1:
        raise SlurmError(f"--cpus-per-task {cpus_per_task}: must be at least 1")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SlurmError(f"--out {out}: must be a new or empty folder")
    (out / LOGS_DIR).mkdir(parents=True, exist_ok=True)
    dump_scenario(scenario, out / "scenario.toml")
    uses_tls = scenario.network.tls != "off"
    if uses_tls:
        make_certificates(scenario.num_clients, out / CERTS_DIR, days=days)
    script = out / SCRIPT
    text = job_script(
        scenario, out, python=python or sys.executable, cpus_per_task=cpus_per_task, partition=partition, time_limit=time_limit,
        name=f"dfedrw-{out.resolve().name}", certs=uses_tls,
    )
    script.write_text(text, encoding="utf-8")
    script.chmod(0o755)
    return script
