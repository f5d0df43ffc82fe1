"""Checkpoints in a whole in-process run (clients as threads of this process)."""

import sys

from dfedrw.launch.inproc import run_inproc
from dfedrw.peer.client import checkpoint
from dfedrw.peer.client.checkpoint import checkpoint_path, load_checkpoint
from dfedrw.peer.results.records import read_rounds
from dfedrw.peer.round.records import checkpoint_due
from dfedrw.peer.wiring.plan import scenario_topology
from tests.support.runs import quiet_console


def record_saves(monkeypatch, counters: dict | None = None) -> list[tuple[int, int]]:
    """Every checkpoint a client saves, as (client, round), each read back from its file right
    after it was written (so the file was there, whole, at that moment); ``counters``, when
    given, gets each one's counters as read back, by (client, round)."""
    original = checkpoint.save_checkpoint
    saved: list[tuple[int, int]] = []

    def save_and_read_back(path, ckpt):
        original(path, ckpt)
        back = load_checkpoint(path, client=ckpt.client, scenario=ckpt.scenario, vector_size=None)
        saved.append((back.client, back.round))
        if counters is not None:
            counters[(back.client, back.round)] = back.counters

    # The function as the modules that call it hold it, wherever they import it from.
    holders = [m for name, m in list(sys.modules.items()) if name.startswith("dfedrw.") and getattr(m, "save_checkpoint", None) is original]
    assert holders
    for module in holders:
        monkeypatch.setattr(module, "save_checkpoint", save_and_read_back)
    return saved


def test_inproc_run_leaves_no_checkpoint(small_scenario, tmp_path, monkeypatch):
    # Prepare: 3 clients, 12 rounds, a checkpoint every 5 rounds: after rounds 4 and 9 (0-based)
    scenario = small_scenario("topology.kind=ring", "topology.honest=3", "topology.byzantine=0", "rounds=12", "checkpoint.every=5")
    saved = record_saves(monkeypatch)

    # Execute
    summary = run_inproc(scenario, tmp_path, console=quiet_console())

    # Assert: each client wrote both checkpoints during the run, and removed its file at the end
    assert summary["failed_peers"] == [] and summary["restarted_peers"] == []
    assert sorted(saved) == [(k, r) for k in range(3) for r in (4, 9)]
    assert not any(checkpoint_path(tmp_path, k).exists() for k in range(3))
    assert not list((tmp_path / "peers").glob("*.ckpt.npz*"))


def test_an_attacker_that_strikes_when_trusted_keeps_its_standing_in_its_checkpoints(small_scenario, tmp_path, monkeypatch):
    # Prepare: 4 honest clients and one attacker that reads its standing, a checkpoint every 5 rounds
    scenario = small_scenario(
        "topology.kind=complete", "topology.honest=4", "topology.byzantine=1", "rounds=15", "checkpoint.every=5",
        "attack.name=gaussian", "network.share_scores=true", "attack.strike=trusted", "attack.trusted_rounds=2",
    )
    (bad,) = scenario_topology(scenario).byzantine
    counters: dict = {}
    record_saves(monkeypatch, counters)

    # Execute
    summary = run_inproc(scenario, tmp_path, console=quiet_console())

    # Assert: after round r its checkpoint holds the run of trusted rounds it decides round r + 1
    # on (its record's trusted_for), and the last round it counted
    assert summary["failed_peers"] == []
    notes = {rec["round"]: rec["attack"] for rec in read_rounds(tmp_path, bad)}
    kept = {r: c["standing"] for (k, r), c in counters.items() if k == bad}
    assert sorted(kept) == [4, 9]
    for r, standing in kept.items():
        assert standing["streak"] == notes[r + 1]["trusted_for"] and standing["counted"] == r
    assert any(n.get("attacking", True) for n in notes.values()) and any(n["trusted_for"] for n in notes.values())


def test_an_attacker_under_asynchronous_gossip_checkpoints_whom_it_answered(small_scenario, tmp_path, monkeypatch):
    # Prepare: 3 honest clients and one attacker gossiping 12 steps, a checkpoint every 4 steps
    scenario = small_scenario(
        "topology.kind=complete", "topology.honest=3", "topology.byzantine=1", "rounds=12", "checkpoint.every=4",
        "attack.name=gaussian", "network.protocol=async",
    )
    (bad,) = scenario_topology(scenario).byzantine
    counters: dict = {}
    saved = record_saves(monkeypatch, counters)

    # Execute
    summary = run_inproc(scenario, tmp_path, console=quiet_console())

    # Assert: each checkpoint is labelled with the newest step it answered so far, and holds the
    # label it last answered each neighbour at, as its records up to that point say
    assert summary["failed_peers"] == []
    labels = [r for k, r in saved if k == bad]
    assert labels
    answered, newest, expected = {}, -1, {}
    for rec in read_rounds(tmp_path, bad):
        answered.update(rec["answered"])
        before, newest = newest, max(newest, rec["round"])
        if newest < 11 and any(checkpoint_due(t, 12, 4) for t in range(before + 1, newest + 1)):
            expected[newest] = dict(answered)
    assert sorted(expected) == labels
    for r in labels:
        assert counters[(bad, r)]["answered"] == expected[r]
    assert not checkpoint_path(tmp_path, bad).exists()  # deleted when it finished
