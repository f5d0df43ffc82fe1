"""A convolutional model between real client processes: LeNet-5 over gRPC with mutual TLS
(``dfedrw run``) and under torchrun, on 28x28 images the test writes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from dfedrw.launch.local import LocalRun
from dfedrw.peer.config.scenario import dump_scenario, load_scenario
from tests.support.datafiles import write_image_idx
from tests.support.runs import quiet_console, run_job
from tests.integration.test_cnn_parts import ROUNDS, check_run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def scenario(images: Path, *overrides: str):
    return load_scenario(None, [
        "data.name=mnist", f"data.dir={images}", "train.model=lenet5", "train.momentum=0.9", "topology.honest=3",
        "topology.byzantine=1", f"rounds={ROUNDS}", "eval.every=1", "attack.name=alie", "aggregation.rule=dfedreweighting",
        "network.round_timeout=60", *overrides,
    ])


def test_lenet5_clients_as_processes_over_mutual_tls(tmp_path):
    images = write_image_idx(tmp_path / "images")
    summary = LocalRun(scenario(images), tmp_path / "out", console=quiet_console()).run()
    assert summary["tls"] == "mutual" and len({p["pid"] for p in summary["peers"].values()}) == 4
    check_run(tmp_path / "out", summary)
    rejected = [json.loads((tmp_path / "out" / "peers" / f"{k}.json").read_text())["rejected_messages"] for k in summary["peers"]]
    assert rejected == [0, 0, 0, 0]


def test_lenet5_under_torchrun(tmp_path):
    if not TORCHRUN.exists():
        pytest.skip(f"torchrun not found next to {sys.executable}")
    images = write_image_idx(tmp_path / "images")
    scenario_file = tmp_path / "scenario.toml"
    dump_scenario(scenario(images), scenario_file)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "4", "-m", "dfedrw.launch.torchrun", "--scenario", str(scenario_file), "--out", str(tmp_path / "out")]
    rc, output = run_job(cmd, cwd=REPO, env=env, timeout=300)
    assert rc == 0, output[-4000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["launcher"] == "torchrun"
    check_run(tmp_path / "out", summary)
