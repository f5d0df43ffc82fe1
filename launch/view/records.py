"""What the web view shows of a run, read from its results folder as the run writes it: the
graph (laid out once, seeded, so that it does not move), who is Byzantine, and each client's round
records (``peers/<id>.jsonl``) as they are appended, trimmed to what the page draws.

Every engine writes the same folder (``scenario.toml``, ``peers/<id>.jsonl``, ``peers/<id>.json``),
so the view reads a running run, a finished one and a sweep's run folder alike."""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
from array import array
from pathlib import Path
from typing import Any

# The keys of a round record the page uses (the rest stays in the files).
SHOWN = (
    "round", "weights", "scores", "missing", "accuracy", "global_accuracy", "attack_success", "staleness", "neighbours",
    "sent_to", "received_from", "silent_to", "seconds", "bytes_sent", "resumed_from", "took_neighbours_model",
)
# What a client's final file says that the page marks.
FINAL = ("completed", "restarts", "rounds_lost", "role", "accuracy", "global_accuracy", "attack_success")


class NotARun(ValueError):
    """The folder given is not a run's results folder."""


def check_run_folder(folder: Path) -> Path:
    """``folder`` if it holds a run's scenario, else :class:`NotARun` in one line."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotARun(f"{folder}: no such folder")
    if not (folder / "scenario.toml").is_file():
        hint = "; a sweep's runs are in its runs/ folder" if (folder / "sweep.json").is_file() else ""
        raise NotARun(f"{folder}: not a run's results folder (no scenario.toml){hint}")
    return folder


def layout(graph: Any, seed: int) -> dict[int, tuple[float, float]]:
    """Node -> (x, y) in [0, 1]: a force layout, seeded, the same every time for one graph."""
    import networkx as nx

    if graph.number_of_nodes() <= 2:
        pos = nx.circular_layout(graph)
    else:
        pos = nx.spring_layout(graph, seed=seed % (2**32), iterations=100)
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    lo_x, hi_x, lo_y, hi_y = min(xs), max(xs), min(ys), max(ys)
    span = max(hi_x - lo_x, hi_y - lo_y) or 1.0
    return {int(k): (round((p[0] - lo_x) / span, 4), round((p[1] - lo_y) / span, 4)) for k, p in pos.items()}


def run_meta(scenario: Any) -> dict[str, Any]:
    """What the page draws before any round: clients, Byzantine ids, the (base) graph's directed
    edges and its layout, and what the run is."""
    from dfedrw.peer.wiring.plan import scenario_topology

    topology = scenario_topology(scenario)
    graph = topology.graph
    directed = graph.is_directed()
    edges = sorted({(int(u), int(v)) for u, v in graph.edges()} | (set() if directed else {(int(v), int(u)) for u, v in graph.edges()}))
    positions = layout(graph, scenario.seed)
    return {
        "clients": scenario.num_clients,
        "byzantine": sorted(int(b) for b in topology.byzantine),
        "edges": edges,
        "positions": {str(k): positions[k] for k in sorted(positions)},
        "rounds": scenario.rounds,
        "rule": scenario.aggregation.rule,
        "attack": scenario.attack.name if topology.byzantine else "none",
        "asynchronous": bool(scenario.network.asynchronous),
        "schedule": scenario.topology.schedule,
        "engine": scenario.engine.name,
    }


def _finite(value: Any) -> Any:
    """JSON has no NaN: a non-finite float becomes None."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def trimmed(client: int, record: dict[str, Any]) -> dict[str, Any]:
    """A round record as the page takes it: the client's id (``c``) and the keys it draws."""
    out: dict[str, Any] = {"c": client}
    for key in SHOWN:
        if key in record:
            out[key] = _finite(record[key])
    return out


class SpooledHistory:
    """Records (JSON texts) kept in an unnamed temporary file rather than in memory: the file
    holds them one a line and memory only where each ends (8 bytes a record, where the texts are
    some 400 bytes each: 2.4 MB instead of 120 MB for 100 clients over 3,000 rounds). A list's
    ``len`` and slices; :meth:`extend` from one thread while others read."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="dfedrw-view-")
        self._ends = array("Q", [0])  # where each record's line ends; [0]: before the first
        self._lock = threading.Lock()

    def extend(self, texts: list[str]) -> None:
        if not texts:
            return
        lines = [f"{t}\n".encode() for t in texts]
        with self._lock:
            end = self._ends[-1]
            os.pwrite(self._file.fileno(), b"".join(lines), end)
            for line in lines:
                end += len(line)
                self._ends.append(end)

    def __len__(self) -> int:
        with self._lock:
            return len(self._ends) - 1

    def __getitem__(self, part: slice) -> list[str]:
        if not isinstance(part, slice):
            raise TypeError("records are read in slices")
        with self._lock:
            start, stop, _ = part.indices(len(self._ends) - 1)
            if stop <= start:
                return []
            first, last = self._ends[start], self._ends[stop]
        return os.pread(self._file.fileno(), last - first, first).decode().splitlines()

    def close(self) -> None:
        self._file.close()


class RunRecords:
    """A run folder's round records, read as they are appended.

    :meth:`poll` reads what each ``peers/<id>.jsonl`` gained since the last call (whole lines
    only: a line being written is read next time) and returns it trimmed; the records read so far
    are kept, in arrival order, for pages that connect later (:attr:`history`, spooled to a
    temporary file). Thread-safe."""

    def __init__(self, folder: Path, scenario: Any = None) -> None:
        self.folder = Path(folder)
        if scenario is None:
            from dfedrw.peer.config.scenario import load_scenario

            scenario = load_scenario(check_run_folder(self.folder) / "scenario.toml")
        self.meta = run_meta(scenario)
        self.offsets = [0] * self.meta["clients"]
        self.history = SpooledHistory()  # each a JSON object (one client's round), as sent to pages
        self.finals: dict[int, dict[str, Any]] = {}
        self.lock = threading.Lock()

    def poll(self) -> list[str]:
        """The round records appended since the last call, each as one JSON text."""
        with self.lock:
            new: list[str] = []
            peers = self.folder / "peers"
            for k in range(self.meta["clients"]):
                path = peers / f"{k}.jsonl"
                try:
                    with path.open("rb") as f:
                        f.seek(self.offsets[k])
                        chunk = f.read()
                except FileNotFoundError:
                    continue
                end = chunk.rfind(b"\n")
                if end < 0:
                    continue
                self.offsets[k] += end + 1
                for line in chunk[: end + 1].splitlines():
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue  # a torn line of a crashed client: the files keep it, the view skips it
                    new.append(json.dumps(trimmed(k, record), separators=(",", ":")))
            self.history.extend(new)
            self._read_finals()
            return new

    def _read_finals(self) -> None:
        for k in range(self.meta["clients"]):
            if k in self.finals:
                continue
            path = self.folder / "peers" / f"{k}.json"
            try:
                final = json.loads(path.read_text())
            except (FileNotFoundError, ValueError):
                continue
            self.finals[k] = {key: _finite(final[key]) for key in FINAL if key in final}

    def snapshot(self) -> dict[str, Any]:
        """Everything read so far, for a page that has no server (the static export)."""
        self.poll()
        with self.lock:
            return {"meta": self.meta, "records": [json.loads(x) for x in self.history[:]], "finals": {str(k): v for k, v in self.finals.items()}}
