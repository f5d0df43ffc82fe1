"""Model messages on the wire: raw little-endian tensor bytes plus a header, never pickle.

A model is a flat float32 vector on the client side; on the wire it is the concatenation of
its parameter tensors, each described by a :class:`TensorSpec`, so a receiver can check every
name, dtype and shape against its own model before it touches the bytes.

What a message declares is checked too, not only its form: :class:`Plausible` bounds the
values a model may hold and the training-set size a sender may claim (DFedAvg weights by it),
and a declared loss outside its range is read as absent. Pure: no transport here. A model
message never names ``origins``, as a colluders' pool does (:mod:`peer.transport.pools`):
:func:`decode` rejects one that does (``pool_message``).

No model is copied on its way to the wire or off it. :func:`message_out` wraps the sender's own
tensor in a :class:`WireMessage`, whose chunks are cut from its bytes as the transport writes
them; a receiver checks a message's header first, then decodes each chunk straight into a
buffer sized once from that header (:class:`PayloadDecoder`, checking the checksum and values
as the chunks come), and a gRPC server reads a data chunk as a view of the bytes it received
(:func:`parse_chunk`)."""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dfedrw.peer.transport.chunks import WireMessage, _payload_view
from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.ratelog import quote

WIRE_DTYPES = {"float32": np.dtype("<f4")}
_FLOAT32_MAX = float(np.finfo(np.float32).max)

