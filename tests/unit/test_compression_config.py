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


def test_the_batched_engine_refuses_differences_over_lossy_links(tmp_path):
    from dfedrw.engines.run import BatchedRun

    base = ["data.name=digits", "topology.byzantine=0", "attack.name=none", "engine.name=batched"]
    with pytest.raises(ValueError, match="'topk' over \\[links\\] that lose messages"):
        BatchedRun(load_scenario(None, [*base, "network.compression=topk", 'links.pairs."0-1".loss=0.1']), tmp_path / "a")
    # int8 keeps no per-link state: lossy links are fine.
    assert BatchedRun(load_scenario(None, [*base, "network.compression=int8", "links.loss=0.1"]), tmp_path / "b").network.codec


def test_the_batched_engine_rebuilds_what_a_clients_decoder_rebuilds():
    # The batched engine's per-link state against a client's encoder and its neighbour's
    # decoder, over the same models: the same model rebuilt, to the last bit, round by round.
    import torch

    from dfedrw.engines.network import LinkCodec
    from dfedrw.peer.transport.chunks import wire_size
    from dfedrw.peer.transport.compression import Decoder, Encoder

    specs = (scenario_model_specs(load_scenario(None, [])))
    numel = sum(s.numel for s in specs)
    for name in ("int8", "topk"):
        s = load_scenario(None, [f"network.compression={name}", f"network.compression_params.{name}.{'refresh=3' if name == 'topk' else 'block=64'}"])
        compression = scenario_compression(s)
        codec = LinkCodec(compression, specs, seed=s.seed, chunk_bytes=1 << 20, honest=[1])
        encoder, decoder = Encoder(compression, 1, specs, seed=s.seed, chunk_bytes=1 << 20), Decoder(compression, specs)
        for r in range(7):
            model = torch.randn(numel, generator=torch.Generator().manual_seed(r))
            size = codec.sizes(r, [(1, 2)])[(1, 2)]  # before the round: whole model or difference
            message = encoder.round(r, model, num_samples=1, train_loss=0.5).to(2)
            assert abs(size - wire_size(message)) <= 8, (name, r)  # the header's varints aside
            payload = memoryview(b"".join(chunk.data for chunk in message))
            if message.header.encoding:
                rebuilt = decoder.decode(message.header, payload)
            else:
                rebuilt = torch.frombuffer(bytearray(payload), dtype=torch.float32)
            decoder.keep(1, r, rebuilt)
            assert torch.equal(codec.rebuilt(r, {1: model}, [(1, 2)])[(1, 2)], rebuilt), (name, r)
