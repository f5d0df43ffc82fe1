"""network.compression: its settings tables, errors, and that a scenario without it is written
and identified as before."""

import pytest

from dfedrw.peer.config.checks import ScenarioError
from dfedrw.peer.config.scenario import load_scenario, scenario_changes, scenario_from_dict, scenario_to_dict
from dfedrw.peer.wiring.build import client_codec, scenario_compression, scenario_model_specs


def test_no_compression_leaves_the_scenario_as_it_was():
    s = load_scenario(None, [])
    assert s.network.compression == "none"
    network = scenario_to_dict(s)["network"]
    assert "compression" not in network and "compression_params" not in network
    assert "network" not in scenario_changes(s)
    assert load_scenario(None, ["network.compression=none"]) == s


def test_a_compression_and_its_settings_load_and_round_trip():
    s = load_scenario(None, ["network.compression=topk", "network.compression_params.topk.fraction=0.05"])
    compression = scenario_compression(s)
    assert (compression.fraction, compression.refresh) == (0.05, 20)
    network = scenario_to_dict(s)["network"]
    assert network["compression"] == "topk" and network["compression_params"] == {"topk": {"fraction": 0.05}}
    assert scenario_from_dict(scenario_to_dict(s)) == s


def test_each_client_gets_an_encoder_and_a_decoder_of_it():
    s = load_scenario(None, ["network.compression=int8"])
    encoder, decoder = client_codec(s, 3, scenario_model_specs(s))
    assert encoder.sender == 3 and encoder.compression.encoding == decoder.compression.encoding == "int8"
    # Without compression a client's intake takes raw models only, as always.
    assert client_codec(load_scenario(None, []), 3, scenario_model_specs(s))[1] is None


@pytest.mark.parametrize("sets, words", [
    (["network.compression=zip"], "network.compression='zip'"),
    (["network.compression=topk", "network.compression_params.topk.fraction=2"], "[network.compression_params.topk]: compression 'topk': fraction must be in (0, 1]"),
    (["network.compression_params.topk.ratio=0.1"], "ratio"),
    (["network.compression=int8", "network.compression_params.int8.block=0"], "block must be >= 1"),
])
def test_bad_compressions_name_the_key(sets, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(None, sets)
    assert words in str(err.value)


def test_the_batched_engine_refuses_compression(tmp_path):
    from dfedrw.engines.batched_run import BatchedRun

    s = load_scenario(None, ["data.name=digits", "topology.byzantine=0", "attack.name=none", "network.compression=int8", "engine.name=batched"])
    with pytest.raises(ValueError, match="network.compression = 'int8'"):
        BatchedRun(s, tmp_path)