# A message of more than this many bytes is a large one: the transport keeps fewer of them
# queued and gives one up rather than let it hold memory (grpc_sender), and a receiver reads one
# for a later round only while it has room (the client's intake).
LARGE_MESSAGE = 16 << 20


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

    ``max_abs_value`` (``network.max_abs_value``): the largest magnitude of a parameter of this
    scenario's models; a message holding more is rejected as ``implausible``. ``max_num_samples``:
    the most training samples a sender can have (the dataset's whole training set); a declared
    size outside ``[1, max_num_samples]`` is rejected as ``implausible_samples``.
    ``max_train_loss``: a declared loss outside ``[0, max_train_loss]`` or not finite is read as
    absent (NaN), not rejected: the loss is optional (senders without one send NaN) and only
    q-FDFL uses it, leaving out a candidate without one. ``clients``: a message's scores may name
    ids ``0 .. clients - 1``; ``max_scores``: the most scores a sender can have (the most
    candidates a client of the scenario aggregates: 0 takes none). Scores that break either, name
    an id twice, are not finite, or do not pair every id with a value are rejected as
    ``implausible_scores``."""

    max_abs_value: float = 1e6
    max_num_samples: int = 10_000_000
    max_train_loss: float = 1e6
    clients: int = 0
    max_scores: int = 0

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

    def model_error(self, vector: torch.Tensor) -> WireError | None:
        """:meth:`values_error` of a whole model (one with no values has none): what every
        receiver's intake, and the batched engine in its place, finds of it."""
        low, high = torch.aminmax(vector) if vector.numel() else (0.0, 0.0)
        return self.values_error(float(low), float(high))

    def train_loss(self, loss: float) -> float:
        """A declared training loss as believed: NaN when out of range (absent)."""
        return loss if 0.0 <= loss <= self.max_train_loss else float("nan")

    def scores_error(self, ids: Sequence[int], values: Sequence[float]) -> WireError | None:
        """The error for a message's scores (``ids[i]`` scored ``values[i]``), or None."""
        if not ids and not values:
            return None
        if len(ids) != len(values):
            return WireError("implausible_scores", f"{len(ids)} ids for {len(values)} scores")
        if len(ids) > self.max_scores:
            return WireError("implausible_scores", f"{len(ids)} scores, more than the {self.max_scores} candidates a client has")
        if len(set(ids)) != len(ids):
            return WireError("implausible_scores", "an id scored twice")
        if max(ids) >= self.clients:
            return WireError("implausible_scores", f"scores id {max(ids)}, not a client of 0..{self.clients - 1}")
        if not all(map(math.isfinite, values)):
            return WireError("implausible_scores", "a score is NaN or Inf")
        return None


@dataclass(frozen=True)
class ModelMessage:
    sender: int
    round: int
    vector: torch.Tensor  # flat float32
    num_samples: int = 0
    nbytes: int = 0  # size on the wire, for accounting
    train_loss: float = float("nan")  # declared by the sender; NaN when absent or out of range
    # What the sender's rule scored at its aggregation before this model: id -> score (empty
    # when it shares none; network.share_scores).
    scores: Mapping[int, float] = field(default_factory=dict)


def score_fields(scores: Mapping[int, float] | None) -> dict[str, list]:
    """A header's fields for ``scores`` (id -> score), ids ascending; none for no scores."""
    if not scores:
        return {}
    ids = sorted(scores)
    return {"scored": ids, "scores": [scores[k] for k in ids]}


def shareable(scores: Mapping[int, float] | None) -> dict[int, float] | None:
    """What of a rule's ``scores`` (id -> score) a message can carry: the scores finite as float32
    (a receiver refuses a message holding any other); None for none."""
    if scores is None:
        return None
    return {k: v for k, v in scores.items() if abs(v) <= _FLOAT32_MAX}  # NaN compares false


def checksum_start(header: pb.ModelHeader) -> int:
    """The CRC-32 a message's checksum runs on from into its payload: of its ``round``, then its
    ``base_round`` if named (8 bytes each), then its scores if any (the ids as 4 bytes each, then
    the float32 values), all little-endian. The rounds say what the payload is (which round's
    model, which model a difference is from): one changed on the way fails the checksum as a
    changed payload byte does, instead of placing the model in another round or relabelling
    what a receiver holds of its sender."""
    start = zlib.crc32(header.round.to_bytes(8, "little"))
    if header.HasField("base_round"):
        start = zlib.crc32(header.base_round.to_bytes(8, "little"), start)
    if header.scored or header.scores:
        start = zlib.crc32(np.asarray(header.scored, dtype="<u4").tobytes(), start)
        start = zlib.crc32(np.asarray(header.scores, dtype="<f4").tobytes(), start)
    return start


@functools.lru_cache(maxsize=8)
def _layout_header(specs: tuple[TensorSpec, ...]) -> pb.ModelHeader:
    """A header holding only the layout ``specs`` (a client sends one layout all run long)."""
    return pb.ModelHeader(tensors=[pb.TensorSpec(name=s.name, dtype=s.dtype, shape=list(s.shape)) for s in specs])


def message_header(
    sender: int, round_: int, specs: Sequence[TensorSpec], payload: memoryview, *, scores: Mapping[int, float] | None = None, **fields
) -> pb.ModelHeader:
    """The header of a message whose payload is ``payload``, laid out as ``specs``, carrying
    ``scores`` (id -> score, see :func:`score_fields`); its checksum covers its rounds, its
    scores and the payload (:func:`checksum_start`)."""
    header = pb.ModelHeader()
    header.CopyFrom(_layout_header(tuple(specs)))  # the layout's specs, built once
    header.MergeFrom(pb.ModelHeader(sender=sender, round=round_, total_bytes=len(payload), **fields, **score_fields(scores)))
    header.crc32 = zlib.crc32(payload, checksum_start(header))
    return header


def message_out(
    sender: int,
    round_: int,
    vector: torch.Tensor,
    specs: Sequence[TensorSpec],
    *,
    num_samples: int = 1,
    train_loss: float = float("nan"),
    scores: Mapping[int, float] | None = None,
    chunk_bytes: int = 1 << 20,
) -> WireMessage:
    """A flat model as a message to send (its bytes not copied; see :class:`WireMessage`)."""
    payload = _payload_view(vector)
    expected = sum(s.nbytes for s in specs)
    if len(payload) != expected:
        raise ValueError(f"vector has {len(payload)} bytes, the model layout needs {expected}")
    header = message_header(sender, round_, specs, payload, num_samples=num_samples, train_loss=train_loss, scores=scores)
    return WireMessage(header, payload, chunk_bytes)


def encode(*args, **kwargs) -> list[pb.ModelChunk]:
    """Split a flat model into Push chunks; the header rides on the first: :func:`message_out`'s
    chunks (same arguments), as protobuf messages."""
    return list(message_out(*args, **kwargs))


# ----------------------------------------------------------------------------------- receiving


_FLOAT32 = WIRE_DTYPES["float32"]


class PayloadDecoder:
    """One message's payload as its chunks arrive, written into ``buffer`` (a flat tensor of
    exactly the declared ``total_bytes``, allocated once by the receiver), or only checked
    when there is none (a message the receiver will not keep still gets its verdict).

    :meth:`add` places each chunk where the data before it ended, after checking it starts
    there (its ``offset``, when the sender gave one) and fits in what the header declared; the
    CRC-32 (run on from ``crc_start``: a message's :func:`checksum_start`, 0: the payload's
    alone) and, with ``plausible``, the smallest and largest float32 value are updated from the
    chunk as it passes (vectorised: no loop over values). :meth:`finish` checks that the whole
    payload came, :meth:`verify` the checksum and the values. Each raises :class:`WireError`:
    ``chunk_out_of_order`` / ``chunk_overlap`` (an offset past or before where the data so far
    ends), ``size_mismatch`` (longer or shorter than declared), ``bad_checksum``, ``non_finite``,
    ``implausible``. With ``crc32`` None (a verdict known already) only the size is followed."""

    def __init__(
        self, total_bytes: int, crc32: int | None, plausible: Plausible | None = None, buffer: torch.Tensor | None = None,
        lock: threading.Lock | None = None, *, crc_start: int = 0,
    ) -> None:
        self.total_bytes = total_bytes
        self.crc32 = crc32
        self.plausible = plausible
        self.have = 0
        self._crc = crc_start
        self._into: tuple[torch.Tensor, memoryview] | None = None
        if buffer is not None:
            if buffer.data_ptr() != buffer.contiguous().data_ptr() or buffer.dtype not in (torch.float32, torch.uint8):
                raise ValueError("the buffer must be a contiguous float32 or uint8 tensor")
            # uint8: an encoded payload's bytes (a compression's), kept as they come.
            into = _payload_view(buffer) if buffer.dtype == torch.float32 else memoryview(buffer.numpy().reshape(-1)).cast("B")
            if len(into) != total_bytes:
                raise ValueError(f"a buffer of {len(into)} bytes for a payload of {total_bytes}")
            self._into = (buffer, into)
        # Held while a chunk is copied into the buffer: whoever lets go of the buffer from
        # another thread (drop_buffer) holds it too, so no copy is left half done.
        self._lock = lock or contextlib.nullcontext()
        self._carry = b""  # the bytes of a value cut by a chunk boundary
        self._values = 0
        self._low = math.inf
        self._high = -math.inf
        self._nan = False

    @property
    def tensor(self) -> torch.Tensor | None:
        """The buffer the payload went into (None: it was not kept)."""
        into = self._into
        return None if into is None else into[0]

    def drop_buffer(self) -> None:
        """Stop keeping the payload (from any thread, holding the decoder's lock when it has
        one): the buffer is let go now; the chunks that follow are still checked."""
        self._into = None

    def add(self, data, offset: int | None = None) -> None:
        start, n = self.have, len(data)
        if offset is not None and offset != start:
            reason = "chunk_out_of_order" if offset > start else "chunk_overlap"
            raise WireError(reason, f"a chunk at offset {offset}, the data so far ends at {start}")
        if start + n > self.total_bytes:
            raise WireError("size_mismatch", f"stream longer than the declared {self.total_bytes} bytes")
        with self._lock:
            into = self._into
            if into is not None:
                into[1][start : start + n] = data
        if self.crc32 is not None:
            self._crc = zlib.crc32(data, self._crc)
        if self.plausible is not None:
            self._check(memoryview(data))
        self.have = start + n

    def _check(self, data: memoryview) -> None:
        if self._carry:
            need = 4 - len(self._carry)
            self._carry += bytes(data[:need])
            data = data[need:]
            if len(self._carry) < 4:
                return
            self._extremes(np.frombuffer(self._carry, dtype=_FLOAT32))
            self._carry = b""
        whole = len(data) - len(data) % 4
        if whole:
            self._extremes(np.frombuffer(data[:whole], dtype=_FLOAT32))
        self._carry = bytes(data[whole:])

    def _extremes(self, values: np.ndarray) -> None:
        # min/max propagate NaN: one pass each finds a non-finite value and the range.
        low, high = float(values.min()), float(values.max())
        self._values += len(values)
        if math.isnan(low) or math.isnan(high):
            self._nan = True
        else:
            self._low, self._high = min(self._low, low), max(self._high, high)

    def finish(self) -> None:
        if self.have != self.total_bytes:
            raise WireError("size_mismatch", f"got {self.have} bytes, header declared {self.total_bytes}")

    def verify(self) -> None:
        if self.crc32 is not None and self._crc != self.crc32:
            raise WireError("bad_checksum", "payload CRC-32 does not match the header")
        if self.plausible is None:
            return
        if self._nan:
            low = high = math.nan
        else:
            low, high = (self._low, self._high) if self._values else (0.0, 0.0)
        error = self.plausible.values_error(low, high)
        if error is not None:
            raise error


def join_chunks(chunks: Iterable[pb.ModelChunk], max_bytes: int) -> tuple[pb.ModelHeader, bytes, int]:
    """Reassemble a Push stream: (header, payload, bytes on the wire). For tools and tests: a
    client decodes each chunk into place (:class:`PayloadDecoder`). Stops reading as soon as the
    stream exceeds ``max_bytes`` or the declared size: an oversized stream costs at most that."""
    header = None
    parts: list[bytes] = []
    size = 0
    wire = 0
    for i, chunk in enumerate(chunks):
        wire += chunk.ByteSize()
        if i == 0:
            header = first_header(chunk, max_bytes)
        elif chunk.HasField("header"):
            raise WireError("bad_chunk", "a header appeared after the first chunk")
        elif chunk.HasField("offset") and chunk.offset != size:
            raise WireError("chunk_out_of_order" if chunk.offset > size else "chunk_overlap", f"a chunk at offset {chunk.offset}, the data so far ends at {size}")
        size += len(chunk.data)
        if size > header.total_bytes:
            raise WireError("size_mismatch", f"stream longer than the declared {header.total_bytes} bytes")
        parts.append(chunk.data)
    if header is None:
        raise WireError("empty", "empty stream")
    if size != header.total_bytes:
        raise WireError("size_mismatch", f"got {size} bytes, header declared {header.total_bytes}")
    return header, b"".join(parts), wire


def first_header(chunk, max_bytes: int) -> pb.ModelHeader:
    """The header a message's first chunk carries, if it names a sender and declares at most
    ``max_bytes``; raises :class:`WireError` (``no_header``, ``no_sender``, ``too_large``)."""
    if not chunk.HasField("header"):
        raise WireError("no_header", "the first chunk carries no header")
    header = chunk.header
    if not header.HasField("sender"):
        raise WireError("no_sender", "the header names no sender")
    if header.total_bytes > max_bytes:
        raise WireError("too_large", f"{header.total_bytes} bytes > limit {max_bytes}")
    return header


def check_model_header(
    header: pb.ModelHeader, specs: Sequence[TensorSpec], plausible: Plausible = Plausible(), payload_bytes: int | None = None
) -> None:
    """What a model message's header must say for its payload to be read: a sender, tensor
    specs equal to the receiver's model, no origins, the model's size (``payload_bytes``: the
    size its encoding must have, which a receiver's compression checked; None: raw values
    only), a plausible sample count, plausible scores. Raises :class:`WireError`."""
    _check_layout(header, specs)
    if header.origins:
        # A colluders' pool is never a neighbour's model (see decode_pool).
        raise WireError("pool_message", f"a pool of {len(header.origins)} models where a model was expected")
    if payload_bytes is None and (header.encoding or header.HasField("base_round") or header.HasField("block")):
        raise WireError("bad_encoding", f"encoding {quote(header.encoding)}: this network takes raw models only")
    expected = sum(s.nbytes for s in specs) if payload_bytes is None else payload_bytes
    if header.total_bytes != expected:
        raise WireError("size_mismatch", f"{header.total_bytes} bytes, expected {expected}")
    error = plausible.samples_error(header.num_samples) or plausible.scores_error(header.scored, header.scores)
    if error is not None:
        raise error


def model_message(header: pb.ModelHeader, vector: torch.Tensor, wire_bytes: int, plausible: Plausible) -> ModelMessage:
    """The message a header passed by :func:`check_model_header` and its checked payload make."""
    return ModelMessage(
        sender=header.sender,
        round=header.round,
        vector=vector,
        num_samples=header.num_samples,
        nbytes=wire_bytes,
        train_loss=plausible.train_loss(header.train_loss),
        scores=dict(zip(header.scored, header.scores)),
    )


def decode(
    header: pb.ModelHeader,
    payload: bytes,
    specs: Sequence[TensorSpec],
    wire_bytes: int = 0,
    plausible: Plausible = Plausible(),
) -> ModelMessage:
    """Check a message against the receiver's model layout and turn it into a vector. Raises
    :class:`WireError` on any mismatch: no sender, tensor count, name, dtype, shape, byte size,
    checksum (of the rounds and payload), a non-finite value, a value or declared sample count
    outside ``plausible``. Text from the message enters an error only through :func:`quote`."""
    check_model_header(header, specs, plausible)
    if len(payload) != header.total_bytes:
        raise WireError("size_mismatch", f"{len(payload)} bytes, expected {header.total_bytes}")
    return model_message(header, _checked_values(header, payload, plausible), wire_bytes, plausible)


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
    vector = torch.empty(len(payload) // _FLOAT32.itemsize, dtype=torch.float32)
    decoder = PayloadDecoder(len(payload), header.crc32, plausible, vector, crc_start=checksum_start(header))
    decoder.add(payload)
    decoder.verify()
    return vector
