"""``dfedrw sweep --ray [ADDRESS]``: a sweep's batches as Ray tasks on a cluster.

The driver plans as a local sweep does (:mod:`experiments.sweep`: resume, one run per distinct
scenario, exclusions, the lock on ``OUT``) and submits each batch of runs of the batched engine as
a Ray task (:func:`~dfedrw.experiments.ray_task.run_batch_task`) that declares what it needs: one
CPU, the memory the fit check estimates for the batch (:func:`~dfedrw.peer.wiring.memory.batched_needs`),
and a share of a GPU where the runs name one. Ray places it on a node; the batch's files come back
as the task's result and the driver writes them under ``OUT/runs/``, as a local sweep's processes
do, so that ``dfedrw report`` and ``export`` read both alike; ``sweep.json`` names each run's node.

- A node lost mid-batch: Ray runs the task again elsewhere (at most :data:`RETRIES` times).
- A batch that fails (its exit status, not a lost node) is settled as locally: its finished
  runs kept, the others run again one by one; a run that fails alone fails once, with its log.
- Ctrl-C (or SIGTERM) cancels the tasks; the sweep is left resumable.
- The board's rounds come from the tasks, through a small actor (:class:`~.ray_task.Progress`).
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from dfedrw.experiments.grid import SweepError
from dfedrw.experiments.sweep_board import SweepBoard
from dfedrw.experiments.sweep_plan import LOG_FILE, PlannedRun, plan_batches

# Times Ray runs a task again whose node or worker was lost (not a batch that failed).
RETRIES = 3
# Seconds to wait for a cluster's address to answer before saying it does not.
CONNECT_TIMEOUT = 5.0
# A task's share of a GPU, for runs whose engine.device names one.
GPU_SHARE = 0.25
_POLL = 0.2
_PROGRESS_EVERY = 5.0
# Bytes of memory a batch holds besides the estimate of its runs (the worker, torch).
_WORKER_BYTES = 400 << 20


def _import_ray():
    try:
        import ray
    except ImportError:
        raise SweepError("--ray needs Ray, which is not installed: pip install 'dfedrw[ray]'") from None
    return ray


def _answers(address: str, timeout: float) -> str | None:
    """Why nothing answers at ``address`` (``HOST:PORT``, or ``ray://HOST:PORT``), or None."""
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return "not an address of the form HOST:PORT"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as exc:
        return f"nothing answers there within {timeout:.0f} s ({exc.strerror or exc})"


@dataclass
class RayCluster:
    """A connection of this process, the sweep's driver, to a Ray cluster."""

    address: str
    cpus: int
    node_memory: int  # bytes: the most any alive node offers tasks
    nodes: int

    @classmethod
    def connect(cls, address: str | None) -> RayCluster:
        """Join the cluster at ``address`` (else ``RAY_ADDRESS``, else ``auto``: one started on this
        machine with ``ray start``). Fails in one line, within seconds, where Ray is missing or no
        cluster answers."""
        ray = _import_ray()
        address = address or os.environ.get("RAY_ADDRESS") or "auto"
        if address != "auto":
            why = _answers(address, CONNECT_TIMEOUT)
            if why is not None:
                raise SweepError(f"--ray {address}: {why}")
        try:
            ray.init(address=address, log_to_driver=False, logging_level="WARNING", configure_logging=True)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SweepError(f"--ray {address}: {first}") from None
        alive = [n for n in ray.nodes() if n.get("Alive")]
        resources = ray.cluster_resources()
        memory = max((int(n.get("Resources", {}).get("memory", 0)) for n in alive), default=0)
        return cls(address, int(resources.get("CPU", 0)), memory, len(alive))

    def close(self) -> None:
        import ray

        ray.shutdown()


def batch_memory(runs: Sequence[PlannedRun]) -> int:
    """Bytes a batch of ``runs`` holds on its node: the fit check's estimate, and the worker."""
    from dfedrw.launch.preflight import scenario_model_specs
    from dfedrw.peer.wiring.memory import batched_needs

    scenarios = [run.scenario for run in runs]
    return batched_needs(scenarios, [scenario_model_specs(s) for s in scenarios], None).total + _WORKER_BYTES


def check_fits(batches: Sequence[Sequence[PlannedRun]], cluster: RayCluster) -> None:
    """Refuse, in one line and before anything is submitted, batches that no node could hold."""
    if cluster.nodes == 0 or cluster.cpus == 0:
        raise SweepError(f"--ray {cluster.address}: the cluster offers no CPU to run on")
    if not batches or cluster.node_memory <= 0:
        return
    needs, largest = max(((batch_memory(b), b) for b in batches), key=lambda pair: pair[0])
    if needs > cluster.node_memory:
        more = " or a smaller batch (--batch)" if len(largest) > 1 else ""
        raise SweepError(
            f"a batch of {len(largest)} run(s) ({largest[0].name}, ...) needs about {needs / 1e9:.2f} GB; the largest node of "
            f"the Ray cluster offers {cluster.node_memory / 1e9:.2f} GB: add a larger node{more}"
        )


def ray_batches(runs: Sequence[PlannedRun], jobs: int, batch: int) -> list[list[PlannedRun]]:
    """The batches a sweep on Ray submits (:func:`plan_batches`); a run that is not of the
    batched engine is refused in one line (its clients are processes of one machine)."""
    others = [run.name for run in runs if run.scenario.engine.name != "batched"]
    if others:
        raise SweepError(
            f"--ray runs the batched engine; {len(others)} run(s) name another engine ({others[0]}, ...): "
            "run those without --ray, or set engine.name=batched"
        )
    return plan_batches(runs, jobs, batch)


@dataclass
class _Task:
    runs: list[PlannedRun]
    start: float
    job: int
    ref: Any = None


def write_files(folder: Path, files: dict[str, bytes]) -> None:
    """Write what a task returned for one run folder (:func:`~.ray_task.run_batch_task`):
    relative path -> bytes, an empty folder's path ending in ``/``; nothing outside ``folder``."""
    root = folder.resolve()
    for relative, data in files.items():
        path = (root / relative).resolve()
        if root not in path.parents:
            raise SweepError(f"a Ray task returned a path outside its run folder: {relative!r}")
        if relative.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def execute_on_ray(
    cluster: RayCluster, runs: Sequence[PlannedRun], jobs: int, board: SweepBoard, on_done, on_failure, on_tick, *,
    batch: int, console: Console, tensorboard: Path | None = None, nodes: dict[str, dict[str, str]] | None = None,
) -> None:
    """:func:`~dfedrw.experiments.sweep._execute` on a Ray cluster: at most ``jobs`` batches
    submitted at a time; each finished task's files written under its runs' folders, then
    settled as a local process's (:func:`~dfedrw.experiments.sweep_settle.settle`). ``nodes`` is
    filled with each finished run's node."""
    import ray

    from dfedrw.experiments import ray_task
    from dfedrw.experiments.sweep_settle import _clear, settle

    queue = deque(ray_batches(runs, jobs, batch))
    remote = ray.remote(ray_task.run_batch_task)
    progress = ray_task.Progress.options(max_restarts=RETRIES).remote()
    version = ray_task.version()
    data = ray_task.ship_data([run.scenario for run in runs])
    running: dict[Any, _Task] = {}
    jobs_started = 0
    next_progress = time.monotonic()
    try:
        while queue or running:
            while queue and len(running) < jobs:
                group = queue.popleft()
                jobs_started += 1
                options: dict[str, Any] = {"num_cpus": 1, "memory": batch_memory(group), "max_retries": RETRIES, "retry_exceptions": False}
                if group[0].scenario.engine.device.startswith("cuda"):
                    options["num_gpus"] = GPU_SHARE
                for run in group:
                    run.folder.mkdir(parents=True, exist_ok=True)
                    (run.folder / LOG_FILE).write_text(f"running on the Ray cluster {cluster.address}; the log comes back when the batch ends\n", encoding="utf-8")
                task = _Task(group, time.monotonic(), jobs_started)
                task.ref = remote.options(**options).remote([(run.name, run.toml) for run in group], version, progress, task.job, tensorboard is not None, data)
                running[task.ref] = task
                for run in group:
                    board.started(run, task.job)
            ready, _ = ray.wait(list(running), num_returns=len(running), timeout=_POLL) if running else ([], [])
            for ref in ready:
                task = running.pop(ref)
                seconds = (time.monotonic() - task.start) / len(task.runs)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    result = {"rc": 1, "node": {}, "files": {}, "log": f"the Ray task failed: {first}\n", "events": {}}
                for run in task.runs:
                    _clear(run, tensorboard)
                    run.folder.mkdir(parents=True, exist_ok=True)
                    write_files(run.folder, result["files"].get(run.name, {}))
                    if tensorboard is not None and run.name in result.get("events", {}):
                        write_files(Path(tensorboard) / run.name, result["events"][run.name])
                head_log = task.runs[0].folder / LOG_FILE
                if not head_log.exists():  # the task returned no files: why, in its place
                    head_log.write_text(result.get("log", ""), encoding="utf-8")
                if nodes is not None and result.get("node"):
                    for run in task.runs:
                        nodes[run.key] = result["node"]
                queue.extend([run] for run in settle(task.runs, result["rc"], seconds, board, on_done, on_failure, console=console, tensorboard=tensorboard))
            now = time.monotonic()
            if running and now >= next_progress:
                next_progress = now + _PROGRESS_EVERY
                try:
                    done = ray.get(progress.read.remote(), timeout=_PROGRESS_EVERY)
                except ray.exceptions.RayError:
                    done = {}
                for task in running.values():
                    if task.job in done:
                        board.progress(task.job, done[task.job])
            board.refresh()
            on_tick()
    except KeyboardInterrupt:
        console.print(f"interrupted: cancelling {len(running)} Ray task(s) (finished runs are kept)", markup=False, soft_wrap=True)
        for ref in running:
            ray.cancel(ref, force=True)
        raise
    finally:
        ray.kill(progress)


__all__ = ["RayCluster", "batch_memory", "check_fits", "execute_on_ray", "ray_batches", "write_files"]
