"""Colluding Byzantine clients as real processes over gRPC with mutual TLS (loopback only).

5 honest + 2 Byzantine client processes started by the launcher (``dfedrw run``), each with its
own certificate from the run's CA, ``attack.colluding = true``. The two colluders are not graph
neighbours here: each reaches the other through the launcher's address book and the other's
server admits it as a colluder (the sender is the id in its certificate).

* Both colluders pool in every round (their records say ``pooled_from`` = both), nothing is
  rejected or refused, and every record equals the in-process run's (the transports carry the
  same bytes through the same checks; no deadline is missed, so nothing depends on timing).
* One colluder process is killed mid-run (by the PID the launcher reports in ``pids.json``):
  the other goes on to the last round, pooling with itself only from then on, and every honest
  client completes.
"""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from dfedrw.launch.local import LocalRun
from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.wiring.plan import scenario_topology
from dfedrw.peer.results.records import read_final, read_rounds
from tests.support.runs import quiet_console, wait_for

pytestmark = pytest.mark.slow

BASE = (
    "data.name=digits",
    "topology.honest=5",
    "topology.byzantine=2",
    "train.lr=0.1",
    "attack.name=alie",
    "attack.colluding=true",
    "aggregation.rule=trimmed_mean",
    "network.tls=mutual",
)


def scenario(*overrides: str):
    return load_scenario(None, [*BASE, *overrides])


def colluders_of(sc) -> list[int]:
    return sorted(scenario_topology(sc).byzantine)


def test_the_colluders_are_not_neighbours():
    # The runs below then show colluders reaching each other beyond the graph.
    sc = scenario()
    b, c = colluders_of(sc)
    assert c not in scenario_topology(sc).neighbours(b)


def test_colluder_processes_pool_every_round_and_match_the_inproc_run(tmp_path):
    # Prepare
    overrides = ("rounds=30", "eval.every=10", "network.round_timeout=30")
    quiet = quiet_console()

    # Execute
    _, inproc = run_scenario(scenario(*overrides, "network.transport=inproc"), tmp_path / "inproc", console=quiet)
    _, grpc = run_scenario(scenario(*overrides, "network.transport=grpc"), tmp_path / "grpc", console=quiet)

    # Assert: real processes, mutual TLS, nothing failed, rejected or refused.
    assert inproc["failed_peers"] == grpc["failed_peers"] == []
    pids = [p["pid"] for p in grpc["peers"].values()]
    assert len(set(pids)) == 7 and os.getpid() not in pids
    colluders = colluders_of(scenario())
    for k in range(7):
        final = read_final(tmp_path / "grpc", k)
        assert final["tls"] == "mutual"
        assert final["rejected_by_reason"] == {} and final["refused_calls_by_reason"] == {}, (k, final)

    # Assert: each colluder pooled with the other in every round.
    for b in colluders:
        records = read_rounds(tmp_path / "grpc", b)
        assert [r["pooled_from"] for r in records] == [colluders] * 30

    # Assert: every record as in the in-process run (byte counts aside: framing differs; and the
    # seconds each round ended at, wall time).
    for k in range(7):
        a, g = read_rounds(tmp_path / "inproc", k), read_rounds(tmp_path / "grpc", k)
        assert len(a) == len(g) == 30
        for x, y in zip(a, g, strict=True):
            x, y = dict(x), dict(y)
            for key in ("bytes_sent", "bytes_received", "seconds"):
                x.pop(key, None), y.pop(key, None)
            # Weights are logged rounded to 6 decimals: equal computations agree to the bit.
            wx, wy = x.pop("weights"), y.pop("weights")
            assert wx.keys() == wy.keys() and all(abs(wx[s] - wy[s]) <= 1e-9 for s in wx), (k, wx, wy)
            assert x == y, (k, x, y)
        pa, pg = inproc["peers"][str(k)], grpc["peers"][str(k)]
        assert (pa["accuracy"], pa["global_accuracy"]) == (pg["accuracy"], pg["global_accuracy"])
    assert inproc["honest_mean_accuracy"] == grpc["honest_mean_accuracy"]


def test_a_killed_colluder_does_not_stop_the_other(tmp_path):
    # Prepare: enough rounds that the kill lands mid-run. The clients learn at once that the
    # dead process is unreachable (its connections are refused), so the deadline is seldom
    # waited out; 10 s keeps a loaded machine from missing one before the kill.
    rounds = 300
    sc = scenario(f"rounds={rounds}", "eval.every=0", "network.round_timeout=10")
    victim, survivor = colluders_of(sc)
    run = LocalRun(sc, tmp_path, console=quiet_console())
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(run.run()), daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(read_rounds(tmp_path, victim)) >= 15, 180, f"colluder {victim} to attack 15 rounds")
        pid = json.loads((tmp_path / "pids.json").read_text())["clients"][str(victim)]

        # Execute
        os.kill(pid, signal.SIGKILL)
        killed_after = len(read_rounds(tmp_path, victim))
        thread.join(timeout=300)
        assert not thread.is_alive(), "the run hung after a colluder was killed"
    finally:
        run.stop_all()

    # Assert: the victim died mid-run; everyone else completed every round.
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed_peers"] == [victim]
    assert summary["peers"][str(victim)]["exit_code"] == -signal.SIGKILL
    assert summary["peers"][str(victim)]["rounds_done"] < rounds
    assert all(p["completed"] and p["rounds_done"] == rounds for k, p in summary["peers"].items() if int(k) != victim)

    # Assert: the survivor pooled with the victim before the kill, with itself only at the end.
    pooled = [r["pooled_from"] for r in read_rounds(tmp_path, survivor)]
    assert len(pooled) == rounds
    assert pooled[: killed_after - 1] == [[victim, survivor]] * (killed_after - 1)
    assert pooled[-20:] == [[survivor]] * 20
