"""Model messages on the wire: raw little-endian tensor bytes plus a header, never pickle.

A model is a flat float32 vector on the client side; on the wire it is the concatenation of
its parameter tensors, each described by a :class:`TensorSpec`, so a receiver can check every
name, dtype and shape against its own model before it touches the bytes.

What a message declares is checked too, not only its form: :class:`Plausible` bounds the
values a model may hold and the training-set size a sender may claim (DFedAvg weights by it),
and a declared loss outside its range is read as absent. Pure: no transport here.

A *pool message* (:func:`encode_pool`, :func:`decode_pool`) is what colluding Byzantine
clients send each other: the honest models one of them received in a round, back to back,
with ``origins`` naming whose each is. It gets every check a model message gets, per model.
A model message never names origins: :func:`decode` rejects one that does (``pool_message``).
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.ratelog import quote

WIRE_DTYPES = {"float32": np.dtype("<f4")}


class WireError(ValueError):
    """A received message is malformed; ``reason`` is a short machine-friendly tag."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    # Cached: every message sent or received checks its size against these (math.prod on a
    # short tuple costs a fraction of a microsecond, np.prod over ten).
    @functools.cached_property
    def numel(self) -> int:
        return math.prod(self.shape)

    @functools.cached_property
    def nbytes(self) -> int:
        return self.numel * WIRE_DTYPES[self.dtype].itemsize


def model_specs(model: torch.nn.Module) -> tuple[TensorSpec, ...]:
    """The wire layout of a model: its parameters in ``named_parameters`` order."""
    return tuple(
        TensorSpec(name, str(p.dtype).removeprefix("torch."), tuple(p.shape))
        for name, p in model.named_parameters()
    )


@dataclass(frozen=True)
class Plausible:
    """What a receiver believes of a message beyond its form.

    ``max_abs_value``: no parameter of a model of this scenario is larger in magnitude
    (``network.max_abs_value``); a message holding one is rejected as ``implausible``.
    ``max_num_samples``: the most training samples a sender can have (the whole training set
    of the scenario's dataset); a declared size outside ``[1, max_num_samples]`` is rejected
    as ``implausible_samples``. ``max_train_loss``: a declared training loss outside
    ``[0, max_train_loss]`` (or not finite) is read as absent (NaN), not rejected: the loss is
    optional (senders that have none send NaN) and only q-FDFL uses it, which leaves out a
    candidate without one.
    """

    max_abs_value: float = 1e6
    max_num_samples: int = 10_000_000
    max_train_loss: float = 1e6

    def samples_error(self, num_samples: int) -> WireError | None:
        if not 1 <= num_samples <= self.max_num_samples:
            return WireError("implausible_samples", f"declares {num_samples} samples, outside [1, {self.max_num_samples}]")
        return None

    def values_error(self, low: float, high: float) -> WireError | None:
        """The error for a model whose smallest and largest values are ``low`` and ``high``
        (NaN when it holds one), or None when they are plausible."""
        if not (math.isfinite(low) and math.isfinite(high)):
            return WireError("non_finite", "the model contains NaN or Inf")
        if max(-low, high) > self.max_abs_value:
            return WireError("implausible", f"a value of magnitude {max(-low, high):.3g} > {self.max_abs_value:g}")
        return None

    def train_loss(self, loss: float) -> float:
        """A declared training loss as believed: NaN when out of range (absent)."""
        return loss if 0.0 <= loss <= self.max_train_loss else float("nan")


@dataclass(frozen=True)
class ModelMessage:
    sender: int
    round: int
    vector: torch.Tensor  # flat float32
    num_samples: int = 0
    nbytes: int = 0  # size on the wire, for accounting
    train_loss: float = float("nan")  # declared by the sender; NaN when absent or out of range


def _header(sender: int, round_: int, specs: Sequence[TensorSpec], payload: bytes, **fields) -> pb.ModelHeader:
    """The header of a message whose payload is ``payload``, laid out as ``specs``."""
    return pb.ModelHeader(
        sender=sender, round=round_, tensors=[pb.TensorSpec(name=s.name, dtype=s.dtype, shape=list(s.shape)) for s in specs],
        total_bytes=len(payload), crc32=zlib.crc32(payload), **fields,
    )


