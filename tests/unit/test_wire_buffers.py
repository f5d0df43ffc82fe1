"""Model messages without copies: what a sender writes is cut from its own tensor, a receiver
decodes each chunk into a buffer sized once from the header (PayloadDecoder), a server reads a
data chunk as a view of the bytes it got (parse_chunk), and a round's received models are rows
of one matrix that goes to the rule as it is (Inbox.stacked)."""

from __future__ import annotations

import math
import zlib
from functools import partial

import numpy as np
import pytest
import torch

from dfedrw.peer.transport.intake import ModelIntake
from dfedrw.peer.transport.inbox import Inbox
from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.chunks import DataChunk, parse_chunk, wire_size
from dfedrw.peer.transport.serde import PayloadDecoder, Plausible, TensorSpec, WireError, encode, message_out
from tests.support import wire

SPECS = (TensorSpec("w", "float32", (7, 9)), TensorSpec("b", "float32", (7,)))
D = 70


vec = partial(wire.vec, size=D)


def payload(v: torch.Tensor) -> bytes:
    return v.numpy().astype("<f4").tobytes()


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


# ------------------------------------------------------------------ the decoder


def test_the_decoder_writes_each_chunk_into_the_buffer_it_was_given():
    # Prepare: chunks of 13 bytes, so values are cut across chunk boundaries
    v = vec()
    data = payload(v)
    buffer = torch.empty(D)
    decoder = PayloadDecoder(len(data), zlib.crc32(data), Plausible(), buffer)

    # Execute
    offset = 0
    for part in pieces(data, 13):
        decoder.add(part, offset)
        offset += len(part)
    decoder.finish()
    decoder.verify()

    # Assert: the very buffer holds the values, no other tensor was made for them
    assert decoder.tensor is buffer
    assert torch.equal(buffer, v)


def test_a_chunk_without_an_offset_is_read_as_the_next_one():
    v = vec(1)
    data = payload(v)
    buffer = torch.empty(D)
    decoder = PayloadDecoder(len(data), zlib.crc32(data), Plausible(), buffer)
    for part in pieces(data, 64):
        decoder.add(part)
    decoder.finish()
    decoder.verify()
    assert torch.equal(buffer, v)


@pytest.mark.parametrize("offset, reason", [(40, "chunk_out_of_order"), (8, "chunk_overlap")])
def test_a_chunk_that_does_not_start_where_the_data_ended_is_refused(offset, reason):
    data = payload(vec())
    decoder = PayloadDecoder(len(data), zlib.crc32(data), Plausible(), torch.empty(D))
    decoder.add(data[:16], 0)
    with pytest.raises(WireError) as refused:
        decoder.add(data[offset : offset + 16], offset)
    assert refused.value.reason == reason


def test_a_stream_longer_or_shorter_than_declared_is_refused():
    data = payload(vec())
    long = PayloadDecoder(len(data), zlib.crc32(data), Plausible(), torch.empty(D))
    long.add(data)
    with pytest.raises(WireError, match="size_mismatch"):
        long.add(b"\0\0\0\0", len(data))
    short = PayloadDecoder(len(data), zlib.crc32(data), Plausible(), torch.empty(D))
    short.add(data[:-4])
    with pytest.raises(WireError, match="size_mismatch"):
        short.finish()


def test_a_buffer_of_another_size_than_the_declared_payload_is_a_bug_not_a_message():
    with pytest.raises(ValueError, match="buffer"):
        PayloadDecoder(4 * D, 0, Plausible(), torch.empty(D + 1))


def test_a_bad_checksum_is_found_as_the_chunks_pass():
    data = bytearray(payload(vec()))
    crc = zlib.crc32(bytes(data))
    data[100] ^= 1
    decoder = PayloadDecoder(len(data), crc, Plausible(), torch.empty(D))
    for part in pieces(bytes(data), 32):
        decoder.add(part)
    decoder.finish()
    with pytest.raises(WireError, match="bad_checksum"):
        decoder.verify()


@pytest.mark.parametrize("value, reason", [(math.nan, "non_finite"), (math.inf, "non_finite"), (-math.inf, "non_finite"), (3e6, "implausible")])
def test_a_value_cut_across_two_chunks_is_still_checked(value, reason):
    # Prepare: the bad value at bytes 12..15, chunks of 5 bytes cut it 3 + 1
    v = vec()
    v[3] = value
    data = payload(v)
    decoder = PayloadDecoder(len(data), zlib.crc32(data), Plausible(max_abs_value=1e6), torch.empty(D))
    for part in pieces(data, 5):
        decoder.add(part)
    decoder.finish()
    with pytest.raises(WireError) as refused:
        decoder.verify()
    assert refused.value.reason == reason


def test_a_decoder_that_let_go_of_its_buffer_still_checks_what_follows():
    v = vec()
    v[60] = math.nan
    data = payload(v)
    buffer = torch.zeros(D)
    decoder = PayloadDecoder(len(data), zlib.crc32(data), Plausible(), buffer)
    decoder.add(data[:100])
    decoder.drop_buffer()
    decoder.add(data[100:])
    decoder.finish()
    assert decoder.tensor is None
    assert torch.equal(buffer[25:], torch.zeros(D - 25))  # nothing written after it was let go
    with pytest.raises(WireError, match="non_finite"):
        decoder.verify()


# ------------------------------------------------------------------ the wire


def test_the_chunks_a_sender_writes_are_the_protobuf_chunks_byte_for_byte():
    v = vec()
    message = message_out(3, 9, v, SPECS, num_samples=12, train_loss=0.5, chunk_bytes=33)
    chunks = encode(3, 9, v, SPECS, num_samples=12, train_loss=0.5, chunk_bytes=33)
    assert list(message.wire_chunks()) == [c.SerializeToString() for c in chunks]
    assert message.nbytes == wire_size(chunks) == sum(len(c) for c in message.wire_chunks())
    assert [c.offset for c in chunks[1:]] == list(range(33, 4 * D, 33)) and not chunks[0].HasField("offset")


