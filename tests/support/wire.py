"""A small model's tensor specs, a vector of its size and a decode of encoded chunks: what the
transport tests share."""

import torch

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
