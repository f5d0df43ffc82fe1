"""What a rule keeps from one aggregation to the next (``Aggregate.memory``) comes back to it
in the client's next ``RoundInputs.memory`` in every engine and under both protocols: a rule
that counts its own aggregations in its memory, and reports the count as its score of its own
model, writes 1, 2, 3, ... into its round records."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.aggregation.inputs import Aggregate, RoundInputs
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.results.records import read_rounds
from tests.support.runs import quiet_console

STEPS = 6


@dataclass(frozen=True)
class CountingMean:
    """The mean of the candidates; its memory: how many times it aggregated, per client."""

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        count = (inputs.memory or {}).get(inputs.own_id, 0.0) + 1.0
        ids = inputs.ids
        return Aggregate(
            model=inputs.vectors.mean(dim=0), weights=dict.fromkeys(ids, 1.0 / len(ids)),
            scores=dict.fromkeys(ids, 0.0) | {inputs.own_id: count}, memory={inputs.own_id: count},
        )


@pytest.mark.parametrize("protocol", ["sync", "async"])
@pytest.mark.parametrize("engine", ["batched", "clients"])
def test_a_rules_memory_comes_back_to_it_every_round(tmp_path, engine, protocol):
    settings = [
        "data.name=digits", f"rounds={STEPS}", "eval.every=0", "topology.honest=4", "topology.byzantine=0", "attack.name=none",
        f"aggregation.rule={__name__}:CountingMean", f"engine.name={engine}", f"network.protocol={protocol}",
    ]
    if engine == "clients":
        settings.append("network.transport=inproc")
    if protocol == "async":
        settings.append("clock.step_seconds=1.0")
    out, summary = run_scenario(load_scenario(None, settings), tmp_path / "run", console=quiet_console())
    assert summary["honest_completed"] == 4
    for k in range(4):
        assert [r["scores"][str(k)] for r in read_rounds(out, k)] == [float(n) for n in range(1, STEPS + 1)]
