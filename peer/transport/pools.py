"""Pool messages: what colluding Byzantine clients send each other, the honest models one of
them received in a round, back to back, with ``origins`` naming whose each is. A pool gets
every check a model message gets (:mod:`peer.transport.serde`), per model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dfedrw.peer.transport.chunks import WireMessage, _payload_view
from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.serde import Plausible, TensorSpec, WireError, _check_layout, _checked_values, message_header


@dataclass(frozen=True)
class PoolMessage:
    """A colluder's pool of round ``round``: ``vectors[i]`` is the model ``origins[i]`` sent it."""

    sender: int
    round: int
    origins: tuple[int, ...]
    vectors: torch.Tensor  # float32 [len(origins), D]
    nbytes: int = 0  # size on the wire, for accounting


def pool_out(
    sender: int,
    round_: int,
    origins: Sequence[int],
    vectors: torch.Tensor,
    specs: Sequence[TensorSpec],
    *,
    chunk_bytes: int = 1 << 20,
) -> WireMessage:
    """A pool to send: ``vectors [len(origins), D]`` back to back (not copied), ``origins`` in the
    header, specs of one model; it declares no size or loss (not its sender's model)."""
    origins = [int(k) for k in origins]
    if len(set(origins)) != len(origins):
        raise ValueError(f"pool origins must be distinct, got {origins}")
    model_bytes = sum(s.nbytes for s in specs)
    rows = vectors.detach().to(torch.float32).reshape(len(origins), -1) if origins else vectors.new_empty(0, 0)
    payload = _payload_view(rows)
    if len(payload) != model_bytes * len(origins):
        raise ValueError(f"a pool of {len(origins)} models has {len(payload)} bytes, the model layout needs {model_bytes} each")
    return WireMessage(message_header(sender, round_, specs, payload, origins=origins), payload, chunk_bytes)


def pool_bytes(specs: Sequence[TensorSpec], num_clients: int) -> int:
    """The largest pool payload: one model of each client."""
    return num_clients * sum(s.nbytes for s in specs)


def check_pool_header(header: pb.ModelHeader, specs: Sequence[TensorSpec], *, num_clients: int) -> tuple[int, ...]:
    """The origins of a pool whose header may be read (see :func:`decode_pool`); raises
    :class:`WireError`."""
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
    if header.total_bytes != expected:
        raise WireError("size_mismatch", f"{header.total_bytes} bytes, expected {expected} for {count} models")
    return origins


def pool_message(header: pb.ModelHeader, origins: tuple[int, ...], vectors: torch.Tensor, specs: Sequence[TensorSpec], wire_bytes: int) -> PoolMessage:
    """The pool a header passed by :func:`check_pool_header` and its checked payload make."""
    count = len(origins)
    return PoolMessage(
        sender=header.sender,
        round=header.round,
        origins=origins,
        vectors=vectors.view(count, -1) if count else vectors.view(0, sum(s.numel for s in specs)),
        nbytes=wire_bytes,
    )


def decode_pool(
    header: pb.ModelHeader,
    payload: bytes,
    specs: Sequence[TensorSpec],
    wire_bytes: int = 0,
    plausible: Plausible = Plausible(),
    *,
    num_clients: int,
) -> PoolMessage:
    """Check a pool against the receiver's model layout and turn it into rows. Raises
    :class:`WireError` on: no sender, tensor specs unlike the model's; more origins than clients
    (``too_many_origins``), an origin outside ``0..num_clients-1`` (``unknown_origin``), an
    origin named twice (``duplicate_origin``); a byte size other than one model per origin; a
    checksum mismatch; a non-finite or implausible value in any model. An empty pool (no
    origins, no payload) is valid: its sender received nothing."""
    origins = check_pool_header(header, specs, num_clients=num_clients)
    if len(payload) != header.total_bytes:
        raise WireError("size_mismatch", f"{len(payload)} bytes, expected {header.total_bytes} for {len(origins)} models")
    return pool_message(header, origins, _checked_values(header, payload, plausible), specs, wire_bytes)
