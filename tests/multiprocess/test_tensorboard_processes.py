"""``--tensorboard DIR`` with real processes: client processes started by ``dfedrw run`` (gRPC,
mutual TLS), torchrun ranks, and the runs of a sweep. Each writes its own client's event files
as it goes; the launcher (torchrun: rank 0) writes the honest mean when the run ends."""

import inspect
import json
import os
import socket
import sys
from pathlib import Path

import pytest

from dfedrw.experiments.cli import main
from dfedrw.experiments.sweep import run_sweep
from dfedrw.experiments.sweep_plan import RUNS_DIR
from dfedrw.launch.batched_engine import run_batched
from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from tests.support.runs import quiet_console, run_job, torchrun_scenario
from tests.support.tensorboard import check_tensorboard

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# 4 honest clients and a Byzantine one whose models DFedAvg takes in: a share above 0.
SETTINGS = [
    "rounds=4", "eval.every=2", "topology.honest=4", "topology.byzantine=1", "attack.name=gaussian",
    "aggregation.rule=dfedavg", "network.round_timeout=10", "network.transport=grpc",
]
BATCHED_TAKES_IT = "tensorboard" in inspect.signature(run_batched).parameters


@pytest.fixture(autouse=True)
def _tensorboard():
    pytest.importorskip("tensorboard")


def test_client_processes_write_their_own_event_files(tmp_path):
    # Prepare
    scenario = load_scenario(None, SETTINGS)

    # Execute
    out, summary = run_scenario(scenario, tmp_path / "out", console=quiet_console(), tensorboard=tmp_path / "tb")

    # Assert
    assert summary["failed_peers"] == [] and summary["transport"] == "grpc"
    assert len({p["pid"] for p in summary["peers"].values()}) == scenario.num_clients
    check_tensorboard(out, tmp_path / "tb", scenario)


def test_torchrun_ranks_write_their_own_and_rank_0_the_honest_mean(tmp_path):
    # Prepare
    scenario = load_scenario(None, SETTINGS)

    # Execute
    rc, output = torchrun_scenario(scenario, tmp_path / "out", "--tensorboard", str(tmp_path / "tb"))

    # Assert
    assert rc == 0, output[-4000:]
    check_tensorboard(tmp_path / "out", tmp_path / "tb", scenario)


@pytest.mark.skipif("tensorboard" not in inspect.signature(run_sweep).parameters, reason="run_sweep takes no tensorboard folder yet")
@pytest.mark.parametrize(
    "engine",
    [
        "clients",
        pytest.param(None, marks=pytest.mark.skipif(not BATCHED_TAKES_IT, reason="run_batched takes no tensorboard folder yet"), id="batched"),
    ],
)
def test_a_sweep_gives_each_run_a_subfolder_named_like_its_run_folder(engine, tmp_path):
    # Prepare: two runs (two seeds); the grid names the clients engine, or leaves the sweep's
    # default, batched, whose two runs go as one batch with one job
    settings = [s for s in SETTINGS if not s.startswith("network.transport")] + ["network.transport=inproc"]
    settings += [f"engine.name={engine}"] if engine else []
    grid = tmp_path / "grid.toml"
    grid.write_text(f"set = {settings!r}\n\n[axes]\nseed = [43, 44]\n".replace("'", '"'))

    # Execute
    code = main(["sweep", str(grid), "--out", str(tmp_path / "sweep"), "--jobs", "1", "--tensorboard", str(tmp_path / "tb")])

    # Assert
    assert code == 0
    runs = sorted((tmp_path / "sweep" / RUNS_DIR).iterdir())
    assert len(runs) == 2 and sorted(p.name for p in (tmp_path / "tb").iterdir()) == [r.name for r in runs]
    for run in runs:
        scenario = load_scenario(run / "scenario.toml")
        assert scenario.engine.name == (engine or "batched")
        check_tensorboard(run, tmp_path / "tb" / run.name, scenario)


def test_dfedrw_run_takes_the_variable_and_its_clients_ignore_a_hand_started_clients_variables(tmp_path):
    # Prepare: a shell left as it was after starting a client by hand: its port, its results
    # folder, its TensorBoard folder. `dfedrw run` takes the last for its own flag (its
    # clients' files and the honest mean); none of them reaches the clients it starts.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ, "OMP_NUM_THREADS": "1", "DFEDRW_TENSORBOARD": str(tmp_path / "tb"), "DFEDRW_LISTEN_PORT": str(port),
        "DFEDRW_OUT": str(tmp_path / "elsewhere"),
    }
    cmd = [sys.executable, "-m", "dfedrw.experiments.cli", "run", "--out", str(tmp_path / "out"), *(x for s in SETTINGS for x in ("--set", s))]

    # Execute
    rc, output = run_job(cmd, cwd=REPO, env=env, timeout=300)

    # Assert
    assert rc == 0, output[-4000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["failed_peers"] == [] and summary["transport"] == "grpc"
    addresses = [json.loads((tmp_path / "out" / "peers" / f"{k}.json").read_text())["address"] for k in summary["peers"]]
    assert len(set(addresses)) == len(addresses) and f"127.0.0.1:{port}" not in addresses  # each client its own port
    check_tensorboard(tmp_path / "out", tmp_path / "tb", load_scenario(tmp_path / "out" / "scenario.toml"))
    assert not (tmp_path / "elsewhere").exists()
