"""What a sweep on Ray runs on a node: one batch of runs of the batched engine (:func:`run_batch_task`),
and the actor its progress goes through (:class:`Progress`). Imported on the nodes (and by the
driver, :mod:`dfedrw.experiments.sweep_ray`) only where Ray is installed.

A task gets each run's name and resolved scenario (TOML text), runs them as one batch in a
folder of its own under the node's temporary directory (the batched engine in the Ray worker's
process: torch and the engine stay imported from one batch to the next), and returns the files
of every run folder as bytes, with its exit status and the node it ran on; the folder is then
deleted. Nothing is written to a shared file system: the driver writes the files where a local
sweep writes them. Ray moves the task's arguments and its result with its own serializer between
the driver and the cluster's workers (one trust domain: see docs/cluster.md); the client
processes' model messages never go through it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import tempfile
import threading
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import ray

# Seconds between two reads of a running batch's log for its progress.
PROGRESS_EVERY = 2.0


@ray.remote(num_cpus=0)
class Progress:
    """Where each running batch says how far its rounds have come (a fraction), and the driver
    reads them all; it holds no CPU."""

    def __init__(self) -> None:
        self._done: dict[int, float] = {}

    def update(self, job: int, fraction: float) -> None:
        self._done[job] = fraction

    def read(self) -> dict[int, float]:
        return dict(self._done)


def version() -> str:
    """The installed dfedrw's version (a node must run the driver's)."""
    try:
        return metadata.version("dfedrw")
    except metadata.PackageNotFoundError:
        return "unknown"


def node() -> dict[str, str]:
    """The Ray node this runs on: its id, address and host name."""
    context = ray.get_runtime_context()
    return {"node_id": context.get_node_id(), "address": ray.util.get_node_ip_address(), "host": socket.gethostname()}


def data_key(data: Any) -> str:
    """Which data set a scenario's ``[data]`` section reads (its name, folder and settings)."""
    return json.dumps([data.name, data.dir, [list(p) for p in data.params]], default=str)


def ship_data(scenarios: list[Any]) -> dict[str, tuple[str | None, list[Any]]]:
    """The driver's side: for each data set that ``scenarios`` read, the SHA-256 of its contents
    (:func:`~dfedrw.peer.learning.datacache.content_digest`) and, in a list (so that a task
    fetches it only if it needs it), a reference to its arrays in Ray's object store, put once:
    a node fetches them at most once, and its workers share them. None and [] for a set the
    data cache cannot store (each node then reads its own files)."""
    from dfedrw.peer.learning.datacache import content_digest, stored_arrays
    from dfedrw.peer.wiring.build import scenario_dataset

    shipped: dict[str, tuple[str | None, list[Any]]] = {}
    for scenario in scenarios:
        key = data_key(scenario.data)
        if key in shipped:
            continue
        source = scenario_dataset(scenario.data)
        found = stored_arrays(source)
        if found is None:
            shipped[key] = (None, [])
            continue
        arrays, scale, classes = found
        shipped[key] = (content_digest(source), [ray.put(({k: np.asarray(v) for k, v in arrays.items()}, scale, classes))])
    return shipped


_DIGESTS: dict[str, str | None] = {}  # this node's digest of each data set it read from its files


def use_data(scenarios: list[Any], shipped: dict[str, tuple[str | None, list[Any]]]) -> str | None:
    """A node's side, before a batch: each data set the batch reads is this node's own copy,
    checked against the driver's (the same contents, whatever the files' names and times), or,
    where this node lacks its files, the driver's arrays (:func:`ship_data`). Returns why the
    batch cannot run here, or None."""
    from dfedrw.peer.learning.data import DatasetUnavailable
    from dfedrw.peer.learning.datacache import content_digest, provide, provided
    from dfedrw.peer.learning.datasets import check_available
    from dfedrw.peer.wiring.build import scenario_dataset

    for scenario in scenarios:
        key = data_key(scenario.data)
        digest, refs = shipped.get(key, (None, []))
        source = scenario_dataset(scenario.data)
        if provided(source):
            continue
        try:
            check_available(source)
        except DatasetUnavailable:
            if not refs:
                raise
            arrays, scale, classes = ray.get(refs[0])
            provide(source, arrays, scale, classes)
            continue
        if digest is None:
            continue
        if key not in _DIGESTS:
            _DIGESTS[key] = content_digest(source)
        if _DIGESTS[key] != digest:
            where = scenario.data.dir or "its default folder"
            return (
                f"this node's copy of data set {scenario.data.name} ({where}) differs from the driver's (SHA-256 of its contents "
                f"{str(_DIGESTS[key])[:16]}..., the driver's {digest[:16]}...): give every node the same files, or remove them "
                "from this node so that it takes the driver's"
            )
    return None


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``, by its path relative to it, and each empty folder (its
    path and a ``/``, no bytes)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            out[path.relative_to(folder).as_posix()] = path.read_bytes()
        elif path.is_dir() and not any(path.iterdir()):
            out[path.relative_to(folder).as_posix() + "/"] = b""
    return out


