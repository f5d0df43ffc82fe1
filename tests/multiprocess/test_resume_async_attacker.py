"""A Byzantine client under asynchronous gossip, killed mid-run and started again with the same
command, goes on from its checkpoint: real client processes on loopback with mutual TLS."""

from __future__ import annotations

import signal

import pytest

from dfedrw.peer.config.scenario import dump_scenario, load_scenario
from dfedrw.peer.results.collect import collect_summary
from dfedrw.peer.results.records import read_final, read_rounds
from dfedrw.peer.transport.identity import make_certificates
from dfedrw.peer.wiring.plan import scenario_topology
from tests.support.runs import wait_for
from tests.support.scripts import load_bench

N = 5
STEPS = 1200
KILL_AT = 200
RUN_LIMIT = 300.0
SCENARIO = [
    "topology.kind=complete", "topology.honest=4", "topology.byzantine=1", "attack.name=gaussian", f"rounds={STEPS}",
    "network.protocol=async", "train.lr=0.2", "network.round_timeout=2", "checkpoint.every=20", "eval.every=100",
]


@pytest.mark.slow
@pytest.mark.timeout(RUN_LIMIT + 120)
def test_a_killed_attacker_under_gossip_resumes_from_its_checkpoint(tmp_path):
    # Prepare: 4 honest clients and one Gaussian attacker, gossiping 1,200 steps as processes
    scenario = load_scenario(None, SCENARIO)
    (bad,) = scenario_topology(scenario).byzantine
    honest = [k for k in range(N) if k != bad]
    certs = tmp_path / "certs"
    make_certificates(N, certs)
    dump_scenario(scenario, tmp_path / "scenario.toml")
    processes = load_bench("soak").Processes(tmp_path, tmp_path / "scenario.toml", certs, N)
    ckpt = tmp_path / "peers" / f"{bad}.ckpt.npz"

    def newest() -> int:
        records = read_rounds(tmp_path, bad)
        return max((r["round"] for r in records), default=-1)

    # Execute: kill the attacker once it answered past step 200 and holds a checkpoint, and
    # start it again at once (the honest clients never wait for it)
    try:
        for k in range(N):
            processes.start(k)
        wait_for(lambda: newest() >= KILL_AT and ckpt.exists(), 120, f"client {bad} to answer past step {KILL_AT}", step=0.05)
        processes.procs[bad].send_signal(signal.SIGKILL)
        processes.procs[bad].wait(timeout=10)
        killed_at = newest()
        processes.start(bad)
        wait_for(lambda: not processes.running(), RUN_LIMIT, "every client to finish")
        codes = processes.exit_codes()
    finally:
        processes.stop_all()

    # Assert: every process ended well; the attacker resumed from a checkpoint taken before it
    # was killed, its log going on from it (not started over), and answered each honest
    # neighbour's last step
    assert codes == {k: 0 for k in range(N)}
    final = read_final(tmp_path, bad)
    assert final["restarts"] == 1 and len(final["resumed_from"]) == 1
    resumed = final["resumed_from"][0]
    assert 0 <= resumed["checkpoint_round"] <= killed_at
    records = read_rounds(tmp_path, bad)
    labels = [r["round"] for r in records]
    assert min(labels) <= resumed["checkpoint_round"] < max(labels)
    last = {}
    for r in records:
        last.update({int(k): v for k, v in r["answered"].items()})
    assert last == {k: STEPS - 1 for k in honest}
    summary = collect_summary(tmp_path, scenario, exit_codes=codes)
    assert summary["restarted_peers"] == [bad] and summary["failed_peers"] == []
    assert not ckpt.exists()  # done: nothing left to resume
