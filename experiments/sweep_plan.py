"""A sweep's plan: each point resolved to a scenario, the scenario's identity (its run folder's
name), which runs are done, running or to run, and how runs are grouped into batches of the
batched engine."""

from __future__ import annotations
import dataclasses
import hashlib
import json
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
import tomli_w
from rich.console import Console
from dfedrw.peer.config.scenario import Scenario, ScenarioError, load_scenario, scenario_changes, scenario_from_dict, scenario_to_dict
from dfedrw.peer.config.checks import parse_toml
from dfedrw.peer.config.unused import unused_settings
from dfedrw.experiments.grid import Grid, Point, SweepError, expand
from dfedrw.experiments.report_spec import normalize_report_spec

# The layout of a sweep folder (see experiments.sweep).
SWEEP_FILE = "sweep.json"


LOCK_FILE = "sweep.lock"


RUNS_DIR = "runs"


REQUEST_FILE = "scenario.request.toml"


LOG_FILE = "run.log"


PID_FILE = "run.pid"  # the PID of the `dfedrw run` child while it runs


def scenario_text(scenario: Scenario) -> str:
    """The resolved scenario as TOML: what the run folder's scenario.request.toml holds."""
    return tomli_w.dumps(scenario_to_dict(scenario))


def scenario_key(scenario: Scenario) -> str:
    """The run's identity: first 10 hex digits of the SHA-256 of the settings that differ from
    the built-in defaults (TOML), so adding a new key with a neutral default later does not
    orphan finished runs."""
    return hashlib.sha256(tomli_w.dumps(scenario_changes(scenario)).encode("utf-8")).hexdigest()[:10]


def slug(labels: Mapping[str, str], limit: int = 48) -> str:
    """A short, file-name-safe label for a point, e.g. ``43_dirichlet-0-1_dfedavg``."""
    parts = [re.sub(r"[^a-z0-9]+", "-", str(v).lower()).strip("-") for v in labels.values()]
    text = "_".join(p for p in parts if p) or "run"
    return text[:limit].rstrip("-_")


@dataclass
class PlannedRun:
    key: str
    folder: Path
    scenario: Scenario
    toml: str
    points: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.folder.name


@dataclass
class Plan:
    grid: Grid
    out_dir: Path
    points: list[Point]
    point_runs: list[str]
    runs: dict[str, PlannedRun]
    report: dict[str, Any] | None


def _check_runnable(scenario: Scenario, memory: bool = True) -> None:
    # The launcher's own pre-flight (rules, attacks, data on disk), so a missing dataset or a
    # bad rule parameter fails the sweep before it starts rather than in every run. ``memory``:
    # whether the runs run on this machine (a sweep on Ray checks its nodes' memory instead).
    from dfedrw.launch.preflight import preflight

    preflight(scenario, memory=memory)


def _names_engine(grid: Grid, points: Sequence[Point]) -> bool:
    """Whether the grid's base file, ``set``, axes or variants choose ``engine.name``."""
    if grid.base is not None:
        try:
            base = parse_toml(Path(grid.base).read_text(encoding="utf-8"), str(grid.base))
        except (OSError, UnicodeDecodeError, ScenarioError):
            base = {}  # load_scenario reports it, with the point
        if isinstance(base.get("engine"), Mapping) and "name" in base["engine"]:
            return True
    return any(o.split("=", 1)[0].strip() == "engine.name" for p in points for o in p.overrides)