def test_a_message_to_send_is_the_senders_tensor_not_a_copy():
    v = vec()
    message = message_out(3, 9, v, SPECS, chunk_bytes=64)
    before = b"".join(message.wire_chunks())
    v[0] = 123.0  # a client never does this to a model it sent: it shows no copy was taken
    assert b"".join(message.wire_chunks()) != before
    assert bytes(message[0].data[:4]) == np.float32(123.0).tobytes()


def test_a_data_chunk_is_read_as_a_view_of_the_bytes_received():
    chunks = encode(3, 9, vec(), SPECS, chunk_bytes=33)
    for chunk in chunks[1:]:
        raw = chunk.SerializeToString()
        read = parse_chunk(raw)
        assert isinstance(read, DataChunk) and isinstance(read.data, memoryview) and read.data.obj is raw
        assert bytes(read.data) == chunk.data and read.offset == chunk.offset and read.ByteSize() == chunk.ByteSize()
        assert not read.HasField("header") and read.HasField("offset")


def test_anything_but_a_plain_data_chunk_is_parsed_by_protobuf():
    header_chunk = encode(3, 9, vec(), SPECS, chunk_bytes=33)[0]
    assert parse_chunk(header_chunk.SerializeToString()).header.sender == 3
    # The data field twice: protobuf keeps the last one; so does the receiver.
    twice = pb.ModelChunk(data=b"ab").SerializeToString() + pb.ModelChunk(data=b"cd").SerializeToString()
    read = parse_chunk(twice)
    assert isinstance(read, pb.ModelChunk) and read.data == b"cd"


# ------------------------------------------------------------------ the intake and the inbox


def client_parts(neighbours=(1, 2, 3), window=2, capacity=None):
    inbox = Inbox(0, neighbours, 5, window, model_size=D, capacity=capacity)
    return inbox, ModelIntake(inbox, SPECS, Plausible(), 4 * D + 1)


def deliver_in_pieces(intake, sender, round_, v, chunk_bytes=48):
    chunks = encode(sender, round_, v, SPECS, num_samples=10, chunk_bytes=chunk_bytes)
    message = intake.begin(chunks[0], sender)
    for chunk in chunks[1:]:
        message.add(chunk)
    return message.end()


def test_received_models_are_decoded_into_the_rows_of_the_rounds_matrix():
    # Prepare
    inbox, intake = client_parts()
    models = {k: vec(k) for k in (1, 2, 3)}
    own = vec(9)

    # Execute
    verdicts = [deliver_in_pieces(intake, k, 0, models[k]) for k in (3, 1, 2)]
    got = inbox.wait(0, {1, 2, 3}, 1.0)
    candidates = inbox.stacked(0, [got[k].vector for k in (1, 2, 3)], own)

    # Assert: the matrix the rows were decoded into is the rule's candidates, own in row 0
    assert verdicts == [(True, "", 0)] * 3
    assert torch.equal(candidates, torch.stack([own, models[1], models[2], models[3]]))
    assert candidates.data_ptr() == inbox._matrices[0][0].data_ptr()
    assert all(got[k].vector.data_ptr() == candidates[i].data_ptr() for i, k in enumerate((1, 2, 3), start=1))


def test_a_missing_sender_moves_the_later_rows_up_in_place():
    inbox, intake = client_parts()
    models = {k: vec(k) for k in (1, 3)}
    for k in (1, 3):
        assert deliver_in_pieces(intake, k, 0, models[k]) == (True, "", 0)
    got = inbox.wait(0, {1, 2, 3}, 0.01)
    matrix = inbox._matrices[0][0]
    own = vec(9)

    candidates = inbox.stacked(0, [got[k].vector for k in (1, 3)], own)

    assert torch.equal(candidates, torch.stack([own, models[1], models[3]]))
    assert candidates.data_ptr() == matrix.data_ptr()
    # The round is taken: a message that comes for it now is counted, not kept in a row.
    assert deliver_in_pieces(intake, 2, 0, vec(2)) == (True, "", 0)
    assert torch.equal(candidates, torch.stack([own, models[1], models[3]])) and inbox.held() == 0


def test_the_intake_keeps_every_check_and_its_order_on_a_stream():
    inbox, intake = client_parts()
    v = vec()
    v[5] = math.nan
    assert deliver_in_pieces(intake, 1, 0, v) == (False, "non_finite", 0)
    # A stranger is turned away before its payload is read, whatever it holds.
    assert deliver_in_pieces(intake, 4, 0, v) == (False, "not_neighbour", 0)
    # Impersonation comes before the payload's defects.
    chunks = encode(2, 0, v, SPECS, chunk_bytes=48)
    message = intake.begin(chunks[0], 1)
    for chunk in chunks[1:]:
        message.add(chunk)
    assert message.end() == (False, "impersonation", 0)
    # A stream cut short is a size mismatch before anything else.
    message = intake.begin(chunks[0], 2)
    message.add(chunks[1])
    assert message.end() == (False, "size_mismatch", 0)
    assert inbox.rejected == {"non_finite": 1, "not_neighbour": 1, "impersonation": 1, "size_mismatch": 1}
    assert inbox.held() == 0


def test_a_message_too_large_for_the_model_is_refused_at_its_header():
    inbox, intake = client_parts()
    chunks = encode(1, 0, vec(), SPECS, chunk_bytes=48)
    chunks[0].header.total_bytes = 10 * D * 4
    message = intake.begin(chunks[0], 1)
    assert message.end() == (False, "too_large", 0) and inbox.held() == 0
