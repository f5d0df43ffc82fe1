"""The heap's bound in a fresh interpreter, as a client starts: a round of a small model's
buffers leaves far less free than the bound, so no trim is due until the clock says so. (In the
test process itself, after thousands of tests, malloc may hold more free than the bound.)"""

import subprocess
import sys

import pytest

from dfedrw.peer.transport.heap_trim import free_heap_bytes

CHECK = """
from dfedrw.peer.transport.heap_trim import KEEP_FREE_BYTES, free_heap_bytes, release_free_heap
assert KEEP_FREE_BYTES >= 16 << 20
release_free_heap(every=0)  # trims: the clock starts now
before = free_heap_bytes()
assert before < KEEP_FREE_BYTES, before
buffers = [bytearray(250_000 // 8) for _ in range(16)]  # a round of a 247 KB model's buffers
del buffers
assert free_heap_bytes() < KEEP_FREE_BYTES
assert release_free_heap() is False  # within TRIM_EVERY_SECONDS, below the bound
print("ok")
"""


@pytest.mark.skipif(free_heap_bytes() is None, reason="needs glibc's mallinfo2")
def test_the_default_bound_keeps_a_small_model_round_of_buffers():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
