"""A batch of runs: several scenarios' clients as rows of one batched engine, each run's results
as if it had run alone.

The parity cases of ``test_engine_parity.py`` (every rule, every attack, both partitions,
colluding and silent attackers, other graph sizes) run alone and then all together; every
per-round record and every client's final file must be byte for byte the same, and the
summaries equal but for the clock and process ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfedrw.engines.together import batch_key, run_together

from dfedrw.launch.batched_engine import run_many
from dfedrw.engines.run import BatchedRun
from dfedrw.peer.config.scenario import dump_scenario
from tests.support.runs import quiet_console
from tests.support.parity import BY_ID, CASES, DIR, differences, make_case, scenario

SOME = [
    BY_ID[i]
    for i in (
        "lossclip-gaussian-iid", "dfedavg-gaussian-dirichlet", "softmax-none-dirichlet", "krum-signflip-dirichlet",
        "lossclip-decoystealth-iid", "balance-alie-colluding-dirichlet", "dfedavg-omission-dirichlet", "ubar-ipm-iid",
    )
] + [make_case("qfdfl-gaussian-dirichlet", ("aggregation.rule=qfdfl", "aggregation.q=0.1"), "gaussian", 1, DIR)]


def _run_alone_and_together(cases, rounds: int, tmp_path: Path) -> list[str]:
    for case in cases:
        run_together([BatchedRun(scenario(case, "batched", rounds), tmp_path / "alone" / case.id)])
    groups: dict[object, list] = {}  # runs of one batch share the training settings
    for case in cases:
        groups.setdefault(batch_key(scenario(case, "batched", rounds)), []).append(case)
    for group in groups.values():
        run_together([BatchedRun(scenario(case, "batched", rounds), tmp_path / "together" / case.id) for case in group])
    return [f"{case.id}: {p}" for case in cases for p in differences(tmp_path / "alone" / case.id, tmp_path / "together" / case.id)]


def test_runs_in_a_batch_give_what_each_gives_alone(tmp_path):
    assert _run_alone_and_together(SOME, 25, tmp_path) == []


@pytest.mark.slow
def test_every_parity_case_in_one_batch_gives_what_each_gives_alone(tmp_path):
    keys = {batch_key(scenario(case, "batched", 60)) for case in CASES}
    assert len(keys) < len(CASES) / 4  # nearly all of them share one batch
    assert _run_alone_and_together(CASES, 60, tmp_path) == []


# The network costs study's links and clock (examples/grids/studies/network_costs_fmnist.toml):
# under a compression each receiver aggregates rebuilt models, per link (topk) or per sender (int8).
CLOCKED = (
    "links.generator=distance", "links.latency=0.02", "links.latency_per_unit=0.2", "links.jitter=0.005", "links.bandwidth=2e6",
    "peers.2.speed=0.2", "peers.3.speed=0.2", "clock.step_seconds=0.05", "clock.aggregate_seconds=0.01", "network.round_timeout=1.0",
)


@pytest.mark.parametrize("compression", ["int8", "topk"])
def test_compressed_runs_on_the_clock_in_a_batch_give_what_each_gives_alone(tmp_path, compression):
    cases = [SOME[0], SOME[1], SOME[2]]
    sets = [(*CLOCKED, f"network.compression={compression}"), CLOCKED, (*CLOCKED, f"network.compression={compression}", "seed=44")]
    rounds = 30
    for case, extra in zip(cases, sets, strict=True):
        run_together([BatchedRun(scenario(case, "batched", rounds, *extra), tmp_path / "alone" / case.id)])
    run_together([BatchedRun(scenario(case, "batched", rounds, *extra), tmp_path / "together" / case.id) for case, extra in zip(cases, sets, strict=True)])
    assert [f"{c.id}: {p}" for c in cases for p in differences(tmp_path / "alone" / c.id, tmp_path / "together" / c.id)] == []


def test_the_comparison_sees_a_run_that_drifted(tmp_path):
    # The check above must be able to fail: the same case with another seed differs.
    case = SOME[0]
    run_together([BatchedRun(scenario(case, "batched", 5), tmp_path / "a")])
    run_together([BatchedRun(scenario(case, "batched", 5, "seed=99"), tmp_path / "b")])
    assert any("jsonl differs" in p for p in differences(tmp_path / "a", tmp_path / "b"))


def test_a_batch_refuses_runs_of_another_shape(tmp_path):
    case = SOME[0]
    runs = [BatchedRun(scenario(case, "batched", 3), tmp_path / "a"), BatchedRun(scenario(case, "batched", 4), tmp_path / "b")]
    assert batch_key(runs[0].scenario) != batch_key(runs[1].scenario)
    with pytest.raises(ValueError, match="must share the model, training, rounds"):
        run_together(runs)


def test_run_many_runs_scenario_files_into_their_folders(tmp_path):
    # What a sweep starts: scenario files and results folders, one batch.
    jobs = []
    for case in SOME[:3]:
        request = tmp_path / f"{case.id}.toml"
        dump_scenario(scenario(case, "batched", 4), request)
        jobs.append((request, tmp_path / "out" / case.id))
    summaries = run_many(jobs, console=quiet_console())
    assert [s["rounds"] for s in summaries] == [4, 4, 4]
    for case, (_, out) in zip(SOME[:3], jobs, strict=True):
        run_together([BatchedRun(scenario(case, "batched", 4), tmp_path / "alone" / case.id)])
        assert differences(tmp_path / "alone" / case.id, out) == []


def test_run_many_refuses_a_scenario_of_the_clients_engine(tmp_path):
    request = tmp_path / "clients.toml"
    dump_scenario(scenario(SOME[0], "threads", 3), request)
    with pytest.raises(ValueError, match="needs the batched engine"):
        run_many([(request, tmp_path / "out")], console=quiet_console())
