"""The pages a client's received chunks leave in the heap, given back to the system."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time

# Free bytes malloc may keep before a client gives them back. Below this the pages stay for the
# next round's buffers: trimming them each round costs a system call per free run and a page
# fault per page when they are used again (with a 247 KB model, 39 of a round's 49 ms of system
# time on a ring of 8; docs/performance.md, "A round at the cost of its work").
KEEP_FREE_BYTES = 32 << 20
# Below that, the free pages still go back, at most once in this many seconds: a client's heap
# stays as small as when it trimmed every round, for a small share of the system calls.
TRIM_EVERY_SECONDS = 1.0
_last_trim = [0.0]


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]


@functools.cache
def _glibc():
    """(malloc_trim, mallinfo2) of glibc; (None, None) elsewhere, mallinfo2 None before glibc 2.33."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None, None
    info = getattr(libc, "mallinfo2", None)
    if info is not None:
        info.restype = _MallInfo2
    return trim, info


def free_heap_bytes() -> int | None:
    """The free bytes malloc's arenas hold (glibc's ``mallinfo2().fordblks``), else None."""
    _, info = _glibc()
    return None if info is None else int(info().fordblks)


def release_free_heap(keep: int = KEEP_FREE_BYTES, every: float = TRIM_EVERY_SECONDS) -> bool:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere nothing)
    when malloc holds more than ``keep`` free bytes, or ``every`` seconds have passed since the
    last time; returns whether it trimmed. gRPC and the interpreter free the buffers of a
    client's received chunks into malloc's arenas, which keep the pages: about 100 MB on a client
    that received ten 44 MB models (measured). Called once a client has its round's models,
    before aggregating or crafting takes fresh pages, so that those do not add to them."""
    trim, _ = _glibc()
    if trim is None:
        return False
    now = time.monotonic()
    if now - _last_trim[0] < every:
        # Not yet due by the clock: only a full heap makes it due (mallinfo2 walks the arenas'
        # bins, so it is asked only here).
        free = free_heap_bytes()
        if free is not None and free <= keep:
            return False
    trim(0)
    _last_trim[0] = now
    return True
