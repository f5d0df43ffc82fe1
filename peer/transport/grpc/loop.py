"""The event loop every gRPC server, channel and call of a process runs on: one loop in one thread
(``grpc-io``), started on first use, and how another thread hands it a coroutine."""

from __future__ import annotations
import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar


T = TypeVar("T")


_loop: asyncio.AbstractEventLoop | None = None


_loop_lock = threading.Lock()


def io_loop() -> asyncio.AbstractEventLoop:
    """The process's gRPC event loop, on a daemon thread started on first use. One loop for the
    whole process: gRPC's asyncio layer shares one completion queue among all loops."""
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            threading.Thread(target=run, name="grpc-io", daemon=True).start()
            started.wait()
            _loop = loop
        return _loop


def on_loop(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the gRPC event loop and wait (at most ``timeout`` s) for its result."""
    return asyncio.run_coroutine_threadsafe(coro, io_loop()).result(timeout)
