"""``--tensorboard DIR`` on whole runs in this process: the event files of every honest client
and of the honest mean hold what the round logs say; without the flag nothing is written and
tensorboard is not imported; a folder of an earlier run and a missing package are refused
before anything runs."""

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from dfedrw.experiments.cli import main
from dfedrw.launch.batched_engine import run_batched
from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from tests.support.runs import quiet_console
from tests.support.tensorboard import check_tensorboard

REPO = Path(__file__).resolve().parents[2]
# 4 honest clients and a Byzantine one whose models DFedAvg takes in: a share above 0.
SETTINGS = [
    "rounds=4", "eval.every=2", "topology.honest=4", "topology.byzantine=1", "attack.name=gaussian",
    "aggregation.rule=dfedavg", "network.round_timeout=5", "network.transport=inproc",
]
BATCHED_TAKES_IT = "tensorboard" in inspect.signature(run_batched).parameters


@pytest.mark.parametrize(
    "engine",
    [
        "clients",
        pytest.param("batched", marks=pytest.mark.skipif(not BATCHED_TAKES_IT, reason="run_batched takes no tensorboard folder yet")),
    ],
)
def test_every_honest_client_and_the_honest_mean_get_the_round_logs_values(engine, tmp_path):
    # Prepare
    pytest.importorskip("tensorboard")
    scenario = load_scenario(None, [*SETTINGS, f"engine.name={engine}"])

    # Execute
    out, summary = run_scenario(scenario, tmp_path / "out", console=quiet_console(), tensorboard=tmp_path / "tb")

    # Assert
    assert summary["failed_peers"] == [] and summary["byzantine_weight_share"] > 0
    check_tensorboard(out, tmp_path / "tb", scenario)


def test_a_run_without_the_flag_writes_no_event_file_and_imports_no_tensorboard(tmp_path):
    # Prepare: a fresh interpreter, so modules other tests imported do not count
    code = (
        "import sys; from pathlib import Path; "
        "from dfedrw.launch.runner import run_scenario; from dfedrw.peer.config.scenario import load_scenario; "
        "from tests.support.runs import quiet_console; "
        f"run_scenario(load_scenario(None, {SETTINGS!r}), Path(sys.argv[1]), console=quiet_console()); "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'tensorboard'], 'tensorboard imported'"
    )

    # Execute
    completed = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=120)

    # Assert
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert (tmp_path / "out" / "summary.json").exists()
    assert not [p for p in tmp_path.rglob("*") if "tfevents" in p.name]


def test_a_tensorboard_folder_of_an_earlier_run_is_refused_before_anything_runs(tmp_path, capsys):
    # Prepare
    pytest.importorskip("tensorboard")
    args = ["run", *(a for s in SETTINGS for a in ("--set", s)), "--tensorboard", str(tmp_path / "tb")]
    assert main([*args, "--out", str(tmp_path / "first")]) == 0

    # Execute
    code = main([*args, "--out", str(tmp_path / "second")])

    # Assert
    assert code == 2
    assert "holds TensorBoard event files of an earlier run" in capsys.readouterr().err
    assert not (tmp_path / "second").exists()


def test_the_flag_without_the_package_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    # Prepare: an import of tensorboard fails
    monkeypatch.setitem(sys.modules, "tensorboard", None)

    # Execute
    code = main(["run", *(a for s in SETTINGS for a in ("--set", s)), "--out", str(tmp_path / "out"), "--tensorboard", str(tmp_path / "tb")])

    # Assert
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == "dfedrw: --tensorboard needs the tensorboard package: pip install 'dfedrw[tensorboard]'"
    assert not (tmp_path / "out").exists() and not (tmp_path / "tb").exists()