def _chunked(header: pb.ModelHeader, payload: bytes, chunk_bytes: int) -> list:
    """The Push chunks of a message: the header rides on the first."""
    view = memoryview(payload)
    chunks = [pb.ModelChunk(header=header, data=bytes(view[:chunk_bytes]))]
    for start in range(chunk_bytes, len(payload), chunk_bytes):
        chunks.append(pb.ModelChunk(data=bytes(view[start : start + chunk_bytes])))
    return chunks


def encode(
    sender: int,
    round_: int,
    vector: torch.Tensor,
    specs: Sequence[TensorSpec],
    *,
    num_samples: int = 1,
    train_loss: float = float("nan"),
    chunk_bytes: int = 1 << 20,
) -> list[pb.ModelChunk]:
    """Split a flat model into Push chunks; the header rides on the first chunk."""
    payload = vector.detach().to(torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()
    expected = sum(s.nbytes for s in specs)
    if len(payload) != expected:
        raise ValueError(f"vector has {len(payload)} bytes, the model layout needs {expected}")
    header = _header(sender, round_, specs, payload, num_samples=num_samples, train_loss=train_loss)
    return _chunked(header, payload, chunk_bytes)


def join_chunks(chunks: Iterable[pb.ModelChunk], max_bytes: int) -> tuple[pb.ModelHeader, bytes, int]:
    """Reassemble a Push stream: (header, payload, bytes on the wire).

    Stops reading as soon as the stream exceeds ``max_bytes`` or the size the header declared,
    so an oversized stream costs the receiver at most that much memory.
    """
    header = None
    parts: list[bytes] = []
    size = 0
    wire = 0
    for i, chunk in enumerate(chunks):
        wire += chunk.ByteSize()
        if i == 0:
            if not chunk.HasField("header"):
                raise WireError("no_header", "the first chunk carries no header")
            header = chunk.header
            if not header.HasField("sender"):
                raise WireError("no_sender", "the header names no sender")
            if header.total_bytes > max_bytes:
                raise WireError("too_large", f"{header.total_bytes} bytes > limit {max_bytes}")
        elif chunk.HasField("header"):
            raise WireError("bad_chunk", "a header appeared after the first chunk")
        size += len(chunk.data)
        if size > header.total_bytes:
            raise WireError("size_mismatch", f"stream longer than the declared {header.total_bytes} bytes")
        parts.append(chunk.data)
    if header is None:
        raise WireError("empty", "empty stream")
    if size != header.total_bytes:
        raise WireError("size_mismatch", f"got {size} bytes, header declared {header.total_bytes}")
    return header, b"".join(parts), wire


def decode(
    header: pb.ModelHeader,
    payload: bytes,
    specs: Sequence[TensorSpec],
    wire_bytes: int = 0,
    plausible: Plausible = Plausible(),
) -> ModelMessage:
    """Check a message against the receiver's model layout and turn it into a vector.

    Raises :class:`WireError` on any mismatch: no sender, tensor count, name, dtype, shape,
    byte size, checksum, a non-finite value, a value or a declared sample count outside
    ``plausible``. Text from the message goes into an error only through :func:`quote`.
    """
    _check_layout(header, specs)
    if header.origins:
        # A colluders' pool is never a neighbour's model (see decode_pool).
        raise WireError("pool_message", f"a pool of {len(header.origins)} models where a model was expected")
    expected = sum(s.nbytes for s in specs)
    if header.total_bytes != expected or len(payload) != expected:
        raise WireError("size_mismatch", f"{len(payload)} bytes, expected {expected}")
    error = plausible.samples_error(header.num_samples)
    if error is not None:
        raise error
    vector = _checked_values(header, payload, plausible)
    return ModelMessage(
        sender=header.sender,
        round=header.round,
        vector=vector,
        num_samples=header.num_samples,
        nbytes=wire_bytes,
        train_loss=plausible.train_loss(header.train_loss),
    )


def _check_layout(header: pb.ModelHeader, specs: Sequence[TensorSpec]) -> None:
    """A sender, and tensor specs equal to the receiver's model (names, dtypes, shapes)."""
    if not header.HasField("sender"):
        raise WireError("no_sender", "the header names no sender")
    if len(header.tensors) != len(specs):
        raise WireError("shape_mismatch", f"{len(header.tensors)} tensors, expected {len(specs)}")
    for got, want in zip(header.tensors, specs, strict=True):
        if got.dtype != want.dtype:
            raise WireError("dtype_mismatch", f"{quote(got.name)}: dtype {quote(got.dtype)}, expected {want.dtype!r}")
        if got.name != want.name or tuple(got.shape) != want.shape:
            raise WireError(
                "shape_mismatch", f"{quote(got.name)}{quote(tuple(got.shape[:8]))}, expected {want.name}{want.shape}"
            )


def _checked_values(header: pb.ModelHeader, payload: bytes, plausible: Plausible) -> torch.Tensor:
    """The payload as a flat float32 tensor once its checksum and values passed."""
    if zlib.crc32(payload) != header.crc32:
        raise WireError("bad_checksum", "payload CRC-32 does not match the header")
    array = np.frombuffer(payload, dtype=WIRE_DTYPES["float32"])
    # min/max propagate NaN, so one pass each finds both a non-finite and an out-of-range value.
    low, high = (float(array.min()), float(array.max())) if array.size else (0.0, 0.0)
    error = plausible.values_error(low, high)
    if error is not None:
        raise error
    return torch.from_numpy(array.astype(np.float32, copy=True))


@dataclass(frozen=True)
class PoolMessage:
    """A colluder's pool of round ``round``: ``vectors[i]`` is the model ``origins[i]`` sent it."""

    sender: int
    round: int
    origins: tuple[int, ...]
    vectors: torch.Tensor  # float32 [len(origins), D]
    nbytes: int = 0  # size on the wire, for accounting


def encode_pool(
    sender: int,
    round_: int,
    origins: Sequence[int],
    vectors: torch.Tensor,
    specs: Sequence[TensorSpec],
    *,
    chunk_bytes: int = 1 << 20,
) -> list[pb.ModelChunk]:
    """A pool as Push chunks: ``vectors [len(origins), D]`` back to back, ``origins`` in the
    header, whose tensor specs describe one model. Declares no size and no loss (a pool is not
    a model of its sender's)."""
    origins = [int(k) for k in origins]
    if len(set(origins)) != len(origins):
        raise ValueError(f"pool origins must be distinct, got {origins}")
    model_bytes = sum(s.nbytes for s in specs)
    rows = vectors.detach().to(torch.float32).reshape(len(origins), -1) if origins else vectors.new_empty(0, 0)
    payload = rows.contiguous().numpy().astype("<f4", copy=False).tobytes()
    if len(payload) != model_bytes * len(origins):
        raise ValueError(f"a pool of {len(origins)} models has {len(payload)} bytes, the model layout needs {model_bytes} each")
    header = _header(sender, round_, specs, payload, origins=origins)
    return _chunked(header, payload, chunk_bytes)


def pool_bytes(specs: Sequence[TensorSpec], num_clients: int) -> int:
    """The largest pool payload: one model of each client."""
    return num_clients * sum(s.nbytes for s in specs)


def decode_pool(
    header: pb.ModelHeader,
    payload: bytes,
    specs: Sequence[TensorSpec],
    wire_bytes: int = 0,
    plausible: Plausible = Plausible(),
    *,
    num_clients: int,
) -> PoolMessage:
    """Check a pool against the receiver's model layout and turn it into rows.

    Raises :class:`WireError` on: no sender, tensor specs unlike the model's; more origins
    than clients (``too_many_origins``), an origin outside ``0..num_clients-1``
    (``unknown_origin``), an origin named twice (``duplicate_origin``); a byte size other than
    one model per origin; a checksum mismatch; a non-finite or implausible value in any model.
    An empty pool (no origins, no payload) is valid: its sender received nothing."""
    _check_layout(header, specs)
    count = len(header.origins)
    if count > num_clients:
        raise WireError("too_many_origins", f"{count} origins, at most {num_clients} clients")
    origins = tuple(int(k) for k in header.origins)
    if any(k >= num_clients for k in origins):
        raise WireError("unknown_origin", f"origin {max(origins)} outside 0..{num_clients - 1}")
    if len(set(origins)) != count:
        raise WireError("duplicate_origin", "an origin is named twice")
    expected = count * sum(s.nbytes for s in specs)
    if header.total_bytes != expected or len(payload) != expected:
        raise WireError("size_mismatch", f"{len(payload)} bytes, expected {expected} for {count} models")
    vectors = _checked_values(header, payload, plausible)
    return PoolMessage(
        sender=header.sender,
        round=header.round,
        origins=origins,
        vectors=vectors.view(count, -1) if count else vectors.view(0, sum(s.numel for s in specs)),
        nbytes=wire_bytes,
    )
