"""The batched engine's simulated clock misses what real clients miss, on a profile where
timing decides nothing: four clients, each with one link each way that takes longer than the
deadline (so every client waits out the whole deadline every round and all stay in step) and
fast lossy links to the others (a model on them arrives long before the deadline or is lost).
Both engines draw the same losses from the same seeded links, so every receiver's ``missing``
list is the same, round by round. And a clocked batched run's rounds cost what the profile says.
"""

from __future__ import annotations

import pytest

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.results.records import read_final, read_rounds
from tests.support.runs import quiet_console

ROUNDS = 6
SLOW = ("0-2", "2-0", "1-3", "3-1")  # each client's one slow link each way
BASE = (
    "data.name=digits", "topology.honest=4", "topology.byzantine=0", "topology.kind=complete", "attack.name=none", f"rounds={ROUNDS}",
    "eval.every=0", "aggregation.rule=dfedavg", "links.loss=0.3", "network.round_timeout=0.5",
    *(f'links.pairs."{pair}".latency=3.0' for pair in SLOW),
    # Never presumed gone: each link carries one message a round in both engines.
    "network.max_missed_rounds=1000",
)


def missing_lists(out, clients):
    return {k: [r["missing"] for r in read_rounds(out, k)] for k in clients}


@pytest.mark.parametrize("transport", ["inproc", pytest.param("grpc", marks=pytest.mark.slow)])
def test_the_clock_misses_what_client_runs_miss(tmp_path, transport):
    clients = load_scenario(None, [*BASE, "engine.name=clients", f"network.transport={transport}"])
    batched = load_scenario(None, [*BASE, "engine.name=batched"])
    real_out, real = run_scenario(clients, tmp_path / "clients", console=quiet_console())
    sim_out, sim = run_scenario(batched, tmp_path / "batched", console=quiet_console())

    assert real["honest_completed"] == sim["honest_completed"] == 4
    expected = missing_lists(real_out, range(4))
    slow = {0: 2, 1: 3, 2: 0, 3: 1}
    assert all(slow[k] in m for k, ms in expected.items() for m in ms)
    assert sum(len(m) for ms in expected.values() for m in ms) > 4 * ROUNDS  # the fast links lost some too
    assert missing_lists(sim_out, range(4)) == expected


def test_a_clocked_batched_run_takes_the_rounds_the_profile_predicts(tmp_path):
    # Perfect but slow links: every round is the local steps, then the latency and the message's
    # transfer, then the aggregation; a client at speed 0.5 doubles its compute and every
    # neighbour waits for it.
    sc = load_scenario(None, [
        "data.name=digits", "topology.honest=4", "topology.byzantine=0", "attack.name=none", "topology.kind=complete", "rounds=3",
        "eval.every=0", "engine.name=batched", "links.latency=0.1", "links.bandwidth=1e6", "clock.step_seconds=0.2",
        "clock.aggregate_seconds=0.05", "peers.2.speed=0.5",
    ])
    out, summary = run_scenario(sc, tmp_path / "run", console=quiet_console())
    records = read_rounds(out, 0)
    size = records[0]["bytes_sent"] // 3  # one message to each of the 3 others
    # Client 2 sends at 0.4 s, its model arrives 0.1 s + size*8/1e6 later; the others aggregate
    # for 0.05 s then. The others' models reached client 2 before it sent: it aggregates (for
    # 0.1 s) at once.
    arrival = 0.4 + 0.1 + size * 8 / 1e6
    assert records[0]["seconds"] == pytest.approx(arrival + 0.05)
    assert read_rounds(out, 2)[0]["seconds"] == pytest.approx(0.4 + 0.1)
    assert summary["honest_mean_seconds"] == pytest.approx(sum(read_rounds(out, k)[-1]["seconds"] for k in range(4)) / 4)
    assert all(r["missing"] == [] for k in range(4) for r in read_rounds(out, k))
    # Each link's bytes in the final record: the records' bytes, one message a round per link.
    final = read_final(out, 0)
    assert final["bytes_to"] == {str(j): 3 * size for j in (1, 2, 3)} and final["links"] == {"lost": 0}
