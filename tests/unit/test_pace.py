"""Slow clients: train.speed and [peers.K] speed, and the pace a client keeps with them."""

import pytest

from dfedrw.peer.client import rounds
from dfedrw.peer.client.rounds import Pace
from dfedrw.peer.config.checks import ScenarioError
from dfedrw.peer.config.scenario import load_scenario, scenario_changes, scenario_from_dict, scenario_to_dict


class FakeTime:
    def __init__(self):
        self.now = 100.0
        self.slept = []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def test_a_client_at_speed_s_waits_out_1_over_s_minus_1_times_its_work(monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(rounds, "time", clock)
    pace = Pace(0.2)
    with pace.work():
        clock.now += 0.5  # the work took 0.5 s
    with pace.work():
        clock.now += 0.25
    assert clock.slept == [2.0, 1.0] and pace.waited == 3.0  # 5 times as long in all


def test_at_full_speed_nothing_is_timed_or_waited(monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(rounds, "time", clock)
    pace = Pace(1.0)
    with pace.work():
        clock.now += 1.0
    assert pace.extra == 0 and clock.slept == [] and pace.waited == 0


def test_speeds_load_per_client_and_round_trip():
    s = load_scenario(None, ["train.speed=0.5", "peers.3.speed=0.2", "peers.1.aggregation.rule=median"])
    assert (s.speed_of(3), s.speed_of(0), s.paced) == (0.2, 0.5, True)
    assert scenario_to_dict(s)["peers"] == {"1": {"aggregation": {"rule": "median"}}, "3": {"speed": 0.2}}
    assert scenario_from_dict(scenario_to_dict(s)) == s
    plain = load_scenario(None, [])
    assert not plain.paced and "peers" not in scenario_changes(plain)


@pytest.mark.parametrize("sets, words", [
    (["peers.3.speed=0"], "peers.3.speed=0.0 must be a finite number in (0, 1]"),
    (["peers.3.speed=2"], "peers.3.speed=2.0 must be a finite number in (0, 1]"),
    (["peers.12.speed=0.5"], "peers.12: no such client; ids are 0..11"),
    (["peers.3.pace=0.5"], "only an 'aggregation' table and 'speed' may be set per client"),
])
def test_bad_speeds_name_the_key(sets, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(None, sets)
    assert words in str(err.value)


def test_the_batched_engine_needs_simulated_compute_for_slow_clients(tmp_path):
    from dfedrw.engines.run import BatchedRun

    s = load_scenario(None, ["data.name=digits", "topology.byzantine=0", "attack.name=none", "peers.2.speed=0.5", "engine.name=batched"])
    with pytest.raises(ValueError, match="set clock.step_seconds"):
        BatchedRun(s, tmp_path)
    # With it, client 2 computes twice as long on the simulated clock.
    timed = load_scenario(None, ["data.name=digits", "topology.byzantine=0", "attack.name=none", "peers.2.speed=0.5", "engine.name=batched",
                                 "clock.step_seconds=0.1"])
    clock = BatchedRun(timed, tmp_path / "timed").network.clock
    assert clock.step_seconds[2] == 0.2 and clock.step_seconds[0] == 0.1


def test_a_speed_spread_draws_each_clients_speed_seeded_and_in_range():
    s = load_scenario(None, ["train.speed=0.8", "train.speed_spread=0.5", "peers.2.speed=0.1"])
    speeds = [s.speed_of(k) for k in range(s.num_clients)]
    assert s.paced and speeds[2] == 0.1
    others = [v for k, v in enumerate(speeds) if k != 2]
    assert all(0.4 <= v <= 0.8 for v in others) and len(set(others)) == len(others)
    # The same seed draws the same speeds; another seed others.
    assert [load_scenario(None, ["train.speed=0.8", "train.speed_spread=0.5"]).speed_of(k) for k in (0, 1)] == speeds[:2]
    assert load_scenario(None, ["seed=2", "train.speed=0.8", "train.speed_spread=0.5"]).speed_of(0) != speeds[0]
    # Over many clients the draws fill the range evenly.
    wide = load_scenario(None, ["topology.honest=400", "train.speed_spread=0.5"])
    draws = [wide.speed_of(k) for k in range(400)]
    assert min(draws) < 0.53 and max(draws) > 0.97 and abs(sum(draws) / 400 - 0.75) < 0.03
