"""Build a run's ``summary.json`` from the files its clients wrote: the one place every way of
running a scenario (local processes, in-process, torchrun, docker-compose services, clients started
by hand, the batched engine) turns a results folder into a summary. Roles come from the scenario;
pids, when the caller does not know them, from each client's final record; a client with no final
record failed. The compact ``record.json`` that a sweep's report reads
(:class:`~dfedrw.peer.results.records.RecordBuilder`) is written beside it from the same read."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dfedrw.peer.wiring.build import scenario_transport
from dfedrw.peer.config.scenario import Scenario, load_scenario
from dfedrw.peer.wiring.plan import scenario_graphs, scenario_topology
from dfedrw.peer.results.records import RECORD_FILE, RecordBuilder, RoundDigest, read_final, read_rounds, summarize, write_json_atomic
from dfedrw.topologies import Topology


def collected_now() -> str:
    """Timestamp for a summary assembled after the clients finished (``collected_at``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def collect_summary(
    out_dir: Path,
    scenario: Scenario | None = None,
    *,
    pids: dict[int, int | None] | None = None,
    exit_codes: dict[int, int | None] | None = None,
    wall_seconds: float | None = None,
    extra: dict[str, Any] | None = None,
    digests: dict[int, RoundDigest] | None = None,
) -> dict[str, Any]:
    """Summarize ``out_dir`` (scenario: given, or ``out_dir/scenario.toml``) and write summary.json
    and record.json; ``digests``: every client's :class:`~dfedrw.peer.results.records.RoundDigest`, kept
    as its round log was written, read instead of the round logs."""
    out_dir = Path(out_dir)
    if scenario is None:
        scenario = load_scenario(out_dir / "scenario.toml")
    topology = scenario_topology(scenario)
    roles = {k: ("byzantine" if k in topology.byzantine else "honest") for k in range(topology.num_clients)}
    finals = {k: read_final(out_dir, k) for k in roles}
    if pids is None:
        pids = {k: (f or {}).get("pid") for k, f in finals.items()}
    if wall_seconds is None:
        wall_seconds = max((f.get("wall_seconds", 0.0) for f in finals.values() if f), default=0.0)
    record = RecordBuilder((k for k, role in roles.items() if role == "honest"), roles)
    summary = summarize(
        out_dir, roles=roles, pids=pids, exit_codes=exit_codes or {}, rounds=scenario.rounds, wall_seconds=wall_seconds,
        record=record, digests=digests,
    )
    # Whether senders were authenticated: a reader of the summary must not have to guess.
    uses_tls = scenario_transport(scenario).uses_tls
    summary["tls"] = scenario.network.tls if uses_tls else f"n/a ({scenario.network.transport} transport)"
    summary["engine"] = scenario.engine.name
    # Models a client received a round, the mean over clients and rounds (fixed graph or schedule).
    graphs = scenario_graphs(scenario, topology)
    summary["mean_degree"] = round(graphs.mean_degree(scenario.rounds), 6)
    if graphs.dynamic:
        summary["schedule"] = scenario.topology.schedule
    summary["placement"] = placement_summary(scenario, topology)
    summary.update(extra or {})
    # The record first: a folder with a summary is a finished run, whose record is then there too.
    write_json_atomic(out_dir / RECORD_FILE, record.result(), indent=None)
    write_json_atomic(out_dir / "summary.json", summary)
    return summary


def placement_summary(scenario: Scenario, topology: Topology) -> dict[str, Any]:
    """``summary["placement"]``: how the Byzantine clients were placed (``topology.placement``) and
    each one's centrality by that measure, by id in picking order (empty for ``"random"``)."""
    centrality = {str(k): round(v, 9) for k, v in topology.centrality.items()}
    return {"kind": scenario.topology.placement, "centrality": centrality}


def write_tensorboard_mean(out_dir: Path, scenario: Scenario, log_dir: Path) -> Path:
    """``--tensorboard``: write the honest mean of the run in ``out_dir``, from its round logs,
    to ``log_dir/honest-mean/`` (the clients wrote their own folders as they went)."""
    from dfedrw.peer.results.tensorboard import write_honest_mean

    topology = scenario_topology(scenario)
    return write_honest_mean(log_dir, (read_rounds(out_dir, k) for k in topology.honest()), topology.byzantine)
