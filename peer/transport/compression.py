"""What a model costs on the wire: the compressions a scenario can name (``network.compression``).

A compression is a class registered in :data:`COMPRESSION_REGISTRY` (or ``"module:Class"``, or a
plugin of the ``dfedrw.compressions`` entry-point group); its constructor's keyword parameters
are its settings (``[network.compression_params.NAME]``). The sender encodes each model it sends
(:class:`Encoder`); the receiver's intake checks the payload and rebuilds the model
(:class:`Decoder`) before any other check a model gets (its values against
``network.max_abs_value``), so a rule sees a rebuilt model exactly as a raw one. The header names
the encoding (``encoding``); a receiver takes raw models and its scenario's encoding, nothing
else (``bad_encoding``). Pure: bytes and tensors in and out; no transport here.

* ``none`` (:class:`NoCompression`): the raw little-endian float32 values.
* ``int8`` (:class:`Int8`): stateless, one encoding per round serves every neighbour. The header
  names the block size (``block``), which the payload's size cannot tell (blocks of other sizes
  can make as many scales): a receiver whose own differs refuses the message (``bad_encoding``).
* ``topk`` (:class:`TopK`): positions (increasing) and differences; what is not sent stays in the
  difference for a later message, the sender keeping per neighbour the model that neighbour
  holds of it. The header names the round of the message the difference is from
  (``base_round``): a receiver holding a model of another round (it lost a message, or
  restarted) rejects the message (``base_mismatch``) and waits for the next whole model, which
  the sender sends on every link first, every ``refresh`` messages after, and after a reply says
  ``base_mismatch`` or ``future_round`` (on transports whose replies reach the sender). Which
  messages change what a receiver holds: :meth:`Decoder.keep`.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from dfedrw.peer.registry import Registry, check_int, check_real
from dfedrw.peer.transport.chunks import WireMessage, _payload_view, wire_size
from dfedrw.peer.transport.ratelog import quote
from dfedrw.peer.transport.serde import TensorSpec, WireError, message_header, message_out

__all__ = ["COMPRESSION_REGISTRY", "Compression", "Decoder", "Encoder", "Int8", "NoCompression", "Outgoing", "TopK", "encoded_out"]

COMPRESSION_REGISTRY = Registry("compression", "dfedrw.compressions", required=("encode",))
"""The compressions by name; settings in a scenario's ``[network.compression_params.NAME]``."""

_LITTLE = sys.byteorder == "little"


def _as_bytes(array: np.ndarray) -> memoryview:
    array = np.ascontiguousarray(array)
    if not _LITTLE and array.dtype.itemsize > 1:
        array = array.astype(array.dtype.newbyteorder("<"))
    return memoryview(array.reshape(-1)).cast("B")


class Compression:
    """What every compression offers (see the module). ``encoding``: the header's name for
    its payloads ("" for raw values); ``stateful``: an encoding is a difference from what the
    receiver holds of the sender (per link state on both sides)."""

    encoding: ClassVar[str] = ""
    stateful: ClassVar[bool] = False

    def payload_bytes(self, numel: int) -> int:
        """The bytes of an encoded model of ``numel`` values."""
        return 4 * numel

    def header_fields(self) -> dict[str, Any]:
        """The header's fields (beyond the encoding) that say how its payload is to be read."""
        return {}

    def check_header(self, header) -> None:
        """Refuse (:class:`WireError`) a header of this encoding whose fields say its payload is
        to be read otherwise than this compression reads it (:meth:`header_fields`)."""
        if header.HasField("block"):
            raise WireError("bad_encoding", f"a {quote(header.encoding)} message names a block size")

    def encode(self, vector: torch.Tensor, base: torch.Tensor | None, generator: torch.Generator) -> tuple[memoryview, torch.Tensor | None]:
        """``vector`` (flat float32) as a payload, and what the receiver will rebuild from it
        (None: ``vector`` itself). ``base``: what the receiver holds of this sender (stateful
        kinds; the rebuilt model is ``base`` updated in place)."""
        return _payload_view(vector), None

    def decode(self, payload: memoryview, numel: int, base: torch.Tensor | None) -> torch.Tensor:
        """The model a checked payload rebuilds (``base``: what the receiver held of the
        sender, stateful kinds; updated in place and returned). Raises :class:`WireError`."""
        raise NotImplementedError


