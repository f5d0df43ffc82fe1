"""Checkpoints in a whole in-process run (clients as threads of this process)."""


def test_inproc_run_leaves_no_checkpoint(small_scenario, tmp_path):
    import io

    from rich.console import Console

    from dfedrw.launch.inproc import run_inproc

    scenario = small_scenario("topology.kind=ring", "topology.honest=3", "topology.byzantine=0", "rounds=12", "checkpoint.every=5")
    summary = run_inproc(scenario, tmp_path, console=Console(file=io.StringIO()))
    assert summary["failed_peers"] == [] and summary["restarted_peers"] == []
    assert not list((tmp_path / "peers").glob("*.ckpt.npz*"))
