"""A small model's tensor specs, a vector of its size, a decode of encoded chunks, and a call's
chunks cut into messages and answered: what the transport tests share."""

import torch

from dfedrw.peer.transport.framing import MessageSplitter
from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.serde import TensorSpec, decode, join_chunks


SPECS = (TensorSpec("0.weight", "float32", (3, 4)), TensorSpec("0.bias", "float32", (3,)))


D = 15


def vec(seed=0, size=D):
    """``size`` random floats, the same for the same seed."""
    return torch.randn(size, generator=torch.Generator().manual_seed(seed))


# One tensor of four floats, and a model of those specs holding ``value`` everywhere: messages
# whose round or sender reads straight off their values.
SPECS_4 = (TensorSpec("w", "float32", (4,)),)


def filled(value, size=4):
    return torch.full((size,), float(value))


def roundtrip(chunks, specs=SPECS, max_bytes=1 << 20):
    header, payload, wire = join_chunks(iter(chunks), max_bytes)
    return decode(header, payload, specs, wire)


def split_messages(chunks, max_bytes):
    """The messages of a call's chunks, as lists (see :class:`MessageSplitter`)."""
    splitter = MessageSplitter(max_bytes)
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.end()


def handle_push(chunks, deliver, sender=None):
    """A ``deliver``'s verdict on one message, as the reply a receiver sends."""
    accepted, reason, round_ = deliver(chunks, sender)
    return pb.PushReply(accepted=accepted, reason=reason, round=round_)
