"""What the launcher's zmq socket accepts from the clients it started.

The socket (a ROUTER bound on loopback only) is reachable by every local user, so each frame is
checked before any field of it is used. ``parse_frame`` is the stateless part: frame count,
size, JSON object, message type and the type of every field read later. ``LinkGate`` is the
stateful part: a registration must carry the secret the launcher gave that client (through its
environment), an id registers once, and telemetry for an id is taken only from the zmq routing
identity it registered from. Anything else is dropped and counted by reason; nothing a frame
holds can raise out of the launcher's loop.
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dfedrw.peer.client.rendezvous import host_port

# Environment variable that carries a client's secret (never its command line: /proc/PID/cmdline
# is readable by every user).
TOKEN_ENV = "DFEDRW_LINK_TOKEN"

# Largest frame the socket takes (zmq.MAXMSGSIZE; a longer one closes the sender's connection).
# The largest honest message is a registration of a few hundred bytes.
MAX_FRAME_BYTES = 64 * 1024

_MAX_TEXT = 256

# Drop reasons of parse_frame.
FRAMES = "frames"  # not exactly [identity, payload]
OVERSIZED = "oversized"
NOT_JSON = "not_json"
NOT_OBJECT = "not_object"
BAD_FIELD = "bad_field"
UNKNOWN_TYPE = "unknown_type"
# Drop reasons of LinkGate.
UNKNOWN_ID = "unknown_id"
BAD_TOKEN = "bad_token"
SECOND_REGISTRATION = "second_registration"
WRONG_SENDER = "wrong_sender"

MALFORMED = (FRAMES, OVERSIZED, NOT_JSON, NOT_OBJECT, BAD_FIELD, UNKNOWN_TYPE)


def new_token() -> str:
    return secrets.token_hex(16)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    # A non-finite float is allowed (a diverged client's loss); a huge int would overflow the
    # progress board's float formatting.
    return isinstance(x, float) or (_is_int(x) and abs(x) < 2**53)


def _is_text(x: Any) -> bool:
    return isinstance(x, str) and 0 < len(x) <= _MAX_TEXT and x.isprintable()


def _is_address(x: Any) -> bool:
    """host:port as the gRPC transport prints it (an IPv6 host in brackets)."""
    return _is_text(x) and host_port(x) is not None  # no space in the host, a port in range


def _optional(msg: dict[str, Any], key: str, check) -> bool:
    return msg.get(key) is None or check(msg[key])


def _valid_fields(msg: dict[str, Any]) -> bool:
    kind = msg["type"]
    if not _is_int(msg.get("id")):
        return False
    if kind == "register":
        return (
            _is_address(msg.get("address"))
            and _is_int(msg.get("pid"))
            and _is_text(msg.get("role"))
            # Absent is a bad token, not a malformed frame; any other type is malformed.
            and _optional(msg, "token", lambda t: isinstance(t, str) and len(t) <= _MAX_TEXT)
        )
    if kind == "round":
        return (
            _is_int(msg.get("round"))
            and msg["round"] >= 0
            and all(_optional(msg, key, _is_number) for key in ("train_loss", "accuracy", "global_accuracy"))
        )
    # "done"
    return all(_optional(msg, key, _is_number) for key in ("accuracy", "global_accuracy"))


def parse_frame(frames: list[bytes]) -> dict[str, Any] | str:
    """One message as a ROUTER receives it ([identity, payload]): the message, every field it
    uses type-checked, or the reason to drop it."""
    if len(frames) != 2:
        return FRAMES
    payload = frames[1]
    if len(payload) > MAX_FRAME_BYTES:
        return OVERSIZED
    try:
        msg = json.loads(payload)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past the parser's depth
        return NOT_JSON
    if not isinstance(msg, dict):
        return NOT_OBJECT
    if msg.get("type") not in ("register", "round", "done"):
        return UNKNOWN_TYPE
    if not _valid_fields(msg):
        return BAD_FIELD
    return msg


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