def _report(progress: Any, job: int, log: Path, stop: threading.Event) -> None:
    from dfedrw.experiments.sweep_board import rounds_done

    last = None
    while not stop.wait(PROGRESS_EVERY):
        fraction = rounds_done(log)
        if fraction is not None and fraction != last:
            last = fraction
            progress.update.remote(job, fraction)


def run_batch_task(
    runs: list[tuple[str, str]], driver_version: str, progress: Any = None, job: int = 0, tensorboard: bool = False,
    data: dict[str, tuple[str | None, list[Any]]] | None = None,
) -> dict[str, Any]:
    """Run ``runs`` (each its folder's name and its scenario's TOML) as one batch on this node;
    return ``rc`` (the batch's exit status), ``node`` (:func:`node`), ``files`` (each run's
    files, its log among them: name -> relative path -> bytes; ``log`` says why where there are
    none) and, with ``tensorboard``,
    ``events`` (each run's event files, the same way). ``data``: the driver's data sets
    (:func:`ship_data`), checked against this node's or used where it has none (:func:`use_data`)."""
    from rich.console import Console

    from dfedrw.experiments.sweep_plan import LOG_FILE, REQUEST_FILE
    from dfedrw.launch.batched_engine import run_batch
    from dfedrw.peer.config.scenario import load_scenario

    here = node()
    if version() != driver_version:
        message = f"this node runs dfedrw {version()}, the sweep's driver {driver_version}: install the same version on every node\n"
        return {"rc": 2, "node": here, "files": {}, "log": message, "events": {}}
    work = Path(tempfile.mkdtemp(prefix="dfedrw-ray-"))
    try:
        folders = []
        for name, toml in runs:
            folder = work / "runs" / name
            folder.mkdir(parents=True)
            (folder / REQUEST_FILE).write_text(toml, encoding="utf-8")
            folders.append(folder)
        for folder in folders[1:]:
            (folder / LOG_FILE).write_text(f"run in a batch of {len(runs)} runs; its log: ../{folders[0].name}/{LOG_FILE}\n", encoding="utf-8")
        log = folders[0] / LOG_FILE
        try:
            why = use_data([load_scenario(folder / REQUEST_FILE) for folder in folders], data or {})
        except (ValueError, RuntimeError, OSError) as exc:  # a data set missing here and not shipped: DatasetUnavailable
            why = f"error: {exc}"
        if why is not None:
            with log.open("a", encoding="utf-8") as fh:
                fh.write(why + "\n")
            return {"rc": 2, "node": here, "files": {folder.name: _files(folder) for folder in folders}, "events": {}}
        events = work / "events" if tensorboard else None
        stop = threading.Event()
        reporter = None
        if progress is not None:
            reporter = threading.Thread(target=_report, args=(progress, job, log, stop), name="progress", daemon=True)
            reporter.start()
        pairs = [(folder / REQUEST_FILE, folder) for folder in folders]
        with log.open("a", encoding="utf-8") as fh, contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
            try:
                rc = run_batch(pairs, console=Console(file=fh, width=120, soft_wrap=True), tensorboard=events)
            except Exception:  # noqa: BLE001 - the batch failed: its traceback goes in its log
                import traceback

                traceback.print_exc(file=fh)
                rc = 1
        stop.set()
        if reporter is not None:
            reporter.join()
        return {
            "rc": rc,
            "node": here,
            "files": {folder.name: _files(folder) for folder in folders},
            "events": {folder.name: _files(events / folder.name) for folder in folders if events is not None and (events / folder.name).is_dir()},
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
