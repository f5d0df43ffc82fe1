"""Framing on a gRPC call: a stream of chunks cut into messages at their header chunks (each
message bounded as it arrives), each message handed on chunk by chunk, and one message's
verdict as a reply."""

from __future__ import annotations
from collections.abc import Callable
from typing import Any, Protocol
from dfedrw.peer.transport.base import Deliver


# Room for a message's header and protobuf framing on top of its tensor bytes (one chunk's on
# a gRPC call, a whole model's in a torch.distributed frame).
FRAMING = 1 << 20


class Assembly(Protocol):
    """One message as its chunks arrive: :meth:`add` each chunk after the first (which began
    it), then :meth:`end` gives what the message comes to (a verdict, the chunks, ...)."""

    def add(self, chunk: Any) -> None: ...

    def end(self) -> Any: ...


class Collected:
    """A message's chunks in a list: what :meth:`end` gives."""

    def __init__(self, first: Any) -> None:
        self.chunks = [first]

    def add(self, chunk: Any) -> None:
        self.chunks.append(chunk)

    def end(self) -> list:
        return self.chunks


class _Whole:
    """A message for a ``deliver`` that takes whole messages: collected, then delivered."""

    def __init__(self, deliver: Deliver, first: Any, sender: int | None) -> None:
        self.deliver, self.sender, self.chunks = deliver, sender, [first]

    def add(self, chunk: Any) -> None:
        self.chunks.append(chunk)

    def end(self) -> tuple[bool, str, int]:
        return self.deliver(self.chunks, self.sender)


def message_begin(deliver: Deliver) -> Callable[[Any, int | None], Assembly]:
    """How a transport hands ``deliver`` a message as it arrives: its ``begin(first chunk,
    sender)`` where it has one (a client decodes each chunk into place as it comes), else the
    chunks collected and delivered whole once the message is complete."""
    begin = getattr(deliver, "begin", None)
    if begin is not None:
        return begin
    return lambda first, sender: _Whole(deliver, first, sender)


class MessageSplitter:
    """Cuts an ``Exchange`` call into messages, one chunk at a time: a header chunk begins one
    (``begin(chunk)``, an :class:`Assembly`; by default :class:`Collected`, a list of chunks),
    each data chunk goes to the message it continues, and a message is complete when its data
    reaches ``header.total_bytes``: :meth:`feed` returns what its :meth:`~Assembly.end` gives.
    A data chunk outside a message is a message of its own (rejected: no header); a message
    declaring more than ``max_bytes`` ends at once (rejected: too large), its data skipped; one
    cut short by the next header or the call's end, or reaching ``max_chunks`` chunks before its
    data is complete, ends as it is (rejected: size mismatch; in the last case the rest is
    skipped). So no message takes in more than ``max_bytes`` of data plus one chunk, in at most
    ``max_chunks`` chunks (a parsed chunk costs about half a kilobyte of memory even when it
    carries nothing). One message out, one reply back: the sender counts on it."""

    def __init__(self, max_bytes: int, max_chunks: int | None = None, begin: Callable[[Any], Assembly] = Collected) -> None:
        self.max_bytes = max_bytes
        self.max_chunks = max_chunks if max_chunks is not None else 16 + max_bytes // 4096
        self.begin = begin
        self.current: Assembly | None = None
        self.count = self.need = self.have = 0
        self.skipping = False

    def _end(self) -> Any:
        current, self.current = self.current, None
        return current.end()

    def feed(self, chunk: Any) -> list:
        """What the messages this chunk completes come to: none, one, or two (it cut one short)."""
        out = []
        if chunk.HasField("header"):
            if self.current is not None:
                out.append(self._end())
            self.current, self.count = self.begin(chunk), 1
            self.need, self.have = chunk.header.total_bytes, len(chunk.data)
            self.skipping = self.need > self.max_bytes
            if self.skipping:
                out.append(self._end())
                return out
        elif self.skipping:
            return out
        elif self.current is None:
            return [self.begin(chunk).end()]
        else:
            self.current.add(chunk)
            self.count += 1
            self.have += len(chunk.data)
        if self.have >= self.need:
            out.append(self._end())
        elif self.count >= self.max_chunks:
            out.append(self._end())  # too many chunks for its size: the rest is skipped
            self.skipping = True
        return out

    def end(self) -> list:
        """What is left when the call ends: a message cut short, if any."""
        return [self._end()] if self.current is not None else []