@COMPRESSION_REGISTRY.register("none")
class NoCompression(Compression):
    """The raw float32 values: 4 bytes a value, nothing lost."""


@COMPRESSION_REGISTRY.register("int8")
class Int8(Compression):
    """int8 quantisation with stochastic rounding: a float32 scale per ``block`` values (the
    block's largest magnitude / 127), each value an int8 multiple of its block's scale, rounded
    up with probability the fraction left over (unbiased). About 1 + 4/``block`` bytes a value."""

    encoding: ClassVar[str] = "int8"

    def __init__(self, block: int = 256) -> None:
        self.block = check_int("compression 'int8'", "block", block, minimum=1)
        if self.block > 1 << 20:
            raise ValueError(f"compression 'int8': block must be <= {1 << 20}, got {block!r}")

    def blocks(self, numel: int) -> int:
        return math.ceil(numel / self.block)

    def payload_bytes(self, numel: int) -> int:
        return 4 * self.blocks(numel) + numel

    def header_fields(self) -> dict[str, Any]:
        return {"block": self.block}

    def check_header(self, header) -> None:
        if not header.HasField("block"):
            raise WireError("bad_encoding", f"an int8 message without its block size; this network's is {self.block}")
        if header.block != self.block:
            raise WireError("bad_encoding", f"int8 blocks of {header.block} values; this network's are of {self.block}")

    def quantize(self, vector: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(scales float32 [blocks], values int8 [numel]) of ``vector``."""
        numel = vector.numel()
        padded = torch.zeros(self.blocks(numel) * self.block, dtype=torch.float32)
        padded[:numel] = vector.reshape(-1)
        rows = padded.view(-1, self.block)
        scales = rows.abs().amax(dim=1) / 127.0
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        noise = torch.rand(rows.shape, generator=generator, dtype=torch.float32)
        q = torch.floor(rows / safe[:, None] + noise).clamp_(-127, 127).to(torch.int8)
        return scales, q.reshape(-1)[:numel]

    @staticmethod
    def dequantize(scales: torch.Tensor, values: torch.Tensor, block: int) -> torch.Tensor:
        numel = values.numel()
        out = torch.zeros(math.ceil(numel / block) * block, dtype=torch.float32)
        out[:numel] = values.to(torch.float32)
        return (out.view(-1, block) * scales[:, None]).reshape(-1)[:numel].clone()

    def encode(self, vector, base, generator):
        scales, values = self.quantize(vector, generator)
        payload = np.concatenate([scales.numpy().astype("<f4").view(np.uint8), values.numpy().view(np.uint8)])
        return _as_bytes(payload), self.dequantize(scales, values, self.block)

    def decode(self, payload, numel, base):
        blocks = self.blocks(numel)
        raw = np.frombuffer(payload, dtype=np.uint8)
        scales = np.frombuffer(raw[: 4 * blocks].tobytes(), dtype="<f4").astype(np.float32)
        if not np.all(np.isfinite(scales)) or np.any(scales < 0):
            raise WireError("bad_encoding", "an int8 block scale is negative or not finite")
        values = torch.from_numpy(raw[4 * blocks :].view(np.int8).copy())
        return self.dequantize(torch.from_numpy(scales), values, self.block)


@COMPRESSION_REGISTRY.register("topk")
class TopK(Compression):
    """Top-k of the difference from the model the receiver holds of the sender, with error
    feedback (CHOCO-gossip's): ``fraction`` of the coordinates a message (at least one), 8 bytes
    each (uint32 position, float32 difference); a whole model on every link first and every
    ``refresh`` messages after (0: only when needed)."""

    encoding: ClassVar[str] = "topk"
    stateful: ClassVar[bool] = True

    def __init__(self, fraction: float = 0.1, refresh: int = 20) -> None:
        self.fraction = check_real("compression 'topk'", "fraction", fraction, positive=True)
        if self.fraction > 1:
            raise ValueError(f"compression 'topk': fraction must be in (0, 1], got {fraction!r}")
        self.refresh = check_int("compression 'topk'", "refresh", refresh, minimum=0)

    def whole_next(self, held_round: int | None, since_whole: int, round_: int) -> bool:
        """Whether a link's round-``round_`` message is a whole model: the receiver holds
        nothing of the sender (``held_round`` None) or a model of this round or later, or
        ``refresh`` messages are due since the last whole one (``since_whole`` differences)."""
        return held_round is None or held_round >= round_ or bool(self.refresh and since_whole + 1 >= self.refresh)

    def kept(self, numel: int) -> int:
        return max(1, min(numel, math.ceil(self.fraction * numel)))

    def payload_bytes(self, numel: int) -> int:
        return 8 * self.kept(numel)

    def encode(self, vector, base, generator):
        if base is None:
            raise ValueError("topk encodes a difference: give the model the receiver holds")
        difference = vector.reshape(-1) - base
        k = self.kept(vector.numel())
        positions = torch.topk(difference.abs(), k, sorted=False).indices.sort().values
        values = difference[positions]
        base[positions] += values  # what the receiver rebuilds, to the last bit
        payload = np.concatenate([positions.numpy().astype("<u4").view(np.uint8), values.numpy().astype("<f4").view(np.uint8)])
        return _as_bytes(payload), base

    def decode(self, payload, numel, base):
        if base is None:
            raise WireError("base_mismatch", "a difference from a model this receiver does not hold")
        k = self.kept(numel)
        raw = np.frombuffer(payload, dtype=np.uint8)
        positions = np.frombuffer(raw[: 4 * k].tobytes(), dtype="<u4").astype(np.int64)
        values = np.frombuffer(raw[4 * k :].tobytes(), dtype="<f4").astype(np.float32)
        if len(positions) and (positions[-1] >= numel or np.any(np.diff(positions) <= 0)):
            raise WireError("bad_encoding", "topk positions out of range or not increasing")
        if not np.all(np.isfinite(values)):
            raise WireError("non_finite", "a topk difference is NaN or Inf")
        index = torch.from_numpy(positions)
        base[index] += torch.from_numpy(values)
        return base


def encoded_out(
    sender: int,
    round_: int,
    payload: memoryview,
    specs: Sequence[TensorSpec],
    *,
    encoding: str,
    base_round: int | None = None,
    block: int | None = None,
    num_samples: int = 1,
    train_loss: float = float("nan"),
    scores: Mapping[int, float] | None = None,
    chunk_bytes: int = 1 << 20,
) -> WireMessage:
    """A model a compression encoded, as a message to send: ``payload`` as it is, the header
    naming ``encoding`` (and the ``base_round`` a difference is from, the ``block`` size of
    int8's scales: the compression's :meth:`~Compression.header_fields`)."""
    fields = {"num_samples": num_samples, "train_loss": train_loss, "encoding": encoding}
    if base_round is not None:
        fields["base_round"] = base_round
    if block is not None:
        fields["block"] = block
    return WireMessage(message_header(sender, round_, specs, payload, scores=scores, **fields), payload, chunk_bytes)


def rounding_generator(seed: int, sender: int, round_: int) -> torch.Generator:
    """Stochastic rounding of a sender's round, seeded by (seed, sender, round): bit-repeatable."""
    digest = hashlib.blake2b(f"compression:{seed}:{sender}:{round_}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))


class Encoder:
    """A client's sending side: each round's model as the message every neighbour gets
    (:meth:`round`), and what each link carried (``bytes_to``: peer -> bytes on the wire;
    ``dense_to``: peer -> whole models sent, stateful compressions). For a stateful compression
    it keeps, per neighbour, the model that neighbour rebuilt of this client (``bases``)."""

    def __init__(self, compression: Compression, sender: int, specs: Sequence[TensorSpec], *, seed: int, chunk_bytes: int) -> None:
        self.compression = compression
        self.sender = sender
        self.specs = tuple(specs)
        self.seed = seed
        self.chunk_bytes = chunk_bytes
        self.bases: dict[int, tuple[int, torch.Tensor]] = {}
        self.since_dense: dict[int, int] = {}
        self.bytes_to: dict[int, int] = {}
        self.dense_to: dict[int, int] = {}
        self.resync: set[int] = set()  # receivers whose reply said base_mismatch

    def round(self, round_: int, vector: torch.Tensor, *, num_samples: int, train_loss: float, scores: Mapping[int, float] | None = None) -> Outgoing:
        """Round ``round_``'s model, with the sender's declared size and loss and the ``scores``
        it shares (none: network.share_scores off)."""
        return Outgoing(self, round_, vector, num_samples, train_loss, scores)

    @property
    def total(self) -> int:
        """Bytes of every message it made for its links so far (what a round record counts)."""
        return sum(self.bytes_to.values())

    def counted(self, peer: int, message: WireMessage) -> WireMessage:
        self.bytes_to[peer] = self.bytes_to.get(peer, 0) + wire_size(message)
        return message

    def mismatch(self, peer: int) -> None:
        """``peer`` does not hold what this encoder counts on: it refused a difference
        (``base_mismatch``), or a message as too far ahead (``future_round``, which does not
        change what it holds, see :meth:`Decoder.keep`). Its next message is a whole model."""
        if self.compression.stateful:
            self.resync.add(peer)

    def final(self, name: str) -> dict[str, Any]:
        """What its final record gives of its links: ``bytes_to`` (receiver -> bytes on the
        wire) and, under compression ``name``, ``compression`` (its name and, for a stateful
        one, ``dense_to``: receiver -> whole models sent)."""
        out: dict[str, Any] = {"bytes_to": {str(k): v for k, v in sorted(self.bytes_to.items())}}
        if self.compression.encoding:
            out["compression"] = {"name": name}
            if self.compression.stateful:
                out["compression"]["dense_to"] = {str(k): v for k, v in sorted(self.dense_to.items())}
        return out


class Outgoing:
    """One round's model as each neighbour gets it: :meth:`to` (built once per neighbour; a
    stateless compression builds one message for all), :meth:`again` (sent again to a
    neighbour that came back: a whole model under a stateful compression)."""

    def __init__(
        self, encoder: Encoder, round_: int, vector: torch.Tensor, num_samples: int, train_loss: float, scores: Mapping[int, float] | None = None,
    ) -> None:
        self.encoder = encoder
        self.round = round_
        self.vector = vector
        self.num_samples = num_samples
        self.train_loss = train_loss
        self.scores = scores
        self._shared: WireMessage | None = None
        self._built: dict[int, WireMessage] = {}

    def _raw(self) -> WireMessage:
        e = self.encoder
        return message_out(
            e.sender, self.round, self.vector, e.specs, num_samples=self.num_samples, train_loss=self.train_loss, scores=self.scores, chunk_bytes=e.chunk_bytes,
        )

    def _encoded(self, payload: memoryview, base_round: int | None = None) -> WireMessage:
        e = self.encoder
        return encoded_out(
            e.sender, self.round, payload, e.specs, encoding=e.compression.encoding, base_round=base_round,
            num_samples=self.num_samples, train_loss=self.train_loss, scores=self.scores, chunk_bytes=e.chunk_bytes, **e.compression.header_fields(),
        )

    def to(self, peer: int) -> WireMessage:
        e = self.encoder
        if peer in self._built:
            return self._built[peer]
        compression = e.compression
        if not compression.stateful:
            if self._shared is None:
                if compression.encoding:
                    payload, _ = compression.encode(self.vector, None, rounding_generator(e.seed, e.sender, self.round))
                    self._shared = self._encoded(payload)
                else:
                    self._shared = self._raw()
            message = self._shared
        else:
            message = self._difference(peer)
        self._built[peer] = message
        return e.counted(peer, message)

    def _difference(self, peer: int) -> WireMessage:
        e = self.encoder
        held = e.bases.get(peer)
        since = e.since_dense.get(peer, 0)
        if peer in e.resync or e.compression.whole_next(None if held is None else held[0], since, self.round):
            return self._dense(peer)
        base_round, base = held
        payload, _ = e.compression.encode(self.vector, base, rounding_generator(e.seed, e.sender, self.round))
        e.bases[peer] = (self.round, base)
        e.since_dense[peer] = since + 1
        return self._encoded(payload, base_round)

    def _dense(self, peer: int) -> WireMessage:
        e = self.encoder
        e.bases[peer] = (self.round, self.vector.detach().reshape(-1).to(torch.float32).clone())
        e.since_dense[peer] = 0
        e.resync.discard(peer)
        e.dense_to[peer] = e.dense_to.get(peer, 0) + 1
        if self._shared is None:
            self._shared = self._raw()
        return self._shared

    def again(self, peer: int) -> WireMessage:
        """The message for a neighbour that came back (it may hold nothing of this client)."""
        e = self.encoder
        if not e.compression.stateful:
            return self.to(peer)
        message = self._built[peer] = self._dense(peer)
        return e.counted(peer, message)


class Decoder:
    """A client's receiving side of a compression: the payload size a header must declare
    (:meth:`payload_bytes`), the model an encoded payload rebuilds (:meth:`decode`), and, for a
    stateful compression, the model it holds of each sender (:meth:`keep`)."""

    def __init__(self, compression: Compression, specs: Sequence[TensorSpec]) -> None:
        self.compression = compression
        self.numel = sum(s.numel for s in specs)
        self.bases: dict[int, tuple[int, torch.Tensor]] = {}

    @property
    def stateful(self) -> bool:
        return self.compression.stateful

    def payload_bytes(self, header) -> int:
        """The payload a message with ``header`` must have; raises :class:`WireError` for an
        encoding this receiver does not take, or one it would read otherwise than the header
        says (``bad_encoding``)."""
        encoding = header.encoding
        if not encoding:
            if header.HasField("base_round") or header.HasField("block"):
                raise WireError("bad_encoding", "a whole model names a base round or a block size")
            return 4 * self.numel
        if encoding != self.compression.encoding:
            want = repr(self.compression.encoding) if self.compression.encoding else "none"
            raise WireError("bad_encoding", f"encoding {quote(encoding)}, this network takes raw models or {want}")
        if self.stateful != header.HasField("base_round"):
            raise WireError("bad_encoding", f"a {encoding} message {'without' if self.stateful else 'with'} a base round")
        self.compression.check_header(header)
        return self.compression.payload_bytes(self.numel)

    def decode(self, header, payload: memoryview) -> torch.Tensor:
        """The model an encoded payload (checksum checked) rebuilds; raises :class:`WireError`.
        Under a stateful compression the sender's held model is not changed (:meth:`keep` does)."""
        base = None
        if self.stateful:
            held = self.bases.get(header.sender)
            if held is None or held[0] != header.base_round or header.round <= held[0]:
                have = "nothing" if held is None else f"round {held[0]}"
                raise WireError("base_mismatch", f"a difference from round {header.base_round}; this receiver holds {have} of client {header.sender}")
            base = held[1].clone()
        return self.compression.decode(payload, self.numel, base)

    def keep(self, sender: int, round_: int, vector: torch.Tensor, *, owned: bool = False) -> None:
        """``vector``, the sender's checked round-``round_`` model, is what this receiver now
        holds of ``sender`` (stateful compressions only; copied unless ``owned``: a model
        :meth:`decode` rebuilt, which nothing else holds). One of an earlier round than the model
        held changes nothing; one of the same round (only a whole model: :meth:`decode` takes a
        difference only of a later round than its base) replaces it, even after a difference of
        it: the round's model sent again, whole, to a neighbour that came back
        (:meth:`Outgoing.again`) is what the sender counts on from then.

        The intake sends here every message that passed its own checks (form, checksum, which
        covers its rounds, values), kept by the inbox or not: what a receiver holds must stay
        what the sender's :class:`Encoder` counts on, and the encoder moves its copy with every
        message, told otherwise only by a reply (:meth:`Encoder.mismatch`). One that arrived
        after its round passed (``stale_round``: at a slow receiver, or one rejoining) still
        carries the difference the sender's next message is from; left out, that one would be a
        ``base_mismatch`` and cost a whole model. Not one refused as too far ahead
        (``future_round``): the inbox does not believe that round, and held, a label the sender's
        later messages do not reach would refuse each of its differences and earlier whole
        models, the link alternating between the two until then; left out, it costs a sender
        that far ahead one whole model, which the reply tells it to send."""
        if not self.stateful:
            return
        held = self.bases.get(sender)
        if held is None or held[0] <= round_:
            vector = vector.detach().reshape(-1)
            self.bases[sender] = (round_, vector if owned else vector.to(torch.float32).clone())
