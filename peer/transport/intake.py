"""A client's receive path: every incoming message checked, decoded into place, and kept or
rejected, chunk by chunk as it arrives (:meth:`ModelIntake.begin`, the gRPC transport's way) or
whole (:meth:`ModelIntake.__call__`, every other transport).

When a message's header arrives its verdict is mostly known: who sent it (a stranger is turned away
before any tensor byte is read), whether its layout is the model's, whether its round has a place in
the inbox. Only a message the inbox can keep gets a buffer, sized once from its header (a row of the
round's matrix, :meth:`~dfedrw.peer.transport.inbox.Inbox.reserve`), each chunk copied into it as it
comes, checksum and values checked on the way
(:class:`~dfedrw.peer.transport.serde.PayloadDecoder`). Any other message is followed to its end
unkept, so a message is rejected for its first defect in this order, whatever its size: the stream
(no header, too large, longer or shorter than declared, a chunk out of place), the sender
(impersonation; a stranger, or a sender not of the round's graph; a colluder's pool goes to
:class:`~dfedrw.peer.client.collusion.Collusion`), the header (layout, size, declared samples), the
payload (checksum, values), the inbox (stale, too far ahead, a second copy, full). Every message
ends in exactly one of the inbox's counters; nothing in it can raise out of here (``malformed``).

A compressed model, and under a compression that sends differences (``topk``) a whole one too,
is received into a buffer of its own and put into the inbox's row at the end (a compressed one
rebuilt first): under ``topk`` it is what this client holds of its sender from then on, whatever
the inbox does with it (:meth:`~dfedrw.peer.transport.compression.Decoder.keep`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from dfedrw.peer.transport.compression import Decoder
from dfedrw.peer.transport.heap_trim import release_free_heap
from dfedrw.peer.transport.inbox import Inbox, Slot
from dfedrw.peer.transport.pools import check_pool_header, pool_message
from dfedrw.peer.transport.serde import (
    LARGE_MESSAGE, PayloadDecoder, Plausible, TensorSpec, WireError, check_model_header, checksum_start, first_header,
    model_message,
)

# (sender, round, accepted, reason, sender presumed gone before) of every model message that
# reached the inbox: the client re-arms neighbours that came back.
AfterOffer = Callable[[int, int, bool, str, bool], None]


class ModelIntake:
    """The receive path of one client (see the module). ``max_bytes``: the most a message may
    declare; ``collusion``: a colluding Byzantine client's pool exchange (its colluders' pools
    come through here too); ``after``: told of every model message the inbox judged."""

    def __init__(
        self, inbox: Inbox, specs: tuple[TensorSpec, ...], plausible: Plausible, max_bytes: int, *, collusion: Any = None,
        after: AfterOffer | None = None, decoder: Decoder | None = None,
    ) -> None:
        self.inbox = inbox
        # The network's compression (network.compression): None takes raw models only.
        self.decoder = decoder
        self.specs = specs
        self.plausible = plausible
        self.max_bytes = max_bytes
        self.collusion = collusion
        self.after = after or (lambda sender, round_, accepted, reason, was_gone: None)

    def __call__(self, chunks: Iterable, sender: int | None = None) -> tuple[bool, str, int]:
        """One whole message: (accepted, reason, this client's round)."""
        message = None
        try:
            chunks = iter(chunks)
            first = next(chunks, None)
            if first is None:
                return (*self.inbox.reject("empty", "empty stream"), self.inbox.round)
            message = self.begin(first, sender)
            for chunk in chunks:
                message.add(chunk)
        except Exception as exc:  # noqa: BLE001 - a stream that breaks is a message rejected
            if message is None:
                return (*self.inbox.reject("malformed", type(exc).__name__), self.inbox.round)
            message.fail(("malformed", type(exc).__name__))
        return message.end()

    def progress(self) -> int:
        """The client's round, as its transport counts it for the senders' rate bounds (under
        asynchronous gossip 0: no round of the receiver's moves on)."""
        return self.inbox.round

    def has_room(self, header) -> bool:
        """Whether a message with ``header`` is to be read now. A large one for a later round
        than the client's waits while the inbox already holds a whole round's models (the client
        is about to aggregate; meanwhile gRPC's flow control holds the sender, and the client
        holds no second round's models on top of the first); anything else is read at once."""
        return header.total_bytes <= LARGE_MESSAGE or self.inbox.room_for(header.round)

    def begin(self, first, sender: int | None = None) -> "Incoming":
        """The message that ``first`` begins, from ``sender`` (the id the transport
        authenticated; None: it authenticates nobody): add each chunk that follows, then end."""
        return Incoming(self, first, sender)


class Incoming:
    """One message as it arrives (see the module for the order of its checks)."""

    def __init__(self, intake: ModelIntake, first, sender: int | None) -> None:
        self.intake = intake
        self.sender = sender
        self.header = None
        self.wire = 0
        self.decoder: PayloadDecoder | None = None
        self.slot: Slot | str | None = None
        self.origins: tuple[int, ...] | None = None  # set for a colluder's pool
        self.buffer: torch.Tensor | None = None  # a pool's
        self.encoded: torch.Tensor | None = None  # a compressed model's payload, as it came
        self.whole: torch.Tensor | None = None  # a whole model this client holds of its sender once checked
        # What ends the message, by the order of the checks: a verdict counted already (a
        # stranger), a defect of the stream (later chunks are not read), one found in its header.
        self.verdict: tuple[bool, str] | None = None
        self.broken: tuple[str, str] | None = None
        self.refusal: tuple[str, str] | None = None
        try:
            self._start(first)
        except WireError as exc:
            self.broken = (exc.reason, exc.detail)
        except Exception as exc:  # noqa: BLE001 - a message no check foresaw is still only rejected
            self.broken = ("malformed", type(exc).__name__)

    def _start(self, first) -> None:
        intake, inbox, sender = self.intake, self.intake.inbox, self.sender
        pools = intake.collusion.peers if intake.collusion is not None else ()
        if sender is not None and sender not in pools:
            # A stranger is turned away before a byte of its model is read.
            refused = inbox.screen(sender)
            if refused is not None:
                self.verdict = refused
                return
        self.wire = first.ByteSize()
        header = self.header = first_header(first, intake.max_bytes)
        if sender is not None and header.sender != sender:
            # The sender is who its certificate says, never who the message says.
            self.refusal = ("impersonation", f"client {sender} claimed to be {header.sender}")
        elif header.sender in pools:
            self._start_pool(header)
        else:
            self._start_model(header)
        if self.decoder is None:  # the verdict is known: only the message's end is followed
            self.decoder = PayloadDecoder(header.total_bytes, None)
        self._take(first)

    def _start_pool(self, header) -> None:
        # Colluders send each other pools only, never models.
        try:
            self.origins = check_pool_header(header, self.intake.specs, num_clients=self.intake.collusion.num_clients)
        except WireError as exc:
            self.refusal = (exc.reason, exc.detail)
            return
        self.buffer = torch.empty(header.total_bytes // 4, dtype=torch.float32)
        self.decoder = PayloadDecoder(header.total_bytes, header.crc32, self.intake.plausible, self.buffer, crc_start=checksum_start(header))

    def _start_model(self, header) -> None:
        intake, inbox = self.intake, self.intake.inbox
        # Screened before decoding, so a stranger costs no tensor work (under a schedule, one
        # that does not send to this client in the message's round too).
        self.refusal = inbox.screened(header.sender, header.round)
        if self.refusal is not None:
            return
        codec = intake.decoder
        try:
            check_model_header(header, intake.specs, intake.plausible, None if codec is None else codec.payload_bytes(header))
        except WireError as exc:
            self.refusal = (exc.reason, exc.detail)
            return
        self.slot = inbox.reserve(header.sender, header.round)
        if header.encoding:
            # Its payload kept whatever the inbox does (see the module); rebuilt and checked last.
            self.encoded = torch.empty(header.total_bytes, dtype=torch.uint8)
            self.decoder = PayloadDecoder(header.total_bytes, header.crc32, None, self.encoded, crc_start=checksum_start(header))
        elif codec is not None and codec.stateful and self._moves_held():
            # A whole model under a stateful compression, held even if the inbox lets go of its row
            # or keeps none (see the module): copied into the row at the end; keep() copies nothing.
            self.whole = torch.empty(header.total_bytes // 4, dtype=torch.float32)
            self.decoder = PayloadDecoder(header.total_bytes, header.crc32, intake.plausible, self.whole, crc_start=checksum_start(header))
        elif isinstance(self.slot, Slot):
            self.decoder = PayloadDecoder(
                header.total_bytes, header.crc32, intake.plausible, self.slot.buffer, self.slot.lock, crc_start=checksum_start(header),
            )
            # The inbox lets go of the buffer if the client moves past the round, or takes it, meanwhile.
            self.slot.on_release = self.decoder.drop_buffer
        else:
            self.decoder = PayloadDecoder(header.total_bytes, header.crc32, intake.plausible, None, crc_start=checksum_start(header))

    def _moves_held(self) -> bool:
        """Whether this model, once checked, is what this client holds of its sender (stateful
        compressions): unless the inbox refuses its round as too far ahead (see the module)."""
        return self.slot != "future"

    def _take(self, chunk) -> None:
        self.decoder.add(chunk.data, chunk.offset if chunk.HasField("offset") else None)

    def fail(self, why: tuple[str, str]) -> None:
        """The stream broke (reason, detail): the message ends rejected for it, unless an
        earlier defect or a verdict decided it already."""
        if self.verdict is None and self.broken is None:
            self.broken = why

    def add(self, chunk) -> None:
        if self.verdict is not None or self.broken is not None:
            return
        try:
            self.wire += chunk.ByteSize()
            if chunk.HasField("header"):
                raise WireError("bad_chunk", "a header appeared after the first chunk")
            self._take(chunk)
        except WireError as exc:
            self.broken = (exc.reason, exc.detail)
        except Exception as exc:  # noqa: BLE001
            self.broken = ("malformed", type(exc).__name__)

    def end(self) -> tuple[bool, str, int]:
        """The verdict: (accepted, reason, this client's round)."""
        inbox = self.intake.inbox
        try:
            verdict = self._verdict()
        except WireError as exc:
            verdict = inbox.reject(exc.reason, exc.detail)
        except Exception as exc:  # noqa: BLE001
            verdict = inbox.reject("malformed", type(exc).__name__)
        finally:
            if isinstance(self.slot, Slot):
                inbox.release(self.slot)  # a no-op once filled
            if self.header is not None and self.header.total_bytes > LARGE_MESSAGE:
                # Its chunks' buffers were freed into the heap: give the pages back to the system.
                release_free_heap()
        return (*verdict, inbox.told(self.header.sender if self.header is not None else None))

    def _verdict(self) -> tuple[bool, str]:
        inbox = self.intake.inbox
        if self.verdict is not None:
            return self.verdict
        if self.broken is not None:
            return inbox.reject(*self.broken)
        self.decoder.finish()
        if self.refusal is not None:
            return inbox.reject(*self.refusal)
        self.decoder.verify()
        header = self.header
        if self.origins is not None:
            return self.intake.collusion.keep(pool_message(header, self.origins, self.buffer, self.intake.specs, self.wire))
        was_gone = header.sender in inbox.gone()
        codec = self.intake.decoder
        own = self._rebuilt(codec) if self.encoded is not None else self.whole
        if own is not None and self._moves_held():
            codec.keep(header.sender, header.round, own, owned=True)
        if isinstance(self.slot, Slot):
            vector = self._into_row(own) if own is not None else self.decoder.tensor
            accepted, reason = inbox.fill(self.slot, model_message(header, vector if vector is not None else _NOT_KEPT, self.wire, self.intake.plausible))
        else:
            accepted, reason = inbox.settle(self.slot, header.sender, header.round)
        self.intake.after(header.sender, header.round, accepted, reason, was_gone)
        return accepted, reason

    def _rebuilt(self, codec: Decoder) -> torch.Tensor:
        """The model a compressed payload (its checksum checked) rebuilds, its values checked.
        Raises :class:`WireError`."""
        rebuilt = codec.decode(self.header, memoryview(self.encoded.numpy()).cast("B"))
        error = self.intake.plausible.model_error(rebuilt)
        if error is not None:
            raise error
        return rebuilt

    def _into_row(self, vector: torch.Tensor) -> torch.Tensor | None:
        """Copy ``vector`` into this message's inbox row, returned (None: the inbox let it go)."""
        with self.slot.lock:
            row = self.slot.buffer
            if row is not None:
                row.copy_(vector)
        return row


# The vector of a message counted but not kept (its round was closed, or passed while it came).
_NOT_KEPT = torch.empty(0, dtype=torch.float32)
