"""Run one scenario to completion with the transport it names; the one entry point the CLI
and the sweep use."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console

from dfedrw.peer.wiring.build import scenario_transport
from dfedrw.peer.results.collect import write_tensorboard_mean
from dfedrw.launch.local import LocalRun
from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.results.records import check_fresh_out_dir
from dfedrw.peer.results.tensorboard import check_fresh_event_dir, require_tensorboard


def default_out_dir(root: Path = Path("runs")) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        path = root / (stamp if i == 0 else f"{stamp}-{i}")
        if not path.exists():
            return path
    raise RuntimeError(f"no free run folder under {root}")


def run_scenario(
    scenario: Scenario,
    out_dir: Path | None = None,
    *,
    console: Console | None = None,
    certs: Path | None = None,
    tensorboard: Path | None = None,
    start: str | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Run ``scenario``, write its results under ``out_dir`` and return (out_dir, summary).
    ``certs``: a certificate folder for the clients (default: new ones in ``out_dir/certs``).
    ``tensorboard``: a folder for TensorBoard event files: each honest client writes its own
    as it goes, and the honest mean is written when the run ends (:mod:`dfedrw.peer.results.tensorboard`).
    ``start``: how client processes start (``fork`` or ``spawn``, see :mod:`dfedrw.launch.forkserver`;
    default: fork where the system has it); only client processes have it."""
    out = Path(out_dir) if out_dir else default_out_dir()
    if tensorboard is not None:
        require_tensorboard()
        check_fresh_event_dir(tensorboard, range(scenario.num_clients))
    check_fresh_out_dir(out, range(scenario.num_clients))
    placement = scenario_transport(scenario).placement
    if placement == "torchrun" and scenario.engine.name == "clients":
        raise ValueError(
            f"network.transport = {scenario.network.transport!r} runs only under torchrun: "
            "torchrun --nproc-per-node N -m dfedrw.launch.torchrun --scenario FILE"
        )
    console = console or Console(stderr=True)
    if certs is not None:
        unused = (
            "the batched engine holds no certificates" if scenario.engine.name == "batched"
            else "client threads hold no certificates" if placement != "processes"
            else "network.tls = 'off'" if scenario.network.tls == "off" else None
        )
        if unused:
            console.print(f"[yellow]--certs {certs} is not used: {unused}[/yellow]")
    if scenario.engine.name == "batched":
        from dfedrw.launch.batched_engine import run_batched

        summary = run_batched(scenario, out, console=console, tensorboard=tensorboard)
    elif placement == "threads":
        from dfedrw.launch.inproc import run_inproc

        summary = run_inproc(scenario, out, console=console, tensorboard=tensorboard)
    else:
        summary = LocalRun(scenario, out, console=console, certs=certs, tensorboard=tensorboard, **({"start": start} if start else {})).run()
    if tensorboard is not None:
        write_tensorboard_mean(out, scenario, tensorboard)
    return out, summary
