"""The heap's free pages go back to the system only once malloc holds more than the bound."""

import pytest

from dfedrw.peer.transport.heap_trim import free_heap_bytes, release_free_heap

glibc = pytest.mark.skipif(free_heap_bytes() is None, reason="needs glibc's mallinfo2")


@glibc
def test_free_bytes_below_the_bound_are_kept_and_above_it_trimmed():
    # Buffers below malloc's mmap threshold live in the heap; freeing every other one leaves
    # free runs inside it (not only at its top, which malloc trims by itself).
    buffers = [bytearray(20_000) for _ in range(400)]
    del buffers[::2]
    free = free_heap_bytes()
    assert free >= 200 * 20_000
    assert release_free_heap(keep=free // 2, every=3600) is True
    assert release_free_heap(keep=free + (1 << 20), every=3600) is False  # just trimmed, and below the bound
    del buffers


@glibc
def test_below_the_bound_the_heap_is_still_trimmed_once_a_while(monkeypatch):
    from dfedrw.peer.transport import heap_trim

    clock = [1000.0]
    monkeypatch.setattr(heap_trim.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(heap_trim, "_last_trim", [0.0])
    assert release_free_heap(keep=1 << 40, every=0) is True
    clock[0] += heap_trim.TRIM_EVERY_SECONDS / 2
    assert release_free_heap(keep=1 << 40) is False
    clock[0] += heap_trim.TRIM_EVERY_SECONDS
    assert release_free_heap(keep=1 << 40) is True
