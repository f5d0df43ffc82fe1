"""What the client needs from a transport; gRPC is one implementation.

A transport hands each received message to a ``Deliver`` callback (which validates and buffers
it, see :meth:`peer.client.client.Client.deliver`) on the thread it receives on (gRPC: its event
loop; in-process: the sender's round loop), so the callback must return promptly. It sends
without blocking the round loop, and tells the client when a neighbour cannot be reached at all,
so the client stops waiting for it instead of paying the round deadline every round."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from dfedrw.peer.transport.pb import peer_pb2 as pb

# (chunks of one message, the sender's id) -> (accepted, reason, own round). The id is the one
# the transport verified (gRPC: the peer certificate; torch.distributed: the sending rank), None
# where it authenticates nobody (in-process). A client's (peer.transport.intake.ModelIntake) also
# offers ``begin(first chunk, sender)`` (then ``add(chunk)`` per later chunk, ``end()`` for the
# verdict) and ``has_room(header)``, whether to read that message now: the gRPC server uses both,
# to decode each chunk into place as it comes and read no model before there is room.
Deliver = Callable[[Iterable[pb.ModelChunk], int | None], tuple[bool, str, int]]
# (peer id, state) -> None. States: "reachable" (it answered), "unreachable" (a send or
# receive failed for good), "shut_out" (this client's server refuses the peer's calls for a
# while: it sent past its rate bound, so nothing it sends can arrive until then).
Reachability = Callable[[int, str], None]


class Transport(Protocol):
    bytes_sent: int
    dropped: int  # messages never sent: pushed out of a full queue by newer ones
    skipped_stale: int  # messages never sent: the receiver had already passed their round

    def start(self, deliver: Deliver) -> str:
        """Start receiving; returns the address other peers reach this one at."""

    def connect(self, addresses: Mapping[int, str], on_reachability: Reachability) -> None:
        """Open connections to the given neighbours (id -> address)."""

    def wait_ready(self, timeout: float) -> list[int]:
        """Wait until every neighbour accepts connections; returns those that did not in time."""

    def send(self, to: int, chunks: list[pb.ModelChunk]) -> None:
        """Send one message without blocking (its chunks: a list, or a
        :class:`~dfedrw.peer.transport.chunks.WireMessage`, which builds them as they go)."""

    def flush(self, timeout: float) -> None:
        """Wait (bounded) for the sends in flight."""

    def close(self) -> None: ...
