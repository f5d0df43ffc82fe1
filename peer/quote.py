"""How a message repeats what it was given: a value in full when it is short, its beginning and
its length when it is long. Every message that quotes a user's value goes through :func:`shown`,
so a value of megabytes still makes a one-line message a person can read."""

from __future__ import annotations

from typing import Any

# Longer than any name, path or number a setting takes; past it, the beginning is enough to
# recognise the value and the rest only buries the message.
SHOWN_CHARS = 100

# A whole message (the CLI's one line) past this carries something nobody can read on a terminal;
# the longest of the project's own, a key with every valid choice, is well under it.
MESSAGE_CHARS = 2_000


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)``, or when longer than ``limit`` its first ``limit`` characters, ``...``
    and its full length: ``'xxxx'... (50_000_000 characters)``."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value):_} characters)"
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):_} characters)"


def cut(message: str, limit: int = MESSAGE_CHARS) -> str:
    """``message``, or when longer than ``limit`` its beginning and end around the number of
    characters left out: a message's key (first) and its fix (last) both stay."""
    if len(message) <= limit:
        return message
    half = limit // 2
    return f"{message[:half]} ... ({len(message) - 2 * half:_} characters left out) ... {message[-half:]}"
