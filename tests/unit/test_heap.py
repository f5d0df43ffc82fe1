"""The heap's free pages go back to the system only once malloc holds more than the bound."""

import pytest

from dfedrw.peer.transport.heap import KEEP_FREE_BYTES, free_heap_bytes, release_free_heap

glibc = pytest.mark.skipif(free_heap_bytes() is None, reason="needs glibc's mallinfo2")


@glibc
def test_free_bytes_below_the_bound_are_kept_and_above_it_trimmed():
    # Buffers below malloc's mmap threshold live in the heap; freeing every other one leaves
    # free runs inside it (not only at its top, which malloc trims by itself).
    buffers = [bytearray(20_000) for _ in range(400)]
    del buffers[::2]
    free = free_heap_bytes()
    assert free >= 200 * 20_000
    assert release_free_heap(keep=free + (1 << 20)) is False
    assert release_free_heap(keep=free // 2) is True
    del buffers


@glibc
def test_the_default_bound_keeps_a_small_model_round_of_buffers():
    # A round of a 247 KB model's buffers leaves far less than the bound free: no trim.
    assert KEEP_FREE_BYTES >= 16 << 20
    before = free_heap_bytes()
    if before > KEEP_FREE_BYTES:
        pytest.skip("this process already holds more free heap than the bound")
    buffers = [bytearray(250_000 // 8) for _ in range(16)]
    del buffers
    assert release_free_heap() is False