def plan_sweep(grid: Grid, out_dir: str | Path, *, check_runnable: bool = False, here: bool = True) -> Plan:
    """Resolve and validate every point, group identical scenarios, and name their folders.

    A point whose scenario is invalid raises :class:`SweepError` naming the point, before
    anything runs (``here``: whether the runs run on this machine, whose memory is then checked
    too). An existing folder whose name ends in the same hash is reused whatever its
    slug, so reordering the grid does not orphan finished runs.
    """
    out_dir = Path(out_dir).resolve()
    report = normalize_report_spec(grid.report, grid.axis_labels(), required=grid.report is not None)
    points = expand(grid)
    if not points:
        raise SweepError(f"{grid.path}: the grid has no points left after [[exclude]]")
    runs_dir = out_dir / RUNS_DIR
    existing = {p.name.rsplit("-", 1)[-1]: p for p in sorted(runs_dir.iterdir())} if runs_dir.is_dir() else {}
    runs: dict[str, PlannedRun] = {}
    point_runs = []
    # Sweeps compute with the batched engine unless the grid names an engine.
    engine = [] if _names_engine(grid, points) else ["engine.name=batched"]
    for i, point in enumerate(points):
        try:
            scenario = load_scenario(grid.base, [*engine, *point.overrides])
        except ScenarioError as exc:
            raise SweepError(f"point {point.describe()}: {exc}") from None
        key = scenario_key(scenario)
        if key not in runs:
            folder = existing.get(key, runs_dir / f"{slug(point.labels)}-{key}")
            runs[key] = PlannedRun(key, folder, scenario, scenario_text(scenario))
            if check_runnable:
                try:
                    _check_runnable(scenario, memory=here)
                except (ValueError, RuntimeError) as exc:
                    raise SweepError(f"point {point.describe()}: {exc}") from None
        runs[key].points.append(i)
        point_runs.append(key)
    return Plan(grid, out_dir, points, point_runs, runs, report)


def run_state(folder: Path, scenario: Scenario) -> str:
    """``done``: a finished run of ``scenario``; ``unfinished``: interrupted or crashed (redo it);
    ``absent``; ``different``: a finished run of another scenario (left alone)."""
    summary_path = folder / "summary.json"
    if not folder.exists():
        return "absent"
    if not summary_path.exists():
        return "unfinished"
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return "unfinished"
    # An interrupted run writes a summary too, and one where every honest client failed has
    # no accuracy: neither is a result.
    if summary.get("interrupted") or summary.get("honest_mean_accuracy") is None:
        return "unfinished"
    try:
        recorded = scenario_from_dict(parse_toml((folder / "scenario.toml").read_text(encoding="utf-8"), str(folder)))
    except (OSError, UnicodeDecodeError, ScenarioError):
        return "different"
    # The engine that computed it is not part of what it is (a run of the clients engine is a
    # finished run of the same scenario for a sweep that uses the batched one).
    return "done" if dataclasses.replace(recorded, engine=scenario.engine) == scenario else "different"


