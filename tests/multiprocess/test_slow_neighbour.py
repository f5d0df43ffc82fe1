"""A neighbour that stops for several deadlines is slow, not dead: its neighbours stop waiting
for it, yet never run more than ``network.round_window`` rounds ahead of it (the lead bound),
wait for it again once they hear from it, and nobody is shut out. Real client processes over
mutual TLS, started by hand with static addresses (bench/soak.py's ``Processes``); what is
asserted is what each process wrote: its round records' times and weights, its final record."""

from __future__ import annotations

import signal
import time

import pytest

from dfedrw.peer.config.scenario import dump_scenario, load_scenario
from dfedrw.peer.results.records import read_final, read_rounds
from dfedrw.peer.transport.identity import make_certificates
from tests.multiprocess.test_resume import _longest_run
from tests.support.runs import wait_for
from tests.support.scripts import load_bench

N = 4
VICTIM = 2
NEIGHBOURS = (1, 3)  # on the ring; client 0 is the neighbour of both
STOP_AT = 60
TIMEOUT = 1.0
STOPPED = 6.0  # seconds: six deadlines
WINDOW = 2
SCENARIO = [
    "topology.kind=ring", f"topology.honest={N}", "topology.byzantine=0", "attack.name=none", "rounds=400", "train.lr=0.2",
    f"network.round_timeout={TIMEOUT}", "network.max_missed_rounds=2", f"network.round_window={WINDOW}", "network.stall_timeout=120",
    "eval.every=100", "checkpoint.every=0",
]


def ends(out, k: int) -> dict[int, float]:
    """Round -> when client ``k`` ended it (Unix seconds: its loop's start plus the record's seconds)."""
    start = read_final(out, k)["loop_started_at"]
    return {r["round"]: start + r["seconds"] for r in read_rounds(out, k)}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stopped_neighbour_is_waited_for_again_and_nobody_runs_more_than_the_window_ahead_of_it(tmp_path):
    soak = load_bench("soak")
    scenario = load_scenario(None, SCENARIO)
    make_certificates(N, tmp_path / "certs")
    dump_scenario(scenario, tmp_path / "scenario.toml")
    procs = soak.Processes(tmp_path, tmp_path / "scenario.toml", tmp_path / "certs", N)
    try:
        for k in range(N):
            procs.start(k)
        wait_for(lambda: soak.last_round(tmp_path, VICTIM) >= STOP_AT, 120, f"client {VICTIM} to pass round {STOP_AT}", step=0.02)
        procs.procs[VICTIM].send_signal(signal.SIGSTOP)
        time.sleep(STOPPED)
        procs.procs[VICTIM].send_signal(signal.SIGCONT)
        wait_for(lambda: not procs.running(), 400, "every client to finish")
        codes = procs.exit_codes()
    finally:
        procs.stop_all()
    assert codes == dict.fromkeys(range(N), 0)

    victim = ends(tmp_path, VICTIM)
    records = {k: read_rounds(tmp_path, k) for k in NEIGHBOURS}
    finals = {k: read_final(tmp_path, k) for k in range(N)}
    # The victim stood still: a gap of about STOPPED seconds between two of its rounds.
    gaps = sorted(victim.items())
    stop_round, longest = max(((r, victim[r + 1] - t) for r, t in gaps[:-1]), key=lambda x: x[1])
    assert longest >= STOPPED * 0.9

    for k in NEIGHBOURS:
        mine = ends(tmp_path, k)
        # They stopped waiting for it: its model missing in max_missed_rounds rounds in a row.
        missing = [r["round"] for r in records[k] if VICTIM in r["missing"]]
        assert len(missing) >= 2 and any(b == a + 1 for a, b in zip(missing, missing[1:]))
        # And were held back rather than run ahead: round r began only once the victim had
        # ended round r - WINDOW - 1 (whose successor's model, or its reply, told them where it was).
        assert finals[k]["held_back"]["rounds"] >= 1 and finals[k]["held_back"]["seconds"] >= 1.0
        for r, t in mine.items():
            if r - WINDOW - 1 in victim:
                assert victim[r - WINDOW - 1] < t, f"client {k} ended round {r} before client {VICTIM} ended round {r - WINDOW - 1}"
        # Waited for again once heard from: the victim's models are in its rounds after the stop.
        after = [r for r in records[k] if r["round"] > stop_round + WINDOW + 2]
        assert sum(str(VICTIM) in r["weights"] for r in after) >= 0.9 * len(after)
    # Nobody was shut out. Client 0, whose neighbours were both held back, stopped waiting for
    # them too, and ran alone for at most the window before the bound held it as well (a lone
    # round elsewhere, a deadline of 1 s missed on a machine whose cores are busy, is no run
    # ahead: the bound is on rounds alone in a row). On busy cores one more lone round in a row
    # was seen (rounds 63-65 of client 0, in one of eight loaded runs): the round in which it
    # missed its neighbours' deadline, before the window it may run ahead of them.
    for k, f in finals.items():
        assert "shut_out" not in f and "disconnected" not in f["refused_calls_by_reason"], (k, f["refused_calls_by_reason"])
    for k in range(N):
        alone = [r["round"] for r in read_rounds(tmp_path, k) if len(r["weights"]) <= 1]
        in_a_row = _longest_run(alone)
        assert in_a_row <= WINDOW + 1 and len(alone) <= 3 * WINDOW, (k, alone)
