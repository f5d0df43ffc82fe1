"""Quiet logging for what a peer may send at will: rejections and late messages.

Anyone who reaches a client can make it reject messages as fast as it can send them, so a
rejection must cost a counter, not a log line: :class:`RateLimitedLog` writes at most one line
per key (a rejection reason) per interval, saying how many were left out since the previous one.
Text taken from a message goes into a line only through :func:`quote`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

QUOTE_CHARS = 40


def quote(text: object, limit: int = QUOTE_CHARS) -> str:
    """Text from a message made safe for a log line: at most ``limit`` characters of it, with
    every control and non-ASCII character escaped (``ascii`` of the cut string), quoted."""
    if not isinstance(text, (str, bytes)):
        text = str(text)
    cut = text[:limit]
    return ascii(cut) + ("..." if len(text) > limit else "")


class RateLimitedLog:
    """At most one line per key per ``interval`` seconds; the next line written for a key counts
    the lines left out before it. ``clock`` is injectable for tests."""

    def __init__(
        self, logger: logging.Logger, interval: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(self, level: int, key: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` under ``key`` unless a line for ``key`` went out less than
        ``interval`` ago; returns whether it was written."""
        if not self.logger.isEnabledFor(level):
            return False
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            self._last[key] = now
            suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            msg += " (%d more like it in the last %.0f s not logged)"
            args = (*args, suppressed, now - last if last is not None else 0.0)
        self.logger.log(level, msg, *args)
        return True

    def suppressed(self) -> int:
        """Lines left out so far and not yet reported."""
        with self._lock:
            return sum(self._suppressed.values())
