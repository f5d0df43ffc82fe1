"""examples/plugins: an outside attack and CRS, named by import path, run in-process."""

import json
import os
from pathlib import Path

from rich.console import Console

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario

PLUGINS = Path(__file__).resolve().parents[2] / "examples" / "plugins"


def test_outside_attack_and_crs_are_used(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))  # what PYTHONPATH=examples/plugins does for `dfedrw run`
    scenario = load_scenario(PLUGINS / "scenario.toml", ["rounds=4", "network.transport=inproc", "eval.every=0"])
    _, summary = run_scenario(scenario, tmp_path, console=Console(file=open(os.devnull, "w")))
    assert summary["failed_peers"] == []

    import mylab_plugins

    roles = {int(k): v["role"] for k, v in summary["peers"].items()}
    byzantine = [k for k, role in roles.items() if role == "byzantine"]
    assert len(byzantine) == 2
    for k in byzantine:
        record = json.loads((tmp_path / "peers" / f"{k}.json").read_text())
        assert record["attack"] == "mylab_plugins:ScaledMean"

    from dfedrw.peer.wiring.build import build_attack, build_client_rule

    assert build_attack(scenario, 10, 2) == mylab_plugins.ScaledMean(factor=-3.0, noise=0.5)
    assert build_client_rule(scenario, 0, 1, 0.01, 0).crs == mylab_plugins.LowestK(k=3)
    rounds = 0
    for k, role in roles.items():
        if role != "honest":
            continue
        for line in (tmp_path / "peers" / f"{k}.jsonl").read_text().splitlines():
            weights = json.loads(line).get("weights") or {}
            if not weights:
                continue
            rounds += 1
            used = [w for w in weights.values() if w > 0]
            # LowestK: at most k = 3 candidates, equal shares.
            assert len(used) <= 3 and max(used) - min(used) < 1e-5, weights
            # The scaled-mean models (factor -3) lose: the attackers never get weight.
            assert all(weights.get(str(b), 0.0) == 0.0 for b in byzantine)
    assert rounds > 0
