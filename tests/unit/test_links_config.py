"""The [links] section: its settings, per-pair overrides, errors, and that a scenario without it
is written and identified as before."""

import pytest

from dfedrw.peer.config.checks import ScenarioError
from dfedrw.peer.config.scenario import load_scenario, scenario_changes, scenario_from_dict, scenario_to_dict


def test_defaults_emulate_nothing_and_leave_the_scenario_as_it_was():
    s = load_scenario(None, [])
    assert not s.links.emulates
    assert "links" not in scenario_to_dict(s) and "links" not in scenario_changes(s)


def test_settings_and_pairs_load_and_round_trip():
    s = load_scenario(None, [
        "links.latency=0.05", "links.bandwidth=10e6", 'links.pairs."3-1".loss=0.1', 'links.pairs."0-1".latency=0.2',
    ])
    assert (s.links.latency, s.links.bandwidth, s.links.loss) == (0.05, 10e6, 0.0)
    # Sorted by (sender, receiver): the same scenario whatever order the pairs were given in.
    assert s.links.pairs == (((0, 1), (("latency", 0.2),)), ((3, 1), (("loss", 0.1),)))
    assert s.links.emulates
    table = scenario_to_dict(s)["links"]
    assert table["pairs"] == {"0-1": {"latency": 0.2}, "3-1": {"loss": 0.1}}
    assert scenario_from_dict(scenario_to_dict(s)) == s
    assert scenario_changes(s)["links"]["latency"] == 0.05


def test_links_set_to_nothing_are_the_scenario_without_them():
    # Zero latency, unlimited bandwidth, no loss: the same scenario, so the same run and folder.
    zero = load_scenario(None, ["links.latency=0", "links.jitter=0", "links.bandwidth=0", "links.loss=0"])
    assert zero == load_scenario(None, []) and not zero.links.emulates


def test_a_pair_alone_emulates():
    assert load_scenario(None, ['links.pairs."0-1".latency=0.01']).links.emulates
    assert not load_scenario(None, ['links.pairs."0-1".latency=0.0']).links.emulates


@pytest.mark.parametrize("sets, words", [
    (['links.pairs."0-0".latency=1'], "a link joins two different clients"),
    (['links.pairs."a-1".latency=1'], 'expected "I-J"'),
    (['links.pairs."0-1".delay=1'], "unknown key 'links.pairs.\"0-1\".delay'; valid keys: latency, jitter, bandwidth, loss"),
    (['links.pairs."0-1".loss=1.0'], 'links.pairs."0-1".loss=1.0 must be a finite number in [0, 1)'),
    (['links.pairs."0-12".latency=1'], 'links.pairs."0-12": no such client; ids are 0..11'),
    (["links.latency_per_unit=0.1"], 'read only by links.generator = "distance"'),
    (["links.generator=ring"], "choose one of: none, distance"),
])
def test_bad_links_name_the_key(sets, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(None, sets)
    assert words in str(err.value)


def test_the_batched_engine_keeps_a_clock_only_when_time_matters(tmp_path):
    from dfedrw.engines.run import BatchedRun

    base = ["data.name=digits", "topology.byzantine=0", "attack.name=none", "engine.name=batched"]
    assert BatchedRun(load_scenario(None, [*base, "links.latency=0.01"]), tmp_path / "a").network.clock is not None
    assert BatchedRun(load_scenario(None, [*base, "clock.step_seconds=0.01"]), tmp_path / "b").network.clock is not None
    assert BatchedRun(load_scenario(None, base), tmp_path / "c").network.clock is None


def test_link_profiles_take_the_generator_then_each_pair_over_it():
    from dfedrw.peer.wiring.build import link_profiles

    s = load_scenario(None, [
        "links.latency=0.01", "links.generator=distance", "links.latency_per_unit=0.1", 'links.pairs."0-1".bandwidth=1e6',
    ])
    default, own = link_profiles(s)
    assert (default.latency, default.bandwidth) == (0.01, 0.0)
    n = s.num_clients
    assert len(own) == n * (n - 1)
    # The pair keeps the distance latency of its link and gains its own bandwidth.
    assert own[0, 1].bandwidth == 1e6 and own[0, 1].latency == own[1, 0].latency > 0.01
    assert own[1, 0].bandwidth == 0.0


def test_with_links_wraps_a_transport_only_when_links_emulate_something():
    from dfedrw.peer.transport.links import EmulatedLinks
    from dfedrw.peer.wiring.build import client_links, with_links

    class Inner:
        bytes_sent = dropped = skipped_stale = 0
        identity = "its own"

        def close(self):
            pass

    inner = Inner()
    assert with_links(load_scenario(None, []), 0, inner) is inner
    s = load_scenario(None, ["links.latency=0.02", 'links.pairs."3-4".loss=0.5'])
    wrapped = with_links(s, 3, inner)
    try:
        assert isinstance(wrapped, EmulatedLinks) and wrapped.identity == "its own"  # the rest is the inner's
        schedules = client_links(s, 3)
        assert sorted(schedules) == [k for k in range(s.num_clients) if k != 3]
        assert schedules[4].profile.loss == 0.5 and schedules[5].profile.loss == 0.0 and schedules[5].profile.latency == 0.02
    finally:
        wrapped.close()


def test_the_clock_section_is_written_only_when_set():
    plain = load_scenario(None, [])
    assert "clock" not in scenario_to_dict(plain) and "clock" not in scenario_changes(plain) and not plain.clocked
    s = load_scenario(None, ["clock.step_seconds=0.2", "clock.aggregate_seconds=0.05"])
    assert scenario_to_dict(s)["clock"] == {"step_seconds": 0.2, "aggregate_seconds": 0.05}
    assert scenario_from_dict(scenario_to_dict(s)) == s and s.clocked
    with pytest.raises(ScenarioError, match="clock.step_seconds"):
        load_scenario(None, ["clock.step_seconds=-1"])
