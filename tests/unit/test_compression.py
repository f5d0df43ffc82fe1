"""Compressions (peer/transport/compression.py): each one's payload and round trip, int8's
stochastic rounding, top-k's error feedback and its per-link state, and the receiver's intake
rebuilding and checking what they send."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dfedrw.peer.client.presence import Presence
from dfedrw.peer.transport.compression import COMPRESSION_REGISTRY, Decoder, Encoder, Int8, NoCompression, TopK, encoded_out
from dfedrw.peer.transport.inbox import Inbox
from dfedrw.peer.transport.intake import ModelIntake
from dfedrw.peer.transport.serde import Plausible, TensorSpec, WireError, message_out

SPECS = (TensorSpec("w", "float32", (30, 20)), TensorSpec("b", "float32", (30,)))
D = 630


def vec(seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(D, generator=torch.Generator().manual_seed(seed))


def payload_of(message) -> bytes:
    return b"".join(chunk.data for chunk in message)


def encoder(compression, sender: int = 1) -> Encoder:
    return Encoder(compression, sender, SPECS, seed=7, chunk_bytes=256)


def intake_for(compression, neighbours=(1, 2), plausible=Plausible()):
    inbox = Inbox(0, neighbours, 3, 2, model_size=D)
    decoder = Decoder(compression, SPECS) if compression.encoding else None
    return inbox, ModelIntake(inbox, SPECS, plausible, 4 * D + 1, decoder=decoder), decoder


def deliver(intake, message, sender: int = 1):
    """Hand ``message`` over chunk by chunk, as the gRPC server does."""
    incoming = intake.begin(message[0], sender)
    for chunk in message[1:]:
        incoming.add(chunk)
    return incoming.end()


def held(inbox, round_: int, sender: int = 1) -> torch.Tensor:
    return inbox.wait(round_, {sender}, 0.0)[sender].vector


# ------------------------------------------------------------------ the registry


def test_the_three_compressions_are_registered_with_their_settings():
    assert {"none", "int8", "topk"} <= set(COMPRESSION_REGISTRY.names())
    assert {s.name: s.default for s in COMPRESSION_REGISTRY.settings("topk")} == {"fraction": 0.1, "refresh": 20}
    assert {s.name: s.default for s in COMPRESSION_REGISTRY.settings("int8")} == {"block": 256}


@pytest.mark.parametrize(
    "name, settings, words",
    [("topk", {"fraction": 0.0}, "fraction"), ("topk", {"fraction": 1.5}, "(0, 1]"), ("topk", {"refresh": -1}, "refresh"),
     ("int8", {"block": 0}, "block")],
)
def test_a_bad_setting_is_refused_with_its_name(name, settings, words):
    with pytest.raises(ValueError, match=r".*" + words.replace("(", r"\(").replace("]", r"\]")):
        COMPRESSION_REGISTRY.build(name, settings)


# ------------------------------------------------------------------ int8


def test_int8_payload_is_a_scale_per_block_then_a_byte_per_value():
    compression = Int8(block=64)
    message = encoder(compression).round(0, vec(), num_samples=5, train_loss=0.5).to(2)
    assert message.header.encoding == "int8"
    assert len(payload_of(message)) == compression.payload_bytes(D) == 4 * math.ceil(D / 64) + D


def test_int8_rebuilds_every_value_within_one_step_of_its_block_scale():
    compression = Int8(block=64)
    v = vec(1)
    payload, rebuilt = compression.encode(v, None, torch.Generator().manual_seed(3))
    decoded = compression.decode(memoryview(bytes(payload)), D, None)
    assert torch.equal(decoded, rebuilt)
    scales = v[: (D // 64) * 64].view(-1, 64).abs().amax(dim=1) / 127
    for b, scale in enumerate(scales.tolist()):
        assert (decoded[b * 64 : (b + 1) * 64] - v[b * 64 : (b + 1) * 64]).abs().max() <= scale * (1 + 1e-6)
    # The largest magnitude of a block is rebuilt exactly (it is 127 steps).
    top = int(v[:64].abs().argmax())
    assert decoded[top] == pytest.approx(float(v[top]), rel=1e-6)


def test_int8_rounding_is_stochastic_and_unbiased():
    compression = Int8(block=D)
    v = vec(2)
    draws = torch.stack([compression.encode(v, None, torch.Generator().manual_seed(s))[1] for s in range(400)])
    step = float(v.abs().max()) / 127
    # One draw is off by up to a step; the mean of 400 is within a few standard errors (step/2/sqrt(400)).
    assert (draws[0] - v).abs().max() > 0.2 * step
    assert (draws.mean(0) - v).abs().max() < 4 * step / 2 / math.sqrt(400) * 2


def test_int8_of_a_zero_block_is_zero_and_the_draws_are_seeded():
    compression = Int8(block=32)
    v = torch.zeros(D)
    v[100:] = vec(3)[100:]
    out = encoder(compression).round(4, v, num_samples=1, train_loss=0.0)
    again = encoder(compression).round(4, v, num_samples=1, train_loss=0.0)
    assert payload_of(out.to(2)) == payload_of(again.to(2))
    rebuilt = compression.decode(memoryview(payload_of(out.to(2))), D, None)
    assert torch.all(rebuilt[:96] == 0)
    # One encoding a round serves every neighbour (it keeps no per-link state).
    assert out.to(2) is out.to(3)


def test_int8_refuses_a_negative_or_non_finite_scale():
    compression = Int8(block=D)
    payload = bytearray(compression.encode(vec(), None, torch.Generator().manual_seed(0))[0])
    for bad in (-1.0, math.inf, math.nan):
        payload[:4] = np.float32(bad).tobytes()
        with pytest.raises(WireError) as refused:
            compression.decode(memoryview(bytes(payload)), D, None)
        assert refused.value.reason == "bad_encoding"


# ------------------------------------------------------------------ top-k


def test_topk_sends_a_whole_model_first_then_differences_of_k_coordinates():
    compression = TopK(fraction=0.05, refresh=0)
    e = encoder(compression)
    first = e.round(0, vec(0), num_samples=1, train_loss=0.0).to(2)
    second = e.round(1, vec(1), num_samples=1, train_loss=0.0).to(2)
    assert first.header.encoding == "" and not first.header.HasField("base_round")
    assert second.header.encoding == "topk" and second.header.base_round == 0
    k = math.ceil(0.05 * D)
    assert len(payload_of(second)) == 8 * k == compression.payload_bytes(D)
    assert e.bytes_to[2] > 0 and e.dense_to == {2: 1}


def test_topk_receiver_rebuilds_the_senders_copy_to_the_last_bit():
    compression = TopK(fraction=0.1, refresh=0)
    e = encoder(compression)
    d = Decoder(compression, SPECS)
    for r in range(8):
        message = e.round(r, vec(r), num_samples=1, train_loss=0.0).to(2)
        data = memoryview(payload_of(message))
        if message.header.encoding:
            rebuilt = d.decode(message.header, data)
            d.keep(1, r, rebuilt, owned=True)
        else:
            d.keep(1, r, torch.frombuffer(bytearray(data), dtype=torch.float32))
        assert torch.equal(d.bases[1][1], e.bases[2][1])
        assert d.bases[1][0] == e.bases[2][0] == r


def test_topk_error_feedback_sends_what_was_left_out_later():
    # A model that stops changing: every coordinate left out of one message goes with a later
    # one, so after 1/fraction differences the receiver holds the model itself.
    compression = TopK(fraction=0.25, refresh=0)
    e = encoder(compression)
    start, target = vec(0), vec(1)
    e.round(0, start, num_samples=1, train_loss=0.0).to(2)
    errors = []
    for r in range(1, 6):
        e.round(r, target, num_samples=1, train_loss=0.0).to(2)
        errors.append(float((e.bases[2][1] - target).abs().max()))
    assert errors[0] > 0.1
    assert all(later <= earlier for earlier, later in zip(errors, errors[1:]))
    assert errors[3] < 1e-6  # four messages of a quarter of the coordinates each


def test_topk_keeps_one_copy_per_link_and_refreshes_each_every_refresh_messages():
    compression = TopK(fraction=0.1, refresh=3)
    e = encoder(compression)
    kinds = {2: [], 3: []}
    for r in range(7):
        out = e.round(r, vec(r), num_samples=1, train_loss=0.0)
        for peer in (2, 3) if r % 2 == 0 else (2,):
            kinds[peer].append(out.to(peer).header.encoding or "whole")
    assert kinds[2] == ["whole", "topk", "topk", "whole", "topk", "topk", "whole"]
    # Link 3 carried rounds 0, 2, 4, 6: its differences are from the round it got last.
    assert kinds[3] == ["whole", "topk", "topk", "whole"]
    assert e.round(7, vec(7), num_samples=1, train_loss=0.0).to(3).header.base_round == 6


def test_topk_sends_a_whole_model_again_to_a_peer_that_came_back_or_lost_one():
    compression = TopK(fraction=0.1, refresh=0)
    e = encoder(compression)
    e.round(0, vec(0), num_samples=1, train_loss=0.0).to(2)
    out = e.round(1, vec(1), num_samples=1, train_loss=0.0)
    assert out.to(2).header.encoding == "topk"
    assert out.again(2).header.encoding == ""
    e.mismatch(2)
    assert e.round(2, vec(2), num_samples=1, train_loss=0.0).to(2).header.encoding == ""
    assert e.round(3, vec(3), num_samples=1, train_loss=0.0).to(2).header.encoding == "topk"


# ------------------------------------------------------------------ the receiver's intake


def test_without_compression_a_client_takes_raw_models_and_refuses_encoded_ones():
    inbox, intake, _ = intake_for(NoCompression())
    assert deliver(intake, message_out(1, 0, vec(), SPECS, chunk_bytes=256))[:2] == (True, "")
    message = encoder(Int8(), sender=2).round(0, vec(), num_samples=1, train_loss=0.0).to(0)
    assert deliver(intake, message, sender=2)[:2] == (False, "bad_encoding")
    raw = message_out(2, 0, vec(), SPECS, chunk_bytes=256)
    raw.header.block = 256
    assert deliver(intake, type(raw)(raw.header, memoryview(payload_of(raw)), 256), sender=2)[:2] == (False, "bad_encoding")


def test_an_int8_model_is_rebuilt_into_the_round_matrix():
    compression = Int8(block=100)
    inbox, intake, _ = intake_for(compression)
    out = encoder(compression).round(0, vec(5), num_samples=9, train_loss=0.25)
    assert deliver(intake, out.to(0))[:2] == (True, "")
    expected = compression.decode(memoryview(payload_of(out.to(0))), D, None)
    message = inbox.wait(0, {1}, 0.0)[1]
    assert torch.equal(message.vector, expected) and message.num_samples == 9
    # It counts the bytes that came, about a quarter of a raw model's.
    assert inbox.bytes_received < 0.3 * 4 * D + 200


def test_a_rebuilt_model_gets_the_values_check_of_a_raw_one():
    compression = Int8(block=D)
    inbox, intake, _ = intake_for(compression, plausible=Plausible(max_abs_value=5.0))
    message = encoder(compression).round(0, vec(6, scale=10.0), num_samples=1, train_loss=0.0).to(0)
    assert deliver(intake, message)[:2] == (False, "implausible")


@pytest.mark.parametrize(
    "change, reason",
    [("encoding", "bad_encoding"), ("size", "size_mismatch"), ("checksum", "bad_checksum"), ("order", "bad_encoding"),
     ("nan", "non_finite")],
)
def test_a_defective_compressed_message_is_refused(change, reason):
    compression = TopK(fraction=0.1, refresh=0)
    inbox, intake, _ = intake_for(compression)
    e = encoder(compression)
    assert deliver(intake, e.round(0, vec(0), num_samples=1, train_loss=0.0).to(0))[:2] == (True, "")
    good = e.round(1, vec(1), num_samples=1, train_loss=0.0).to(0)
    data = bytearray(payload_of(good))
    k = len(data) // 8
    encoding = "topk"
    if change == "encoding":
        encoding = "int8"
    elif change == "size":
        data = data[:-8]
    elif change == "order":
        data[0:4], data[4:8] = data[4:8], data[0:4]
    elif change == "nan":
        data[4 * k : 4 * k + 4] = np.float32(np.nan).tobytes()
    bad = encoded_out(1, 1, memoryview(bytes(data)), SPECS, encoding=encoding, base_round=0, chunk_bytes=256)
    if change == "checksum":
        bad.header.crc32 ^= 1
        bad = type(bad)(bad.header, memoryview(bytes(data)), 256)
    assert deliver(intake, bad)[:2] == (False, reason)


def test_a_difference_after_a_lost_message_is_refused_until_a_whole_model_comes():
    compression = TopK(fraction=0.1, refresh=0)
    inbox, intake, decoder = intake_for(compression)
    e = encoder(compression)
    assert deliver(intake, e.round(0, vec(0), num_samples=1, train_loss=0.0).to(0))[:2] == (True, "")
    e.round(1, vec(1), num_samples=1, train_loss=0.0).to(0)  # lost on the way
    inbox.advance(2)
    assert deliver(intake, e.round(2, vec(2), num_samples=1, train_loss=0.0).to(0))[:2] == (False, "base_mismatch")
    e.mismatch(0)  # the reply said so
    inbox.advance(3)
    assert deliver(intake, e.round(3, vec(3), num_samples=1, train_loss=0.0).to(0))[:2] == (True, "")
    assert torch.equal(held(inbox, 3), vec(3))
    inbox.advance(4)
    assert deliver(intake, e.round(4, vec(4), num_samples=1, train_loss=0.0).to(0))[:2] == (True, "")
    assert torch.equal(held(inbox, 4), e.bases[0][1]) and torch.equal(decoder.bases[1][1], e.bases[0][1])
    assert inbox.rejected["base_mismatch"] == 1


def test_a_difference_that_comes_too_late_still_reaches_what_the_receiver_holds():
    # The round passed before the message came: the inbox does not keep the model, but the
    # next difference is from it, so the receiver's copy must follow it all the same.
    compression = TopK(fraction=0.1, refresh=0)
    inbox, intake, decoder = intake_for(compression)
    e = encoder(compression)
    deliver(intake, e.round(0, vec(0), num_samples=1, train_loss=0.0).to(0))
    late = e.round(1, vec(1), num_samples=1, train_loss=0.0).to(0)
    inbox.advance(2)
    assert deliver(intake, late)[:2] == (False, "stale_round")
    assert decoder.bases[1][0] == 1
    assert deliver(intake, e.round(2, vec(2), num_samples=1, train_loss=0.0).to(0))[:2] == (True, "")
    assert torch.equal(held(inbox, 2), e.bases[0][1])


def test_a_whole_model_whose_round_passes_while_it_arrives_is_still_what_the_receiver_holds():
    # The inbox lets go of its row when the round passes, and does not keep one for a round it
    # closed: the sender counts on the model all the same, and its next difference is from it.
    compression = TopK(fraction=0.1, refresh=0)
    for passes in ("advance", "close"):
        inbox, intake, decoder = intake_for(compression)
        e = encoder(compression)
        whole = e.round(0, vec(0), num_samples=1, train_loss=0.0).to(0)
        if passes == "close":
            inbox.close(0)
        incoming = intake.begin(whole[0], 1)
        incoming.add(whole[1])
        if passes == "advance":
            inbox.advance(1)
        for chunk in whole[2:]:
            incoming.add(chunk)
        assert incoming.end()[:2] == ((False, "stale_round") if passes == "advance" else (True, ""))
        assert decoder.bases[1][0] == 0 and torch.equal(decoder.bases[1][1], vec(0))
        inbox.advance(1)
        assert deliver(intake, e.round(1, vec(1), num_samples=1, train_loss=0.0).to(0))[:2] == (True, "")
        assert torch.equal(held(inbox, 1), e.bases[0][1]) and not inbox.rejected


def test_a_whole_model_sent_again_in_a_round_the_receiver_had_a_difference_of_replaces_it():
    # A neighbour that came back gets the round's model again, whole: the sender's copy is now
    # that model, not the difference it sent before, and so must the receiver's be.
    compression = TopK(fraction=0.1, refresh=0)
    inbox, intake, decoder = intake_for(compression)
    e = encoder(compression)
    assert deliver(intake, e.round(0, vec(0), num_samples=1, train_loss=0.0).to(0))[:2] == (True, "")
    out = e.round(1, vec(1), num_samples=1, train_loss=0.0)
    assert deliver(intake, out.to(0))[:2] == (True, "")
    assert deliver(intake, out.again(0))[:2] == (False, "duplicate")
    assert decoder.bases[1][0] == 1 and torch.equal(decoder.bases[1][1], e.bases[0][1])


def relabelled(message, round_: int):
    """``message`` with its header's round changed on the way (the checksum as it was)."""
    header = type(message.header)()
    header.CopyFrom(message.header)
    header.round = round_
    return type(message)(header, memoryview(payload_of(message)), 256)


