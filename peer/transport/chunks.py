"""A model message's chunks, the bytes a transport writes and reads: a message to send cut into
chunks from the sender's tensor as they are written (:class:`WireMessage`, no copy of the
model but the one chunk being written), and a received data chunk read as a view of the bytes
that arrived (:func:`parse_chunk`). What the chunks carry, and the checks on it, are in
:mod:`peer.transport.serde`."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterator, Sequence

import torch

from dfedrw.peer.transport.pb import peer_pb2 as pb


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _varint_size(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


# Tags of ModelChunk's fields on the wire: header (1) and data (2) length-delimited, offset (3) a varint.
_HEADER_TAG, _DATA_TAG, _OFFSET_TAG = b"\x0a", b"\x12", 0x18


def _payload_view(values: torch.Tensor) -> memoryview:
    """The little-endian float32 bytes of ``values`` as a view (a copy only where the tensor is
    not already contiguous float32 or the machine is big-endian)."""
    array = values.detach().to(torch.float32).contiguous().numpy()
    if sys.byteorder != "little":
        array = array.astype("<f4")
    # A flat view (an empty array's shape has a 0 that a cast refuses).
    return memoryview(array.reshape(-1)).cast("B")


class WireMessage(Sequence):
    """One message ready to send: its header and the sender's tensor, whose bytes are the
    payload (not copied). Its chunks, those ``serde.encode`` returns, are built when asked:
    :meth:`wire_chunks` gives their protobuf bytes (a transport's one copy of the model, a chunk
    at a time), indexing each as a ``ModelChunk``. The first holds the header and the first
    ``chunk_bytes`` of the payload, each other the next ``chunk_bytes`` and its ``offset``. The
    tensor must not change while the message may be sent (a client never writes to it again)."""

    def __init__(self, header: pb.ModelHeader, payload: memoryview, chunk_bytes: int) -> None:
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self.header = header
        self.round = header.round
        self._payload = payload
        self.chunk_bytes = chunk_bytes
        self._header_bytes = header.SerializeToString()
        self._count = max(1, math.ceil(len(payload) / chunk_bytes))
        self.payload_bytes = len(payload)

    def __len__(self) -> int:
        return self._count

    def _span(self, i: int) -> tuple[int, int]:
        start = i * self.chunk_bytes
        return start, min(start + self.chunk_bytes, len(self._payload))

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(i)
        start, end = self._span(i)
        data = bytes(self._payload[start:end])
        return pb.ModelChunk(header=self.header, data=data) if i == 0 else pb.ModelChunk(data=data, offset=start)

    def _chunk_size(self, i: int) -> int:
        start, end = self._span(i)
        n = end - start
        size = 1 + _varint_size(n) + n if n else 0
        if i == 0:
            return 1 + _varint_size(len(self._header_bytes)) + len(self._header_bytes) + size
        return size + 1 + _varint_size(start)

    @functools.cached_property
    def nbytes(self) -> int:
        """Bytes on the wire: the sum of the chunks' serialized sizes."""
        return sum(self._chunk_size(i) for i in range(self._count))

    def wire_chunks(self) -> Iterator[bytes]:
        """Each chunk's ``ModelChunk.SerializeToString()`` bytes, made as it is asked for."""
        for i in range(self._count):
            start, end = self._span(i)
            data = self._payload[start:end]
            parts: list = []
            if i == 0:
                parts += [_HEADER_TAG, _varint(len(self._header_bytes)), self._header_bytes]
            if end > start:
                parts += [_DATA_TAG, _varint(end - start), data]
            if i > 0:
                parts += [bytes((_OFFSET_TAG,)), _varint(start)]
            yield b"".join(parts)


def wire_size(chunks: Sequence) -> int:
    """Bytes a message takes on the wire."""
    return chunks.nbytes if isinstance(chunks, WireMessage) else sum(c.ByteSize() for c in chunks)


def wire_round(chunks: Sequence) -> int:
    """The round a message's header names (its first chunk's)."""
    return chunks.round if isinstance(chunks, WireMessage) else chunks[0].header.round


def serialized_chunks(chunks: Sequence) -> Iterator[bytes]:
    """A message's chunks as protobuf bytes."""
    return chunks.wire_chunks() if isinstance(chunks, WireMessage) else (c.SerializeToString() for c in chunks)


class DataChunk:
    """A chunk after a message's first, as :func:`parse_chunk` reads it: ``data`` a view of the
    received bytes, ``offset`` None when the sender set none. It answers ``HasField`` and
    ``ByteSize`` as the protobuf ``ModelChunk`` of the same bytes would; it has no header."""

    __slots__ = ("data", "offset", "_size")

    def __init__(self, data: memoryview, offset: int | None, size: int) -> None:
        self.data, self.offset, self._size = data, offset, size

    def HasField(self, name: str) -> bool:  # noqa: N802 - the protobuf method's name
        return name == "offset" and self.offset is not None

    def ByteSize(self) -> int:  # noqa: N802 - the protobuf method's name
        return self._size


def _read_varint(raw: bytes, pos: int) -> tuple[int, int] | None:
    """(value, position after it) of the varint at ``pos``; None when there is none there or it
    takes more than nine bytes (63 bits: every length and offset a message can have)."""
    value = shift = 0
    for i in range(pos, min(pos + 9, len(raw))):
        byte = raw[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    return None


def parse_chunk(raw: bytes) -> pb.ModelChunk | DataChunk:
    """A received chunk from its bytes: a data chunk as senders write it (the data field, then at
    most an offset) as a :class:`DataChunk` viewing ``raw``, no copy; anything else (a header
    chunk, other encodings of the same fields) parsed by protobuf, with protobuf's meaning."""
    if raw[:1] == _DATA_TAG:
        length = _read_varint(raw, 1)
        if length is not None:
            n, start = length
            end = start + n
            if end == len(raw):
                return DataChunk(memoryview(raw)[start:end], None, len(raw))
            if end < len(raw) and raw[end] == _OFFSET_TAG:
                offset = _read_varint(raw, end + 1)
                if offset is not None and offset[1] == len(raw):
                    return DataChunk(memoryview(raw)[start:end], offset[0], len(raw))
    return pb.ModelChunk.FromString(raw)
