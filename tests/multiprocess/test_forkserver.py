"""Client processes forked by the fork server (launch.forkserver), seen as the launcher sees them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import zmq

from dfedrw.launch.forkserver import ForkServer, fork_available
from dfedrw.launch.local import LocalRun
from dfedrw.peer.config.scenario import dump_scenario
from tests.support.runs import quiet_console, wait_for
from tests.support.parity import differences

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not fork_available(), reason="no os.fork here")]


@pytest.fixture
def server(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    s = ForkServer(sys.executable, env, log=tmp_path / "fork-server.log")
    yield s
    s.close()


@pytest.fixture
def silent_launcher():
    """A launcher endpoint that takes registrations and never answers: a client waits there."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    yield sock.getsockopt_string(zmq.LAST_ENDPOINT)
    sock.close()
    ctx.term()


def _waiting_client(server, small_scenario, tmp_path, endpoint):
    scenario = small_scenario("network.connect_timeout=120", "network.tls=off")
    dump_scenario(scenario, tmp_path / "scenario.toml")
    argv = ["--scenario", str(tmp_path / "scenario.toml"), "--id", "0", "--rendezvous", endpoint, "--out", str(tmp_path / "out")]
    env = {**os.environ, "DFEDRW_PARENT_PID": str(server.pid), "DFEDRW_LINK_TOKEN": "x" * 32}
    return server.start(argv, env, tmp_path / "client.log")


def test_a_forked_client_reports_its_exit_code_and_writes_its_log(server, tmp_path):
    # Execute
    proc = server.start(["--scenario", str(tmp_path / "missing.toml"), "--id", "0", "--rendezvous", "tcp://127.0.0.1:9"], dict(os.environ), tmp_path / "c.log")
    code = proc.wait(timeout=60)

    # Assert
    assert code == 2 and proc.returncode == 2 and proc.pid != server.pid
    assert "missing.toml" in (tmp_path / "c.log").read_text()


@pytest.mark.parametrize(("stop", "code"), [("kill", -signal.SIGKILL), ("terminate", -signal.SIGTERM)])
def test_a_forked_client_is_stopped_like_a_popen(server, small_scenario, tmp_path, silent_launcher, stop, code):
    # Prepare
    proc = _waiting_client(server, small_scenario, tmp_path, silent_launcher)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=1.0)
    assert proc.poll() is None

    # Execute
    getattr(proc, stop)()

    # Assert
    assert proc.wait(timeout=60) == code


def test_closing_the_server_ends_the_clients_it_forked(server, small_scenario, tmp_path, silent_launcher):
    # Prepare
    proc = _waiting_client(server, small_scenario, tmp_path, silent_launcher)

    # Execute
    server.close()

    # Assert: the server stopped it (SIGTERM) before exiting, and said so
    assert server.proc.returncode == 0
    assert server.exits[proc.pid] == -signal.SIGTERM


def test_a_malformed_request_is_refused_and_the_server_goes_on(server, tmp_path):
    # Prepare
    server.proc.stdin.write(b'{"tag": 99, "argv": "not a list"}\n')
    server.proc.stdin.flush()

    # Execute
    proc = server.start(["--scenario", str(tmp_path / "missing.toml"), "--id", "0", "--rendezvous", "tcp://127.0.0.1:9"], dict(os.environ), tmp_path / "c.log")

    # Assert
    assert proc.wait(timeout=60) == 2
    wait_for(lambda: 99 in server._started, 10, "the refusal")
    assert "error" in server._started[99]


def test_forked_and_spawned_clients_compute_the_same_run(small_scenario, tmp_path):
    # Prepare
    scenario = small_scenario("rounds=15", "eval.every=5", "network.round_timeout=30", "attack.name=gaussian")
    timing = ("bytes_", "loop_", "wall_seconds", "pid", "address", "seconds")

    def figures(out):
        kept = {}
        for f in sorted((out / "peers").iterdir()):
            lines = [json.loads(x) for x in f.read_text().splitlines()] if f.suffix == ".jsonl" else [json.loads(f.read_text())]
            kept[f.name] = [{k: v for k, v in r.items() if not k.startswith(timing)} for r in lines]
        return kept

    # Execute
    summaries = {start: LocalRun(scenario, tmp_path / start, console=quiet_console(), start=start).run() for start in ("fork", "spawn")}

    # Assert
    assert all(s["failed_peers"] == [] for s in summaries.values())
    assert figures(tmp_path / "fork") == figures(tmp_path / "spawn")
    assert summaries["fork"]["honest_mean_accuracy"] == summaries["spawn"]["honest_mean_accuracy"]


def _batch_requests(small_scenario, tmp_path, name, *overrides):
    """Two small scenarios of the batched engine (seeds 1 and 2) as ``--run REQUEST OUT`` pairs."""
    argv = []
    for seed in (1, 2):
        request = tmp_path / f"{name}-{seed}.toml"
        dump_scenario(small_scenario("engine.name=batched", "attack.name=gaussian", f"seed={seed}", *overrides), request)
        argv += ["--run", str(request), str(tmp_path / name / str(seed))]
    return argv


def test_a_forked_batch_computes_what_a_new_process_computes(small_scenario, tmp_path):
    # Prepare
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    server = ForkServer(sys.executable, env, entry="batched")

    # Execute
    try:
        forked = server.start(_batch_requests(small_scenario, tmp_path, "fork", "eval.every=5"), env, tmp_path / "fork.log")
        assert forked.wait(timeout=300) == 0
    finally:
        server.close()
    spawned = subprocess.run(
        [sys.executable, "-m", "dfedrw.launch.batched_engine", *_batch_requests(small_scenario, tmp_path, "spawn", "eval.every=5")],
        env=env, capture_output=True, text=True, timeout=300,
    )

    # Assert
    assert spawned.returncode == 0, spawned.stderr
    assert "2 runs as one batch" in (tmp_path / "fork.log").read_text()
    for seed in ("1", "2"):
        assert differences(tmp_path / "fork" / seed, tmp_path / "spawn" / seed) == [], seed


def test_a_forked_batch_stops_on_sigint_like_a_new_process(small_scenario, tmp_path):
    # Prepare: a batch long enough to be stopped while it runs
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    server = ForkServer(sys.executable, env, entry="batched")
    try:
        proc = server.start(_batch_requests(small_scenario, tmp_path, "b", "rounds=100000"), env, tmp_path / "b.log")
        log = tmp_path / "b.log"
        wait_for(lambda: log.exists() and "runs as one batch" in log.read_text(), 120, "the batch to begin")

        # Execute
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        server.close()

    # Assert: it stopped as `python -m dfedrw.launch.batched_engine` does, its runs unfinished
    assert code == 130
    assert "interrupted" in (tmp_path / "b.log").read_text()
    for seed in ("1", "2"):
        summary = tmp_path / "b" / seed / "summary.json"
        assert not summary.exists() or json.loads(summary.read_text())["interrupted"]
