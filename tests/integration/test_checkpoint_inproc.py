"""Checkpoints in a whole in-process run (clients as threads of this process)."""

import sys

from dfedrw.launch.inproc import run_inproc
from dfedrw.peer.client import checkpoint
from dfedrw.peer.client.checkpoint import checkpoint_path, load_checkpoint
from tests.support.runs import quiet_console


def record_saves(monkeypatch) -> list[tuple[int, int]]:
    """Every checkpoint a client saves, as (client, round), each read back from its file right
    after it was written (so the file was there, whole, at that moment)."""
    original = checkpoint.save_checkpoint
    saved: list[tuple[int, int]] = []

    def save_and_read_back(path, ckpt):
        original(path, ckpt)
        back = load_checkpoint(path, client=ckpt.client, scenario=ckpt.scenario, vector_size=None)
        saved.append((back.client, back.round))

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
