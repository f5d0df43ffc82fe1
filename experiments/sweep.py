"""``dfedrw sweep``: run a grid of scenarios, each distinct scenario once, in parallel, resumably.

A grid file (TOML) names a base scenario, fixed overrides, axes whose product gives the points,
named variants (labelled bundles of overrides), exclusions and the layout of the report::

    base = "../fashion_iid.toml"        # optional, relative to the grid file; absent = built-in default
    set = ["rounds=3000", "network.transport=inproc"]   # optional, applied to every point

    [axes]                              # scenario key -> list of values; the product is taken
    seed = [43, 44, 45, 46]
    "data.partition" = ["iid", "dirichlet:0.1"]

    [[variants.method]]                 # a named axis whose values are labelled override bundles
    label = "DFedAvg"
    set = ["aggregation.rule=dfedavg"]

    [[exclude]]                         # drop every point matching all of these (a list = any of)
    "data.partition" = "iid"
    method = ["DFedAvg"]

    [report]                            # read by ``dfedrw report``; see experiments.report

Overrides apply in this order: the base file, ``set``, the plain axes (grid order), then the
variants (grid order). Variants come last so that a bundle such as a No-attack baseline
(``attack.name=none``, ``topology.byzantine=0``) wins over an attack axis; the points it covers
then resolve to one scenario and run once.

Results go under ``OUT``:

    OUT/sweep.json                  the grid path, the report spec, every point (its labels, its
                                    overrides and its run folder), the sittings and their wall time
                                    (saved at each finished run and every minute, so that a sweep
                                    killed outright keeps its time up to then; marked ``killed``)
    OUT/sweep.lock                  the PID of the sweep running there (refuses a second one)
    OUT/runs/<slug>-<hash>/         one folder per distinct resolved scenario (``hash``: the first
                                    10 hex digits of the SHA-256 of its resolved TOML), holding
                                    scenario.request.toml, run.log, run.pid (while it runs) and
                                    what ``dfedrw run`` writes

Running the same command again resumes: a folder with a finished summary of the same scenario
is skipped, an interrupted or crashed one is deleted and run again. A run whose ``dfedrw run``
is still alive (its sweep was killed outright, so it never stopped its children) is never
deleted under it: the sweep refuses to start until it has ended.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import tomli_w
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dfedrw.peer.config import Scenario, ScenarioError, load_scenario, parse_override, scenario_changes, scenario_from_dict, scenario_to_dict
from dfedrw.peer.results import write_json_atomic
from dfedrw.experiments.record import write_record

GRID_KEYS = ("base", "set", "axes", "variants", "exclude", "report")
VARIANT_KEYS = ("label", "set")
SWEEP_FILE = "sweep.json"
LOCK_FILE = "sweep.lock"
RUNS_DIR = "runs"
REQUEST_FILE = "scenario.request.toml"
LOG_FILE = "run.log"
PID_FILE = "run.pid"  # the PID of the `dfedrw run` child while it runs

# Between SIGINT (the child writes an interrupted summary and stops its clients) and SIGTERM,
# then SIGKILL, when a sweep is stopped.
_INT_GRACE = 10.0
_TERM_GRACE = 5.0
_POLL = 0.2
# How often (seconds) a sitting's time is saved to sweep.json besides at each finished run.
_CHECKPOINT_EVERY = 60.0
_LOG_TAIL_LINES = 20


class SweepError(ValueError):
    """A grid file or a point of it is invalid; the message names the problem and the fix."""


# ---------------------------------------------------------------------------------------------
# The grid


@dataclass(frozen=True)
class AxisValue:
    label: str
    overrides: tuple[str, ...]
    # The TOML value of a plain axis; a variant's label.
    raw: Any


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[AxisValue, ...]
    variant: bool = False

    @property
    def labels(self) -> list[str]:
        return [v.label for v in self.values]


@dataclass(frozen=True)
class Grid:
    path: Path
    base: Path | None
    fixed: tuple[str, ...]
    axes: tuple[Axis, ...]
    excludes: tuple[Mapping[str, Any], ...] = ()
    report: Mapping[str, Any] | None = None

    def axis_labels(self) -> dict[str, list[str]]:
        """Axis name -> its value labels, in grid order."""
        return {a.name: a.labels for a in self.axes}


@dataclass(frozen=True)
class Point:
    labels: Mapping[str, str]
    overrides: tuple[str, ...]

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.labels.items()) or "(the base scenario)"


def toml_value(value: Any) -> str:
    """``value`` written as a TOML value, so that ``key=<it>`` parses back to the same value."""
    return tomli_w.dumps({"v": value}).strip()[len("v = "):]


def _label(value: Any) -> str:
    return value if isinstance(value, str) else toml_value(value)


def _string_list(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SweepError(f"{where} must be a list of \"key=value\" strings, got {value!r}")
    for text in value:
        try:
            parse_override(text)
        except ScenarioError as exc:
            raise SweepError(f"{where}: {exc}") from None
    return tuple(value)


def load_grid(path: str | Path) -> Grid:
    """Read and check a grid file (the module docstring describes the format)."""
    path = Path(path).resolve()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SweepError(f"grid file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SweepError(f"{path}: not valid TOML: {exc}") from None
    for key in raw:
        if key not in GRID_KEYS:
            raise SweepError(f"{path}: unknown key '{key}'; valid keys: {', '.join(GRID_KEYS)}")

    base = None
    if raw.get("base"):
        if not isinstance(raw["base"], str):
            raise SweepError(f"{path}: base must be a path string, got {raw['base']!r}")
        base = (path.parent / raw["base"]).resolve()
        if not base.is_file():
            raise SweepError(f"{path}: base scenario file not found: {base}")
    fixed = _string_list(f"{path}: set", raw.get("set", []))

    axes: list[Axis] = []
    plain = raw.get("axes", {})
    if not isinstance(plain, Mapping):
        raise SweepError(f"{path}: [axes] must be a table of key = [values]")
    for name, values in plain.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{path}: axis '{name}' needs a non-empty list of values, got {values!r}")
        entries = []
        for v in values:
            if not isinstance(v, (str, int, float, bool)):
                raise SweepError(f"{path}: axis '{name}': value {v!r} must be a string, number or boolean")
            entries.append(AxisValue(_label(v), (f"{name}={toml_value(v)}",), v))
        axes.append(Axis(name, tuple(entries)))

    variants = raw.get("variants", {})
    if not isinstance(variants, Mapping):
        raise SweepError(f"{path}: variants must be tables of [[variants.NAME]] entries")
    for name, entries in variants.items():
        if name in plain:
            raise SweepError(f"{path}: '{name}' is both an axis and a variant axis; rename one")
        if not isinstance(entries, list) or not entries or not all(isinstance(e, Mapping) for e in entries):
            raise SweepError(f"{path}: variants.{name} must be a list of [[variants.{name}]] tables")
        values = []
        for i, entry in enumerate(entries):
            where = f"{path}: variants.{name}[{i}]"
            for key in entry:
                if key not in VARIANT_KEYS:
                    raise SweepError(f"{where}: unknown key '{key}'; valid keys: {', '.join(VARIANT_KEYS)}")
            label = entry.get("label")
            if not isinstance(label, str) or not label:
                raise SweepError(f"{where}: needs a label string")
            values.append(AxisValue(label, _string_list(f"{where}.set", entry.get("set", [])), label))
        axes.append(Axis(name, tuple(values), variant=True))

    for axis in axes:
        seen = set()
        for label in axis.labels:
            if label in seen:
                raise SweepError(f"{path}: axis '{axis.name}' has the value '{label}' twice")
            seen.add(label)

    names = [a.name for a in axes]
    excludes = raw.get("exclude", [])
    if not isinstance(excludes, list) or not all(isinstance(e, Mapping) for e in excludes):
        raise SweepError(f"{path}: exclude must be a list of [[exclude]] tables")
    for i, ex in enumerate(excludes):
        if not ex:
            raise SweepError(f"{path}: exclude[{i}] is empty; it would remove every point")
        for key in ex:
            if key not in names:
                raise SweepError(f"{path}: exclude[{i}]: unknown axis '{key}'; axes: {', '.join(names)}")

    report = raw.get("report")
    if report is not None and not isinstance(report, Mapping):
        raise SweepError(f"{path}: [report] must be a table")
    return Grid(path, base, fixed, tuple(axes), tuple(excludes), report)


def _matches(value: AxisValue, wanted: Any) -> bool:
    options = wanted if isinstance(wanted, list) else [wanted]
    return any(w == value.raw or (isinstance(w, str) and w == value.label) for w in options)


def expand(grid: Grid) -> list[Point]:
    """Every point of the grid: the product of its axes (first axis slowest), less the excluded."""
    points = []
    for combo in itertools.product(*(a.values for a in grid.axes)):
        chosen = dict(zip((a.name for a in grid.axes), combo))
        if any(all(_matches(chosen[k], v) for k, v in ex.items()) for ex in grid.excludes):
            continue
        plain = [o for a in grid.axes if not a.variant for o in chosen[a.name].overrides]
        bundles = [o for a in grid.axes if a.variant for o in chosen[a.name].overrides]
        points.append(Point({k: v.label for k, v in chosen.items()}, (*grid.fixed, *plain, *bundles)))
    return points


# ---------------------------------------------------------------------------------------------
# Resolved scenarios and their folders


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


def _check_runnable(scenario: Scenario) -> None:
    # The launcher's own pre-flight (rules, attacks, data on disk), so a missing dataset or a
    # bad rule parameter fails the sweep before it starts rather than in every run.
    from dfedrw.launch.preflight import preflight

    preflight(scenario)


def _names_engine(grid: Grid, points: Sequence[Point]) -> bool:
    """Whether the grid's base file, ``set``, axes or variants choose ``engine.name``."""
    if grid.base is not None:
        try:
            base = tomllib.loads(Path(grid.base).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            base = {}  # load_scenario reports it, with the point
        if isinstance(base.get("engine"), Mapping) and "name" in base["engine"]:
            return True
    return any(o.split("=", 1)[0].strip() == "engine.name" for p in points for o in p.overrides)


def plan_sweep(grid: Grid, out_dir: str | Path, *, check_runnable: bool = False) -> Plan:
    """Resolve and validate every point, group identical scenarios, and name their folders.

    A point whose scenario is invalid raises :class:`SweepError` naming the point, before
    anything runs. An existing folder whose name ends in the same hash is reused whatever its
    slug, so reordering the grid does not orphan finished runs.
    """
    from dfedrw.experiments.report import normalize_report_spec

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
                    _check_runnable(scenario)
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
        recorded = scenario_from_dict(tomllib.loads((folder / "scenario.toml").read_text(encoding="utf-8")))
    except (OSError, tomllib.TOMLDecodeError, ScenarioError):
        return "different"
    # The engine that computed it is not part of what it is (a run of the clients engine is a
    # finished run of the same scenario for a sweep that uses the batched one).
    return "done" if dataclasses.replace(recorded, engine=scenario.engine) == scenario else "different"


def still_running(folder: Path) -> int | None:
    """The PID of a ``dfedrw run`` still working in ``folder`` (left by a sweep that was killed
    without stopping its children), else None. A recycled PID is told apart by its command
    line (which names the run folder) where /proc shows it."""
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
    return pid if folder.name in cmdline else None


def _run_seconds(folder: Path) -> float | None:
    """The wall time a finished run's summary records, if it is readable."""
    try:
        seconds = json.loads((folder / "summary.json").read_text(encoding="utf-8")).get("wall_seconds")
    except (OSError, ValueError, AttributeError):
        return None
    return float(seconds) if isinstance(seconds, (int, float)) and seconds > 0 else None


# ---------------------------------------------------------------------------------------------
# Running


def child_command(request: Path, folder: Path) -> list[str]:
    """The command that runs one scenario: a subprocess isolates crashes and uses its own core."""
    return [sys.executable, "-m", "dfedrw.launch.cli", "run", str(request), "--out", str(folder)]


def batch_command(runs: Sequence[PlannedRun]) -> list[str]:
    """The command that runs several scenarios of the batched engine as one batch of runs."""
    pairs = [x for run in runs for x in ("--run", str(run.folder / REQUEST_FILE), str(run.folder))]
    return [sys.executable, "-m", "dfedrw.launch.batched", *pairs]


DEFAULT_BATCH = 16  # runs per batch (`dfedrw sweep --batch`)


def plan_batches(runs: Sequence[PlannedRun], jobs: int, batch: int) -> list[list[PlannedRun]]:
    """The runs as the sweep hands them out: runs of the batched engine that share a
    :func:`~dfedrw.launch.batched.batch_key` (model, training, rounds, device) go in batches of
    at most ``batch``, split evenly into a multiple of ``jobs`` batches where there are enough
    runs, so that every job has work to the end; every other run alone. Grid order is kept within a batch."""
    from dfedrw.launch.batched import batch_key

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
        size = -(-len(members) // count)
        out[:0] = [members[i : i + size] for i in range(0, len(members), size)]
    return out


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # Several runs share the cores; torch's default of one thread per core would oversubscribe.
    env["OMP_NUM_THREADS"] = "1"
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Failure:
    run: str
    points: list[str]
    reason: str
    log_tail: str = ""


@dataclass
class SweepResult:
    out_dir: Path
    total: int
    done: int = 0
    skipped: int = 0
    failures: list[Failure] = field(default_factory=list)
    interrupted: bool = False
    wall_seconds: float = 0.0
    total_wall_seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 1 if self.failures else 0


class SweepBoard:
    """Sweep progress: a rich bar on a terminal, plain lines otherwise (one per finished run)."""

    def __init__(
        self, console: Console, total: int, skipped: int, *, jobs: int = 1,
        prior_seconds: Sequence[float] = (), heartbeat: float = 30.0,
    ) -> None:
        self.console = console
        self.total = total
        self.skipped = skipped
        self.done = 0
        self.failed = 0
        self.running = 0
        self.to_run = total - skipped
        self.jobs = max(1, jobs)
        # Run times for the ETA: the runs finished in earlier sittings and in this one.
        self._seconds: list[float] = list(prior_seconds)
        self._started: dict[str, float] = {}
        self.interactive = console.is_terminal
        self._heartbeat = heartbeat
        self._start = time.monotonic()
        self._next_beat = self._start + heartbeat
        self._progress = Progress(
            TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
            console=console, disable=not self.interactive,
        )
        self._task = self._progress.add_task("sweep", total=total, completed=skipped, info="", eta="?")

    def __enter__(self) -> "SweepBoard":
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.refresh()
        self._progress.__exit__(*exc)

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def eta(self) -> str:
        """Remaining work over the parallelism: the runs not started take the mean run time
        each, a running one what is left of the mean (nothing once it is past it)."""
        remaining = self.to_run - self.done - self.failed
        if remaining <= 0:
            return "0s"
        if not self._seconds:
            return "?"
        mean = sum(self._seconds) / len(self._seconds)
        now = time.monotonic()
        left_running = [max(mean - (now - t), 0.0) for t in self._started.values()]
        work = (remaining - len(left_running)) * mean + sum(left_running)
        if work <= 0:
            return "?"  # only runs already past the mean run time are left: no telling when
        return _seconds(max(work / self.jobs, max(left_running, default=0.0)))

    def info(self) -> str:
        return f"done {self.done} · skipped {self.skipped} · running {self.running} · failed {self.failed}"

    def line(self, text: str) -> None:
        self.console.print(f"[{self.elapsed():7.1f}s] {text}", highlight=False, markup=False, soft_wrap=True)

    def started(self, run: PlannedRun) -> None:
        self.running += 1
        self._started[run.key] = time.monotonic()
        if not self.interactive:
            self.line(f"start {run.name} ({run.scenario.engine.name} engine)")

    def finished(self, run: PlannedRun, ok: bool, seconds: float, *, retried: bool = False) -> None:
        """``seconds``: the run's share of its process's time (a batch's time over its runs).
        ``retried``: its batch failed before it finished; it is queued to run alone."""
        self.running -= 1
        self._started.pop(run.key, None)
        if retried:
            if not self.interactive:
                self.line(f"retry {run.name} alone (its batch failed)")
            return
        if ok:
            self._seconds.append(seconds)
            self.done += 1
        else:
            self.failed += 1
        if not self.interactive:
            word = "done" if ok else "FAILED"
            n = self.done + self.failed + self.skipped
            self.line(f"{word} {run.name} ({seconds:.1f} s); {n}/{self.total} · {self.info()} · ETA {self.eta()}")

    def refresh(self) -> None:
        n = self.done + self.failed + self.skipped
        self._progress.update(self._task, completed=n, info=self.info(), eta=self.eta())
        now = time.monotonic()
        if not self.interactive and now >= self._next_beat:
            self._next_beat = now + self._heartbeat
            self.line(f"{n}/{self.total} · {self.info()} · ETA {self.eta()}")


def _seconds(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class _Job:
    runs: list[PlannedRun]
    proc: subprocess.Popen
    log: Any
    start: float


def _stop(jobs: Sequence[_Job]) -> None:
    """Stop the runs this sweep started, by their PIDs: SIGINT (the run stops its clients and
    writes an interrupted summary), then SIGTERM, then SIGKILL. A second Ctrl-C skips the grace."""
    try:
        for sig, grace in ((signal.SIGINT, _INT_GRACE), (signal.SIGTERM, _TERM_GRACE)):
            alive = [j for j in jobs if j.proc.poll() is None]
            if not alive:
                break
            for j in alive:
                j.proc.send_signal(sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(j.proc.poll() is None for j in alive):
                time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        # The children live in their own sessions, so nothing else would ever stop them.
        for j in jobs:
            if j.proc.poll() is None:
                j.proc.kill()
            j.proc.wait()
            j.log.close()


def _execute(
    runs: Sequence[PlannedRun], jobs: int, board: SweepBoard, on_done, on_failure, on_tick, *, batch: int = 1, console: Console | None = None,
    tensorboard: Path | None = None,
) -> None:
    """Run ``runs`` with at most ``jobs`` processes at a time (each one run, or a batch of runs
    of the batched engine: :func:`plan_batches`), calling ``on_done(run)`` or
    ``on_failure(run, reason, log_tail)`` as each ends, and ``on_tick()`` on every pass of the
    polling loop. A batch that fails has its unfinished runs run again one by one, so that one
    broken run does not fail the others.

    On KeyboardInterrupt every running child is stopped and the interrupt re-raised; finished
    runs are left as they are.
    """
    queue = deque(plan_batches(runs, jobs, batch))
    running: list[_Job] = []
    env = _child_env()
    try:
        while queue or running:
            while queue and len(running) < jobs:
                group = queue.popleft()
                for run in group:
                    run.folder.mkdir(parents=True, exist_ok=True)
                    (run.folder / REQUEST_FILE).write_text(run.toml, encoding="utf-8")
                head = group[0]
                for run in group[1:]:
                    (run.folder / LOG_FILE).write_text(f"run in a batch of {len(group)} runs; its log: ../{head.name}/{LOG_FILE}\n", encoding="utf-8")
                log = (head.folder / LOG_FILE).open("wb")
                command = child_command(head.folder / REQUEST_FILE, head.folder) if len(group) == 1 else batch_command(group)
                if tensorboard is not None:
                    # `dfedrw run` writes where it is told; a batch puts each run in DIR/<its folder name> itself.
                    command += ["--tensorboard", str(Path(tensorboard) / head.name) if len(group) == 1 else str(tensorboard)]
                proc = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                    # Its own session: a Ctrl-C at the terminal reaches only the sweep, which
                    # then stops each child in order.
                    start_new_session=True,
                )
                for run in group:
                    (run.folder / PID_FILE).write_text(str(proc.pid))
                running.append(_Job(group, proc, log, time.monotonic()))
                for run in group:
                    board.started(run)
            for job in list(running):
                rc = job.proc.poll()
                if rc is None:
                    continue
                running.remove(job)
                job.log.close()
                seconds = (time.monotonic() - job.start) / len(job.runs)
                head_log = job.runs[0].folder / LOG_FILE
                retry = []
                for run in job.runs:
                    (run.folder / PID_FILE).unlink(missing_ok=True)
                    state = run_state(run.folder, run.scenario)
                    # A run finished with its summary written counts, even in a batch that failed.
                    ok = state == "done" and (rc == 0 or len(job.runs) > 1)
                    if not ok and len(job.runs) > 1:
                        board.finished(run, False, seconds, retried=True)
                        retry.append(run)
                    elif ok:
                        board.finished(run, True, seconds)
                        on_done(run)
                    else:
                        board.finished(run, False, seconds)
                        reason = f"exit code {rc}" if rc != 0 else f"exit code 0 but the run folder is {state}"
                        on_failure(run, reason, log_tail(head_log))
                if retry:
                    if console is not None:
                        console.print(
                            f"a batch of {len(job.runs)} runs failed (exit code {rc}; log {head_log}); running its {len(retry)} "
                            f"unfinished runs one by one:\n{log_tail(head_log, 5)}",
                            markup=False, highlight=False, soft_wrap=True,
                        )
                    for run in retry:
                        _clear(run, tensorboard)
                    queue.extend([run] for run in retry)
            board.refresh()
            on_tick()
            if running:
                time.sleep(_POLL)
    except KeyboardInterrupt:
        board.console.print("interrupted: stopping the running runs (finished runs are kept)", markup=False, soft_wrap=True)
        _stop(running)
        raise


def _clear(run: PlannedRun, tensorboard: Path | None) -> None:
    """Delete what an unfinished attempt at ``run`` left (its folder, its event files)."""
    if run.folder.exists():
        shutil.rmtree(run.folder)
    if tensorboard is not None:
        shutil.rmtree(Path(tensorboard) / run.name, ignore_errors=True)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _sweep_record(plan: Plan, statuses: Mapping[str, str], sittings: list[dict[str, Any]]) -> dict[str, Any]:
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
            for r in plan.runs.values()
        },
        "sittings": sittings,
        "wall_seconds": round(sum(s.get("wall_seconds") or 0.0 for s in sittings), 3),
    }


def _previous_sittings(out_dir: Path) -> list[dict[str, Any]]:
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


def run_sweep(
    grid_path: str | Path,
    out_dir: str | Path,
    *,
    jobs: int | None = None,
    batch: int = DEFAULT_BATCH,
    dry_run: bool = False,
    console: Console | None = None,
    check_runnable: bool = True,
    tensorboard: Path | None = None,
) -> SweepResult:
    """Run every distinct scenario of a grid under ``out_dir`` (see the module docstring).

    Finished runs are skipped, interrupted ones redone; up to ``jobs`` processes at a time,
    each a ``dfedrw run`` subprocess or, for runs of the batched engine, a batch of up to
    ``batch`` runs of one shape (:func:`plan_batches`). Returns counts, failures and wall time;
    the caller maps :attr:`SweepResult.exit_code` to the process exit status.
    """
    console = console or Console(stderr=True)
    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    if jobs < 1:
        raise SweepError(f"--jobs {jobs}: must be at least 1")
    if batch < 1:
        raise SweepError(f"--batch {batch}: must be at least 1")
    grid = load_grid(grid_path)
    plan = plan_sweep(grid, out_dir, check_runnable=check_runnable and not dry_run)
    result = SweepResult(plan.out_dir, total=len(plan.runs))
    if dry_run:
        print_plan(plan)
        return result
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    with _sweep_lock(plan.out_dir):
        return _run_plan(plan, jobs, console, result, batch=batch, tensorboard=tensorboard)


@contextlib.contextmanager
def _sweep_lock(out_dir: Path):
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


def _run_plan(plan: Plan, jobs: int, console: Console, result: SweepResult, *, batch: int = 1, tensorboard: Path | None = None) -> SweepResult:
    orphans = {run.name: pid for run in plan.runs.values() if (pid := still_running(run.folder)) is not None}
    if orphans:
        listed = ", ".join(f"{name} (pid {pid})" for name, pid in orphans.items())
        raise SweepError(
            f"{len(orphans)} run(s) in {plan.out_dir} are still running from a sweep that was killed "
            f"without stopping them: {listed}; wait for them to end or stop them (kill -INT PID), then run again"
        )
    statuses: dict[str, str] = {}
    to_run: list[PlannedRun] = []
    prior_seconds: list[float] = []
    for key, run in plan.runs.items():
        state = run_state(run.folder, run.scenario)
        if state == "done":
            statuses[key] = "done"
            result.skipped += 1
            seconds = _run_seconds(run.folder)
            if seconds is not None:
                prior_seconds.append(seconds)
        elif state == "different":
            statuses[key] = "failed"
            result.failures.append(Failure(
                run.name, [plan.points[i].describe() for i in run.points],
                f"{run.folder} holds a finished run of a different scenario; move it away to rerun this one",
            ))
        else:
            if state == "unfinished":
                # Clients append to their JSONL files, so leftovers would mix two runs.
                _clear(run, tensorboard)
            to_run.append(run)

    sittings = _previous_sittings(plan.out_dir)
    sitting: dict[str, Any] = {"start": _now(), "jobs": jobs, "batch": batch, "runs_total": len(plan.runs)}
    sittings.append(sitting)
    start = time.monotonic()
    last_save = start

    def save(final: bool = False) -> None:
        # Written at every finished run and once a minute, so that a sweep killed outright
        # (no chance to write its final entry) still counts its time up to the last save.
        nonlocal last_save
        result.wall_seconds = time.monotonic() - start
        sitting.update(
            end=_now(), wall_seconds=round(result.wall_seconds, 3), runs_done=result.done,
            runs_skipped=result.skipped, runs_failed=len(result.failures),
            interrupted=result.interrupted if final else None,
        )
        record = _sweep_record(plan, statuses, sittings)
        result.total_wall_seconds = record["wall_seconds"]
        write_json_atomic(plan.out_dir / SWEEP_FILE, record)
        last_save = time.monotonic()

    save()

    def on_tick() -> None:
        if time.monotonic() - last_save >= _CHECKPOINT_EVERY:
            save()

    def on_done(run: PlannedRun) -> None:
        # The compact record (curves, mean weights) that the report and `dfedrw export` read;
        # without it they rebuild it from the per-round files, so a failure here is not fatal.
        try:
            write_record(run.folder)
        except (OSError, ValueError) as exc:
            console.print(f"run {run.name}: could not write its record.json ({exc})", markup=False, highlight=False, soft_wrap=True)
        statuses[run.key] = "done"
        result.done += 1
        save()

    def on_failure(run: PlannedRun, reason: str, tail: str) -> None:
        statuses[run.key] = "failed"
        result.failures.append(Failure(run.name, [plan.points[i].describe() for i in run.points], reason, tail))
        save()
        console.print(f"run {run.name} failed ({reason}); last lines of {run.folder / LOG_FILE}:\n{tail}", markup=False, highlight=False, soft_wrap=True)

    console.print(
        f"sweep: {len(plan.points)} points, {len(plan.runs)} distinct runs, {result.skipped} already done, "
        f"{len(to_run)} to run, {jobs} at a time; results in {plan.out_dir}",
        markup=False, highlight=False, soft_wrap=True,
    )
    restore = _sigterm_as_interrupt()
    try:
        with SweepBoard(console, len(plan.runs), result.skipped, jobs=jobs, prior_seconds=prior_seconds) as board:
            _execute(to_run, jobs, board, on_done, on_failure, on_tick, batch=batch, console=console, tensorboard=tensorboard)
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        restore()
        save(final=True)

    console.print(
        f"sweep wall time: {_seconds(result.wall_seconds)} this sitting, {_seconds(result.total_wall_seconds)} "
        f"over {len(sittings)} sitting(s); {result.done} run, {result.skipped} skipped, {len(result.failures)} failed"
        + (" (interrupted)" if result.interrupted else ""),
        markup=False, highlight=False, soft_wrap=True,
    )
    if result.failures:
        console.print("failed runs:", markup=False, soft_wrap=True)
        for f in result.failures:
            console.print(f"  {f.run}: {f.reason} [points: {'; '.join(f.points)}]", markup=False, highlight=False, soft_wrap=True)
    return result


def _sigterm_as_interrupt():
    """Make SIGTERM stop the sweep the way Ctrl-C does (children stopped, results kept)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)
