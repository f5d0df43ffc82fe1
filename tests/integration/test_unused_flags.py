"""Flags a run does not use are named as unused, not taken in silence."""

import io

from rich.console import Console

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario


def test_certificates_given_to_an_engine_that_holds_none_are_named_as_unused(tmp_path):
    # Prepare
    scenario = load_scenario(None, ["engine.name=batched", "rounds=1", "eval.every=0", "topology.byzantine=0", "attack.name=none"])
    output = io.StringIO()

    # Execute
    _, summary = run_scenario(scenario, tmp_path / "out", console=Console(file=output, width=200), certs=tmp_path / "certs")

    # Assert
    assert summary["failed_peers"] == [] and f"--certs {tmp_path / 'certs'} is not used: the batched engine holds no certificates" in output.getvalue()