def still_running(folder: Path) -> int | None:
    """The PID of a ``dfedrw run`` or batch still working in ``folder`` (left by a sweep that was
    killed without stopping its children), else None. A recycled PID is told apart by its
    command line where /proc shows it: it names the run folder, or it is the fork server's
    (a batch forked from one, :func:`~dfedrw.experiments.sweep.batch_server`, keeps the
    server's command line)."""
    from dfedrw.launch.procs import pid_alive

    try:
        pid = int((folder / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    if pid <= 0 or not pid_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return pid  # no /proc here: alive is all we can tell
    return pid if folder.name in cmdline or "dfedrw.launch.forkserver" in cmdline else None


def run_seconds(folder: Path) -> float | None:
    """A finished run's share of its process's wall time, if its summary is readable: the wall
    time the summary records, over the runs of its batch (which its log's first line names:
    each run of a batch records the batch's wall time); None without a readable log, which
    would leave the share unknown."""
    try:
        seconds = json.loads((folder / "summary.json").read_text(encoding="utf-8")).get("wall_seconds")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
        return None
    size = _batch_size(folder / LOG_FILE)
    return None if size is None else float(seconds) / size


# Where a batch's log begins (the batched engine's line) and its other runs' logs (the sweep's).
_BATCH_LINE = re.compile(r"^(?:batched engine: (\d+) runs as one batch|run in a batch of (\d+) runs)", re.MULTILINE)


def _batch_size(log: Path) -> int | None:
    """How many runs shared the process that ran this one, from the start of its log (1 where
    it does not say; None without a readable log)."""
    try:
        with log.open("rb") as fh:
            head = fh.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return None
    found = _BATCH_LINE.search(head)
    return max(1, int(found.group(1) or found.group(2))) if found else 1


DEFAULT_BATCH = 16  # runs per batch (`dfedrw sweep --batch`)
TAPER_FROM = 4  # batches per job from which the last ones are cut smaller (plan_batches)


def plan_batches(runs: Sequence[PlannedRun], jobs: int, batch: int) -> list[list[PlannedRun]]:
    """The runs as the sweep hands them out: runs of the batched engine that share a
    :func:`~dfedrw.launch.batched_engine.batch_key` (model, training, rounds, device) go in batches of
    at most ``batch``, split evenly into a multiple of ``jobs`` batches where there are enough
    runs, so that every job has work to the end; every other run alone. Grid order is kept within a batch.

    Where each job has at least :data:`TAPER_FROM` batches, the last ``jobs`` batches are cut in
    halves and the last ``jobs`` halves in halves again: the jobs then end within about a
    quarter of a batch of each other, not up to a whole batch apart, as batches of the same
    size take different times (their rules and attacks differ)."""
    from dfedrw.engines.together import batch_key

    groups: dict[Any, list[PlannedRun]] = {}
    out: list[list[PlannedRun]] = []
    for run in runs:
        if batch > 1 and run.scenario.engine.name == "batched":
            groups.setdefault(batch_key(run.scenario), []).append(run)
        else:
            out.append([run])
    for members in groups.values():
        count = max(-(-len(members) // batch), min(jobs, len(members)))
        if len(members) >= jobs:
            count = -(-count // jobs) * jobs  # a multiple of the jobs: no job left alone at the end
        # Exactly ``count`` batches, their sizes one apart (304 runs in 20 batches: 4 of 16 and
        # 16 of 15, not 19 of 16 with the last one alone).
        batches = _even_parts(members, count)
        if count >= TAPER_FROM * jobs:
            for _ in range(2):
                batches[-jobs:] = [half for b in batches[-jobs:] for half in _even_parts(b, min(2, len(b)))]
        out[:0] = batches
    return out


def _even_parts(members: Sequence[PlannedRun], count: int) -> list[list[PlannedRun]]:
    """``members`` in ``count`` consecutive parts whose sizes are at most one apart, larger first."""
    size, larger = divmod(len(members), count)
    bounds = [0]
    for i in range(count):
        bounds.append(bounds[-1] + size + (1 if i < larger else 0))
    return [list(members[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]


def print_plan(plan: Plan, file: TextIO | None = None) -> None:
    """The points, their run folders and whether each is already done (``--dry-run``)."""
    file = file or sys.stdout
    states = {key: run_state(r.folder, r.scenario) for key, r in plan.runs.items()}
    for i, (point, key) in enumerate(zip(plan.points, plan.point_runs)):
        run = plan.runs[key]
        shared = f" (shared by {len(run.points)} points)" if len(run.points) > 1 else ""
        print(f"{i:4d}  {point.describe()}  ->  {RUNS_DIR}/{run.name}  [{states[key]}]{shared}", file=file)
    done = sum(1 for s in states.values() if s == "done")
    print(f"{len(plan.points)} points, {len(plan.runs)} distinct runs: {done} done, {len(plan.runs) - done} to run", file=file)


def warn_unused(plan: Plan, console: Console) -> None:
    """A line for each setting the grid's runs will not use (peer/config/unused.py), with how many
    runs it concerns: a grid's variants often share settings only some of them read."""
    counts = Counter(line for run in plan.runs.values() for line in unused_settings(run.scenario))
    for line, count in counts.items():
        console.print(f"warning: {count} of {len(plan.runs)} runs: {line}", markup=False, highlight=False, soft_wrap=True)
