import pytest

from peer.config import ScenarioError, dump_scenario, load_scenario, parse_override, scenario_from_dict


def test_default_scenario_loads_with_paper_settings():
    s = load_scenario(None)
    assert (s.topology.honest, s.topology.byzantine, s.topology.rho) == (10, 2, 0.7)
    assert (s.train.lr, s.train.batch_size) == (0.01, 32)
    assert (s.aggregation.rule, s.aggregation.tpm, s.aggregation.crs) == ("dfedreweighting", "loss", "loss_clip_mean")
    assert s.attack.name == "gaussian"


def test_overrides_are_typed_by_toml_and_dotted():
    s = load_scenario(None, ["rounds=7", "train.lr=0.5", "data.partition=dirichlet:0.1", "attack.z=1.5", "data.name='mnist'"])
    assert s.rounds == 7 and s.train.lr == 0.5 and s.data.partition == "dirichlet:0.1"
    assert s.attack.z == 1.5 and s.data.name == "mnist"
    assert parse_override("a.b = 3") == (["a", "b"], 3)


@pytest.mark.parametrize(
    "override, words",
    [
        ("data.nmae=digits", ["data.nmae", "name, dir, partition"]),
        ("bogus=1", ["bogus", "seed, rounds"]),
        ("data.name=cifar", ["data.name", "digits, fashion-mnist, mnist"]),
        ("aggregation.crs=median", ["aggregation.crs", "softmax", "loss_clip_mean"]),
        ("data.partition=dirichlet:-1", ["dirichlet:ALPHA"]),
        ("data.partition=labelskew", ["iid, dirichlet:ALPHA or labelskew:H"]),
        ("train.lr=-1", ["train.lr"]),
        ("rounds=ten", ["rounds", "integer"]),
        ("topology.byzantine=2", []),  # valid with the default attack
        ("peers.99.aggregation.crs=softmax", ["peers.99", "0..11"]),
        ("peers.1.aggregation.crs=nope", ["aggregation.crs", "softmax"]),
        ("peers.1.aggregation.tempo=1", ["peers.1.aggregation.tempo", "temperature"]),
        ("network.round_timeout=0", ["network.round_timeout"]),
        ("network.idle_call_timeout=0", ["network.idle_call_timeout"]),
        ("network.idle_call_timeout=100000", ["network.idle_call_timeout", "86400"]),
        ("network.idle_call_timeout=0.5", []),
        ("network.calls_per_sender=0", ["network.calls_per_sender", "1..64"]),
    ],
)
def test_bad_keys_and_values_name_the_key_and_choices(override, words):
    if not words:
        load_scenario(None, [override])
        return
    with pytest.raises(ScenarioError) as err:
        load_scenario(None, [override])
    for w in words:
        assert w in str(err.value)


def test_byzantine_clients_need_an_attack():
    with pytest.raises(ScenarioError, match="attack.name"):
        load_scenario(None, ["attack.name=none"])
    assert load_scenario(None, ["attack.name=none", "topology.byzantine=0"]).num_clients == 10


def test_per_client_overrides_apply_to_that_client_only():
    s = load_scenario(None, ["peers.0.aggregation.crs=softmax", "peers.0.aggregation.tpm=accuracy", "peers.0.aggregation.temperature=0.5"])
    assert (s.aggregation_for(0).crs, s.aggregation_for(0).tpm, s.aggregation_for(0).temperature) == ("softmax", "accuracy", 0.5)
    assert s.aggregation_for(1) == s.aggregation


def test_resolved_scenario_round_trips(tmp_path):
    s = load_scenario(None, ["peers.3.aggregation.crs=proportional", "data.partition=labelskew:4"])
    dump_scenario(s, tmp_path / "s.toml")
    assert load_scenario(tmp_path / "s.toml") == s


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ScenarioError, match="not found"):
        load_scenario(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("rounds = = 3")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        load_scenario(tmp_path / "bad.toml")
    with pytest.raises(ScenarioError, match="table"):
        scenario_from_dict({"data": 3})


def test_scenario_changes_lists_only_non_defaults():
    from peer.config import Scenario, scenario_changes

    assert scenario_changes(Scenario()) == {}
    s = load_scenario(None, ["rounds=5"])
    changes = scenario_changes(s)
    assert changes["rounds"] == 5 and changes["attack"] == {"name": "gaussian"}
    assert "lr" not in changes.get("train", {})
