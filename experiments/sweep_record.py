"""A sweep's record and its lock: ``OUT/sweep.json`` (the grid, the report spec, every point and
its status, the sittings with their wall time), and ``OUT/sweep.lock``, held while a sweep runs
there. The sweep itself is :mod:`experiments.sweep`."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dfedrw.experiments.grid import SweepError
from dfedrw.experiments.sweep_plan import LOCK_FILE, RUNS_DIR, SWEEP_FILE, Plan


def now_text() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def sweep_record(plan: Plan, statuses: Mapping[str, str], sittings: list[dict[str, Any]], nodes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The record; ``nodes``: the Ray node each run ran on (a sweep on Ray), by run hash."""
    nodes = nodes or {}
    return {
        "grid": str(plan.grid.path),
        "base": str(plan.grid.base) if plan.grid.base else None,
        "set": list(plan.grid.fixed),
        "axes": plan.grid.axis_labels(),
        "report": plan.report,
        "points": [
            {
                "labels": dict(p.labels),
                "run": f"{RUNS_DIR}/{plan.runs[key].name}",
                "overrides": list(p.overrides),
            }
            for p, key in zip(plan.points, plan.point_runs)
        ],
        "runs": {
            f"{RUNS_DIR}/{r.name}": {"hash": r.key, "status": statuses.get(r.key, "pending"), "points": len(r.points)}
            | ({"node": nodes[r.key]} if r.key in nodes else {})
            for r in plan.runs.values()
        },
        "sittings": sittings,
        "wall_seconds": round(sum(s.get("wall_seconds") or 0.0 for s in sittings), 3),
    }


def previous_sittings(out_dir: Path) -> list[dict[str, Any]]:
    """The sittings recorded so far. One that never wrote its final entry was killed (the lock
    is ours, so it is not running): it is marked so and keeps the time of its last checkpoint."""
    path = out_dir / SWEEP_FILE
    if not path.exists():
        return []
    try:
        sittings = list(json.loads(path.read_text(encoding="utf-8")).get("sittings", []))
    except (json.JSONDecodeError, AttributeError):
        return []
    for s in sittings:
        if isinstance(s, dict) and s.get("interrupted") is None:
            s.update(interrupted=True, killed=True)
    return sittings


def previous_nodes(plan: Plan) -> dict[str, Any]:
    """The Ray node of each run that an earlier sitting recorded (by run hash)."""
    try:
        runs = json.loads((plan.out_dir / SWEEP_FILE).read_text(encoding="utf-8")).get("runs", {})
        return {entry["hash"]: entry["node"] for entry in runs.values() if isinstance(entry, dict) and "node" in entry and "hash" in entry}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def check_same_grid(plan: Plan) -> None:
    """A sweep folder holds the sweep of one grid file: another grid's would replace its record
    (its points and report) and mix its runs with this one's."""
    path = plan.out_dir / SWEEP_FILE
    try:
        earlier = json.loads(path.read_text(encoding="utf-8")).get("grid")
    except (OSError, ValueError, AttributeError):
        return  # no sweep there yet (or no readable record of one): nothing to mix with
    if isinstance(earlier, str) and Path(earlier).name != Path(plan.grid.path).name:
        raise SweepError(
            f"{plan.out_dir} holds the sweep of grid {Path(earlier).name}, not of {Path(plan.grid.path).name}; "
            "give this grid another --out"
        )


@contextlib.contextmanager
def sweep_lock(out_dir: Path):
    """Hold ``out_dir/sweep.lock`` (our PID) while running: a second sweep on the same folder
    would delete the runs this one has in progress, taking them for interrupted ones."""
    from dfedrw.launch.procs import pid_alive

    path = out_dir / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            try:
                pid = int(path.read_text().strip() or "0")
            except (OSError, ValueError):
                pid = 0
            if pid and pid != os.getpid() and pid_alive(pid):
                raise SweepError(f"{out_dir}: another sweep (pid {pid}) is running there; wait for it or stop it") from None
            # Left by a sweep that was killed: take it over.
            path.unlink(missing_ok=True)
    with os.fdopen(fd, "w") as fh:
        fh.write(str(os.getpid()))
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
