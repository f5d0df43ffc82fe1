"""Who may say what on the launcher's zmq socket: the clients it started, each from its own
connection.

The socket (a ROUTER bound on loopback only) is reachable by every local user, so each frame is
checked before any field of it is used. The link's schema (its messages, their builders and
``parse_frame``, the stateless check of a frame: frame count, size, JSON object, message type,
the type of every field read later) lives in ``peer.client.link_messages``, shared with the
clients; its names are importable from here too. ``LinkGate`` is the stateful part: a
registration must carry the secret the launcher gave that client (through its environment), an
id registers once, and telemetry for an id is taken only from the zmq routing identity it
registered from. Anything else is dropped and counted by reason; nothing a frame holds can
raise out of the launcher's loop.
"""

from __future__ import annotations

import hmac
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dfedrw.peer.client.link_messages import (  # noqa: F401 - the schema's names, importable from here as before
    BAD_FIELD,
    FRAMES,
    MALFORMED,
    MAX_FRAME_BYTES,
    NOT_JSON,
    NOT_OBJECT,
    OVERSIZED,
    TOKEN_ENV,
    UNKNOWN_TYPE,
    parse_frame,
)

# Drop reasons of LinkGate (those of parse_frame are MALFORMED).
UNKNOWN_ID = "unknown_id"
BAD_TOKEN = "bad_token"
SECOND_REGISTRATION = "second_registration"
WRONG_SENDER = "wrong_sender"


def new_token() -> str:
    return secrets.token_hex(16)


def _same_token(given: Any, expected: str) -> bool:
    if not isinstance(given, str):
        return False
    # Bytes, since compare_digest refuses str with non-ASCII characters.
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())


@dataclass
class LinkGate:
    """Who may say what on the launcher's socket: ``tokens`` holds each started client's secret."""

    tokens: dict[int, str]
    addresses: dict[int, str] = field(default_factory=dict)
    identities: dict[int, bytes] = field(default_factory=dict)
    dropped: Counter = field(default_factory=Counter)

    def admit(self, frames: list[bytes]) -> dict[str, Any] | str:
        """The message to act on, or the reason it was dropped (counted in ``dropped``). A
        registration that is admitted has been recorded in ``addresses`` and ``identities``."""
        msg = parse_frame(frames)
        if isinstance(msg, dict):
            msg = self._check(frames[0], msg)
        if isinstance(msg, str):
            self.dropped[msg] += 1
        return msg

    def _check(self, identity: bytes, msg: dict[str, Any]) -> dict[str, Any] | str:
        k = msg["id"]
        expected = self.tokens.get(k)
        if expected is None:
            return UNKNOWN_ID
        if msg["type"] == "register":
            if not _same_token(msg.get("token"), expected):
                return BAD_TOKEN
            if k in self.identities:
                # The first registration stands: a replayed or stolen token cannot move a
                # client's address once the others may have been told it.
                return SECOND_REGISTRATION
            self.identities[k] = identity
            self.addresses[k] = msg["address"]
            return msg
        if self.identities.get(k) != identity:
            return WRONG_SENDER
        return msg