def test_a_round_changed_on_the_way_fails_the_checksum_and_leaves_the_held_model_as_it_was():
    compression = TopK(fraction=0.1, refresh=0)
    inbox, intake, decoder = intake_for(compression)
    e = encoder(compression)
    assert deliver(intake, e.round(0, vec(0), num_samples=1, train_loss=0.0).to(0))[:2] == (True, "")
    message = e.round(1, vec(1), num_samples=1, train_loss=0.0).to(0)
    assert deliver(intake, relabelled(message, 2**40))[:2] == (False, "bad_checksum")
    assert decoder.bases[1][0] == 0
    # The message itself, as sent, is taken, and the link goes on in step.
    assert deliver(intake, message)[:2] == (True, "")
    inbox.advance(2)
    assert deliver(intake, e.round(2, vec(2), num_samples=1, train_loss=0.0).to(0))[:2] == (True, "")
    assert torch.equal(decoder.bases[1][1], e.bases[0][1]) and decoder.bases[1][0] == 2
    assert inbox.rejected == {"bad_checksum": 1}



def test_a_message_refused_as_too_far_ahead_does_not_change_the_held_model():
    # Checksummed as sent (by a sender that says it is that far on): the inbox does not believe
    # its round, so the model held of the sender keeps its own, and the next difference from it is taken.
    compression = TopK(fraction=0.1, refresh=0)
    inbox, intake, decoder = intake_for(compression)
    e = encoder(compression)
    assert deliver(intake, e.round(0, vec(0), num_samples=1, train_loss=0.0).to(0))[:2] == (True, "")
    held0 = decoder.bases[1][1].clone()
    far = e.round(1, vec(1), num_samples=1, train_loss=0.0).to(0)
    far = encoded_out(1, 2**40, memoryview(payload_of(far)), SPECS, encoding="topk", base_round=0, chunk_bytes=256)
    assert deliver(intake, far)[:2] == (False, "future_round")
    whole = encoder(compression).round(2**40 + 1, vec(9), num_samples=1, train_loss=0.0).to(0)
    assert deliver(intake, whole)[:2] == (False, "future_round")
    assert decoder.bases[1][0] == 0 and torch.equal(decoder.bases[1][1], held0)
    e.mismatch(0)  # the replies said future_round: the encoder no longer counts on them
    assert deliver(intake, e.round(1, vec(1), num_samples=1, train_loss=0.0).to(0))[:2] == (True, "")
    inbox.advance(2)
    assert deliver(intake, e.round(2, vec(2), num_samples=1, train_loss=0.0).to(0))[:2] == (True, "")
    assert torch.equal(decoder.bases[1][1], e.bases[0][1]) and "base_mismatch" not in inbox.rejected


