"""A run of the client engine writes its compact record with its summary."""

import io
import json

from rich.console import Console

from dfedrw.experiments.record import write_record
from dfedrw.launch.inproc import run_inproc


def test_an_inproc_run_writes_the_record_a_rebuild_from_its_round_logs_gives(small_scenario, tmp_path):
    scenario = small_scenario("topology.honest=3", "topology.byzantine=1", "attack.name=sign_flip", "rounds=6", "eval.every=3")
    summary = run_inproc(scenario, tmp_path, console=Console(file=io.StringIO()))
    assert summary["failed_peers"] == []
    written = (tmp_path / "record.json").read_bytes()
    assert [r for r, _ in json.loads(written)["curves"]["accuracy"]] == [2, 5]
    (tmp_path / "record.json").unlink()
    write_record(tmp_path)
    assert (tmp_path / "record.json").read_bytes() == written
