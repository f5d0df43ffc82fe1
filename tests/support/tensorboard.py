"""TensorBoard event files read back with TensorBoard's own loader, and checked against the
round logs of the run that wrote them."""

from __future__ import annotations

import numpy as np
import pytest


def read_scalars(folder) -> dict[str, dict[int, float]]:
    """The scalars of the TensorBoard event files in ``folder``, read back with TensorBoard's
    own loader: tag -> step -> value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def check_tensorboard(out, log_dir, scenario) -> None:
    """The event files under ``log_dir`` hold what the round logs of the run in ``out`` say:
    per honest client every record's train loss, accuracies, Byzantine weight share and weight
    per candidate at step = round, and per round their mean over the honest clients; no folder
    for a Byzantine client."""
    from dfedrw.peer.wiring.plan import scenario_topology
    from dfedrw.peer.results.records import read_rounds

    topology = scenario_topology(scenario)
    honest = [k for k in range(topology.num_clients) if k not in topology.byzantine]
    assert sorted(p.name for p in log_dir.iterdir()) == sorted([*(f"client-{k}" for k in honest), "honest-mean"])
    per_round: dict[int, dict[str, list[float]]] = {}
    for k in honest:
        records = read_rounds(out, k)
        assert len(records) == scenario.rounds
        expected: dict[str, dict[int, float]] = {}
        for rec in records:
            r = rec["round"]
            values = {"train_loss": rec["train_loss"], **{f"weight/{s}": w for s, w in rec["weights"].items()}}
            if topology.byzantine:
                values["byzantine_weight_share"] = sum(w for s, w in rec["weights"].items() if int(s) in topology.byzantine)
            for key in ("accuracy", "global_accuracy"):
                if key in rec:
                    values[key] = rec[key]
            for tag, v in values.items():
                expected.setdefault(tag, {})[r] = v
                if not tag.startswith("weight/"):
                    per_round.setdefault(r, {}).setdefault(tag, []).append(v)
        got = read_scalars(log_dir / f"client-{k}")
        assert got.keys() == expected.keys(), k
        for tag in expected:
            assert got[tag] == pytest.approx(expected[tag], rel=1e-6, abs=1e-7), (k, tag)
    mean: dict[str, dict[int, float]] = {}
    for r, tags in per_round.items():
        for tag, vs in tags.items():
            mean.setdefault(tag, {})[r] = float(np.mean(vs))
    got = read_scalars(log_dir / "honest-mean")
    assert got.keys() == mean.keys()
    for tag in mean:
        assert got[tag] == pytest.approx(mean[tag], rel=1e-6, abs=1e-7), tag