def test_a_reply_that_refused_a_message_as_too_far_ahead_gets_a_whole_model_next():
    # The receiver does not hold a model it refused as future_round: the sender must not count on it.
    class Replying:
        def __init__(self) -> None:
            self.peer_replies, self.sent = {}, []

        def send(self, peer, message) -> None:
            self.sent.append(message.header.encoding or "whole")

    e, transport = encoder(TopK(fraction=0.1, refresh=0)), Replying()
    presence = Presence(1, (0,), inbox=Inbox(1, (0,), 3, 2), transport=transport, graphs=None, round_timeout=1.0, round_window=2)
    replies = [None, (1, True, ""), (1, False, "future_round"), (1, True, ""), (1, False, "base_mismatch"), (1, True, "")]
    for r, reply in enumerate(replies):
        if reply is not None:
            transport.peer_replies[0] = reply
        presence.send_all(r, e.round(r, vec(r), num_samples=1, train_loss=0.0), (0,))
    assert transport.sent == ["whole", "topk", "whole", "topk", "whole", "topk"]


def test_an_int8_message_of_another_block_size_is_refused_even_when_the_payload_size_agrees():
    # 630 values: blocks of 100 and of 91 both make 7 scales, so the payloads are of one size.
    ours, theirs = Int8(block=100), Int8(block=91)
    assert ours.payload_bytes(D) == theirs.payload_bytes(D)
    inbox, intake, _ = intake_for(ours)
    theirs_message = encoder(theirs).round(0, vec(5), num_samples=1, train_loss=0.0).to(0)
    assert theirs_message.header.block == 91
    assert deliver(intake, theirs_message)[:2] == (False, "bad_encoding")
    # Nor is one that does not say, or a message of another encoding that names a block size.
    unnamed = encoded_out(1, 0, memoryview(payload_of(theirs_message)), SPECS, encoding="int8", chunk_bytes=256)
    assert deliver(intake, unnamed)[:2] == (False, "bad_encoding")
    raw = message_out(1, 0, vec(5), SPECS, chunk_bytes=256)
    raw.header.block = 100
    assert deliver(intake, type(raw)(raw.header, memoryview(payload_of(raw)), 256))[:2] == (False, "bad_encoding")
    assert deliver(intake, encoder(ours).round(0, vec(5), num_samples=1, train_loss=0.0).to(0))[:2] == (True, "")
    assert inbox.rejected == {"bad_encoding": 3}
