"""The compact record of one finished run, and exporting a sweep in that form.

A run folder holds each client's per-round JSONL (megabytes for 3000 rounds). The report needs
only a little of it: the honest mean accuracy at each evaluation round and the mean weight each
honest client gave each sender. ``record.json`` keeps exactly that, next to ``summary.json``
(its layout: :class:`~dfedrw.peer.results.records.RecordBuilder`). Every run writes it with its summary,
from the same read of the round logs; :func:`run_record` builds it from the JSONL where it is
absent (a folder written before runs wrote it). ``dfedrw export SWEEP --out DIR`` copies a
sweep as ``sweep.json`` plus ``runs/<run>/{summary.json, scenario.toml, record.json}`` for each
finished run: small enough to commit, and ``dfedrw report DIR`` gives the same tables and plots
from it as from the sweep.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from dfedrw.peer.results.records import RECORD_FILE, RECORD_VERSION, RecordBuilder, write_json_atomic

NOT_STARTED = "not started"  # the state of a run whose folder does not exist (yet)
EXPORTED_FILES = ("summary.json", "scenario.toml", RECORD_FILE)


class RecordError(ValueError):
    """A sweep folder that cannot be exported."""


def peer_ids(summary: dict[str, Any], role: str | None = None) -> list[int]:
    peers = summary.get("peers", {})
    return sorted(int(k) for k, p in peers.items() if role is None or p.get("role") == role)


def _lines(folder: Path, client: int) -> Iterator[dict[str, Any]]:
    path = folder / "peers" / f"{client}.jsonl"
    if not path.exists():
        return
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line of a crashed client


def build_record(folder: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Read the honest clients' JSONL files of a run folder once and reduce them to the record."""
    receivers = peer_ids(summary, "honest")
    builder = RecordBuilder(receivers, peer_ids(summary))
    for k in receivers:
        builder.add(k, _lines(folder, k))
    return builder.result()


def read_record(folder: Path) -> dict[str, Any] | None:
    """The folder's ``record.json``, or None when it is missing, unreadable or of another version."""
    try:
        record = json.loads((folder / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) and record.get("version") == RECORD_VERSION else None


def run_record(folder: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The run's record: ``record.json`` when present, else built from the JSONL files; a run
    with neither (an exported run whose ``record.json`` is damaged) is refused, not read as a
    run without curves."""
    record = read_record(folder)
    if record is not None:
        return record
    if not (folder / "peers").is_dir():
        raise RecordError(
            f"{folder}: {RECORD_FILE} is missing, unreadable or of another version, and there are no round logs "
            "(peers/) to build it from; export the run again"
        )
    return build_record(folder, summary)


def write_record(folder: Path) -> dict[str, Any]:
    """Build and write ``record.json`` for a finished run folder (one with ``summary.json``)."""
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    record = build_record(folder, summary)
    write_json_atomic(folder / RECORD_FILE, record, indent=None)
    return record


def curve(record: dict[str, Any], key: str) -> dict[int, float]:
    return {int(r): float(v) for r, v in record["curves"].get(key, [])}


def weights(record: dict[str, Any]) -> tuple[list[int], list[int], np.ndarray]:
    w = record["weights"]
    matrix = np.array([[np.nan if x is None else x for x in row] for row in w["matrix"]], dtype=float)
    return list(w["receivers"]), list(w["senders"]), matrix.reshape(len(w["receivers"]), len(w["senders"]))


def _portable(path: str | None) -> str | None:
    """A path as it may be committed: relative to the working directory when under it, else
    only its file name (an absolute path names one machine)."""
    if not path:
        return path
    p = Path(path)
    try:
        return p.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return p.name


def read_sweep(folder: Path) -> dict[str, Any]:
    """A sweep folder's ``sweep.json`` (its grid, axes and points)."""
    path = folder / "sweep.json"
    if not path.exists():
        raise RecordError(f"{folder}: no sweep.json; give a folder written by `dfedrw sweep`")
    try:
        sweep = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(sweep, dict) or not isinstance(sweep.get("points", []), list):
        raise RecordError(f"{path}: not a sweep's record (a JSON object with a list of points)")
    return sweep


def read_summary(folder: Path) -> tuple[dict[str, Any] | None, str]:
    """(summary, "done") for a finished run folder, else (None, why it has no result)."""
    path = folder / "summary.json"
    if not path.exists():
        return None, "no summary.json" if folder.exists() else NOT_STARTED
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, "unreadable summary.json"
    if not isinstance(summary, dict):
        return None, "unreadable summary.json"
    if summary.get("interrupted"):
        return None, "interrupted"
    return summary, "done"


def is_export(folder: Path) -> bool:
    """Whether ``folder`` holds what :func:`export_sweep` writes and nothing else: ``sweep.json``
    and ``runs/<run>/`` with the exported files."""
    entries = {p.name: p for p in folder.iterdir()}
    if set(entries) - {"sweep.json", "runs"} or not entries.get("sweep.json", folder).is_file():
        return False
    runs = entries.get("runs")
    if runs is None:
        return True
    return runs.is_dir() and all(run.is_dir() and {f.name for f in run.iterdir()} <= set(EXPORTED_FILES) for run in runs.iterdir())


def check_export_dest(src: Path, dest: Path) -> None:
    """Refuse a destination :func:`export_sweep` would replace at a loss: the sweep folder, a
    folder inside it or holding it, anything but a folder, or a folder that holds more than an
    earlier export (a sweep's own runs, or files of the user's)."""
    source, target = src.resolve(), dest.resolve()
    if target == source or source in target.parents or target in source.parents:
        where = "is" if target == source else "is inside" if source in target.parents else "holds"
        raise RecordError(f"--out {dest} {where} the sweep folder {src}; export to a folder outside it")
    if not dest.exists():
        return
    if not dest.is_dir():
        raise RecordError(f"--out {dest} is not a folder")
    if any(dest.iterdir()) and not is_export(dest):
        raise RecordError(
            f"--out {dest} holds more than an earlier export (which it would replace, with all it holds); "
            "give an empty or new folder"
        )


def export_sweep(src: str | Path, dest: str | Path) -> tuple[int, list[str]]:
    """Copy the compact form of the sweep folder ``src`` to ``dest`` (see the module docstring).

    Returns (runs exported, runs left out because they have not finished). ``dest`` (new, empty,
    or an earlier export: :func:`check_export_dest`) is replaced wholesale, so an export is
    exactly the sweep's current state.
    """
    src, dest = Path(src), Path(dest).absolute()  # absolute: "." has no name to put ".exporting" after
    sweep = read_sweep(src)
    check_export_dest(src, dest)
    tmp = dest.with_name(dest.name + ".exporting")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "runs").mkdir(parents=True)
    exported, left_out = 0, []
    for run in sorted({p["run"] for p in sweep.get("points", [])}):
        folder = src / run
        summary, state = read_summary(folder)
        if summary is None:
            left_out.append(f"{run} ({state})")
            continue
        out = tmp / run
        out.mkdir(parents=True)
        shutil.copyfile(folder / "summary.json", out / "summary.json")
        shutil.copyfile(folder / "scenario.toml", out / "scenario.toml")
        record = read_record(folder) or build_record(folder, summary)
        write_json_atomic(out / RECORD_FILE, record, indent=None)
        exported += 1
    sweep["grid"] = _portable(sweep.get("grid"))
    sweep["base"] = _portable(sweep.get("base"))
    write_json_atomic(tmp / "sweep.json", sweep)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return exported, left_out
