"""Real client processes started by the launcher (loopback only)."""

import json
import os
import signal
import threading

import pytest

from dfedrw.launch.local import LocalRun
from dfedrw.peer.results.records import read_rounds
from tests.support.runs import quiet_console, wait_for


@pytest.mark.slow
def test_sigkill_one_honest_client_others_finish(small_scenario, tmp_path):
    scenario = small_scenario(
        "topology.honest=6", "topology.byzantine=0", "attack.name=none", "rounds=400", "network.round_timeout=3"
    )
    run = LocalRun(scenario, tmp_path, console=quiet_console())
    result = {}
    thread = threading.Thread(target=lambda: result.update(run.run()), daemon=True)
    thread.start()
    victim = 2
    try:
        wait_for(lambda: len(read_rounds(tmp_path, victim)) >= 20, 120, "client 2 to train 20 rounds")
        os.kill(run.children[victim].proc.pid, signal.SIGKILL)
        thread.join(timeout=180)
        assert not thread.is_alive(), "the run hung after a client was killed"
    finally:
        run.stop_all()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed_peers"] == [victim]
    assert summary["peers"][str(victim)]["exit_code"] == -signal.SIGKILL
    assert summary["peers"][str(victim)]["rounds_done"] < 400
    others = [p for k, p in summary["peers"].items() if int(k) != victim]
    assert all(p["completed"] and p["rounds_done"] == 400 for p in others)
    assert summary["honest_completed"] == 5


@pytest.mark.slow
def test_default_scenario_runs_as_distinct_processes(tmp_path):
    from dfedrw.peer.config.scenario import load_scenario

    run = LocalRun(load_scenario(None), tmp_path, console=quiet_console())
    summary = run.run()
    pids = [p["pid"] for p in summary["peers"].values()]
    assert len(pids) == 12 and len(set(pids)) == 12 and os.getpid() not in pids
    assert summary["failed_peers"] == []
    assert summary["byzantine_weight_share"] < 0.01
    assert summary["honest_mean_accuracy"] > 60
    for k in summary["peers"]:
        assert len(read_rounds(tmp_path, int(k))) == summary["rounds"]
        # Each client read the scenario its launcher had validated, and did not check it again.
        assert "read as its launcher validated it" in (tmp_path / "logs" / f"{k}.log").read_text()


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _launch(tmp_path, *overrides, preexec_fn=None):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "dfedrw.launch.cli", "run", "--out", str(tmp_path), "--set", "rounds=100000",
           "--set", "topology.honest=4", "--set", "topology.byzantine=0", "--set", "attack.name=none", *overrides]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=preexec_fn)


def _ignores(pid, signum):
    """Whether process ``pid`` has ``signum`` set to SIG_IGN (Linux /proc)."""
    with open(f"/proc/{pid}/status") as status:
        mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigIgn:"))
    return bool(mask >> (signum - 1) & 1)


@pytest.mark.slow
def test_ctrl_c_stops_every_client(tmp_path):
    launcher = _launch(tmp_path)
    try:
        wait_for(lambda: len(read_rounds(tmp_path, 0)) >= 5, 120, "the clients to start training")
        pids = json.loads((tmp_path / "pids.json").read_text())["clients"]
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=60) == 130
        for pid in pids.values():
            wait_for(lambda pid=pid: _gone(pid), 30, f"client pid {pid} to exit")
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert summary["interrupted"] is True
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads signal masks from /proc")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_every_client_even_when_started_with_sigint_ignored(tmp_path, signum):
    # What a background job of a non-interactive shell inherits: SIGINT set to SIG_IGN.
    launcher = _launch(tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        wait_for(lambda: len(read_rounds(tmp_path, 0)) >= 5, 120, "the clients to start training")
        pids = json.loads((tmp_path / "pids.json").read_text())["clients"]
        assert not _ignores(launcher.pid, signal.SIGINT)
        # Clients get the default disposition back rather than the ignored one.
        assert not any(_ignores(pid, signal.SIGINT) for pid in pids.values())
        assert all(os.getsid(pid) == pid for pid in pids.values())  # each in its own session
        launcher.send_signal(signum)
        assert launcher.wait(timeout=60) == 130
        for pid in pids.values():
            wait_for(lambda pid=pid: _gone(pid), 30, f"client pid {pid} to exit")
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert summary["interrupted"] is True
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


@pytest.mark.slow
def test_clients_exit_when_the_launcher_dies(tmp_path):
    launcher = _launch(tmp_path)
    try:
        wait_for(lambda: len(read_rounds(tmp_path, 0)) >= 5, 120, "the clients to start training")
        pids = json.loads((tmp_path / "pids.json").read_text())["clients"]
        launcher.kill()
        launcher.wait()
        for pid in pids.values():
            wait_for(lambda pid=pid: _gone(pid), 30, f"orphaned client pid {pid} to exit")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
