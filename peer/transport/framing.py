"""Framing on a gRPC call: a stream of chunks cut into messages at their header chunks (each
message bounded before it is joined), and one message's verdict as a reply."""

from __future__ import annotations
from collections.abc import AsyncIterator, Iterable, Iterator
from dfedrw.peer.transport.base import Deliver
from dfedrw.peer.transport.pb import peer_pb2 as pb


# Room for a message's header and protobuf framing on top of its tensor bytes (one chunk's on
# a gRPC call, a whole model's in a torch.distributed frame).
FRAMING = 1 << 20


def handle_push(chunks: Iterable[pb.ModelChunk], deliver: Deliver, sender: int | None = None) -> pb.PushReply:
    accepted, reason, round_ = deliver(chunks, sender)
    return pb.PushReply(accepted=accepted, reason=reason, round=round_)


class MessageSplitter:
    """Cuts an ``Exchange`` call into messages, one chunk at a time: a header chunk starts one,
    and it is complete when its data reaches ``header.total_bytes``. A data chunk outside a
    message comes out on its own (the receiver rejects it: no header); a message whose header
    declares more than ``max_bytes`` comes out at once (rejected: too large) and its data is
    skipped; a message cut short by the next header or the end of the call, or one that
    reaches ``max_chunks`` chunks before its data is complete, comes out as it is (rejected:
    size mismatch), and in the last case its remaining chunks are skipped. So a message never
    holds more than ``max_bytes`` of data plus one chunk, in at most ``max_chunks`` chunks
    (a parsed chunk costs about half a kilobyte of memory even when it carries nothing). One
    message out, one reply back: the sender counts on it."""

    def __init__(self, max_bytes: int, max_chunks: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_chunks = max_chunks if max_chunks is not None else 16 + max_bytes // 4096
        self.current: list[pb.ModelChunk] = []
        self.need = self.have = 0
        self.skipping = False

    def feed(self, chunk: pb.ModelChunk) -> list[list[pb.ModelChunk]]:
        """The messages this chunk completes (none, one, or two when it cuts one short)."""
        out = []
        if chunk.HasField("header"):
            if self.current:
                out.append(self.current)
            self.current, self.need, self.have = [chunk], chunk.header.total_bytes, len(chunk.data)
            self.skipping = self.need > self.max_bytes
            if self.skipping:
                out.append(self.current)
                self.current = []
                return out
        elif self.skipping:
            return out
        elif not self.current:
            return [[chunk]]
        else:
            self.current.append(chunk)
            self.have += len(chunk.data)
        if self.have >= self.need:
            out.append(self.current)
            self.current = []
        elif len(self.current) >= self.max_chunks:
            out.append(self.current)  # too many chunks for its size: the rest is skipped
            self.current = []
            self.skipping = True
        return out

    def end(self) -> list[list[pb.ModelChunk]]:
        """What is left when the call ends: a message cut short, if any."""
        out, self.current = ([self.current] if self.current else []), []
        return out


def split_messages(chunks: Iterable[pb.ModelChunk], max_bytes: int) -> Iterator[list[pb.ModelChunk]]:
    """The messages of a call's chunks (see :class:`MessageSplitter`)."""
    splitter = MessageSplitter(max_bytes)
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.end()


async def call_messages(chunks: AsyncIterator[pb.ModelChunk], splitter: MessageSplitter) -> AsyncIterator[list[pb.ModelChunk]]:
    async for chunk in chunks:
        for message in splitter.feed(chunk):
            yield message
    for message in splitter.end():
        yield message
