"""The messages of the launcher's zmq link, both sides of it, in one place.

A client sends ``register`` (its id, address, pid, role and the secret from ``TOKEN_ENV``), a
``round`` event per round and ``done`` at the end; the launcher answers every registration at once
with the ``addresses`` book. Here: a builder per message, ``encode`` (its bytes on the wire),
``parse_frame`` (the launcher's stateless check of a frame: count, size, JSON object, type and every
field read later) and ``read_address_book`` (the client's check of the reply); the stateful checks
(tokens, one registration per id, the sender of telemetry) are ``launch.link.LinkGate``'s."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dfedrw.peer.client.rendezvous import host_port

# A client's secret, never on its command line (/proc/PID/cmdline is readable by every user).
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

MALFORMED = (FRAMES, OVERSIZED, NOT_JSON, NOT_OBJECT, BAD_FIELD, UNKNOWN_TYPE)

# What a client may send; the launcher's only message is the reply, "addresses".
_CLIENT_TYPES = ("register", "round", "done")


# -- builders ----------------------------------------------------------------------------
def register(client_id: int, address: str, pid: int, role: str, token: str | None = None) -> dict[str, Any]:
    """A client's registration; ``token`` is left out when the client was given none."""
    msg: dict[str, Any] = {"type": "register", "id": client_id, "address": address, "pid": pid, "role": role}
    if token is not None:
        msg["token"] = token
    return msg


def round_event(
    client_id: int,
    round_: int,
    train_loss: float | None = None,
    *,
    accuracy: float | None = None,
    global_accuracy: float | None = None,
) -> dict[str, Any]:
    """The end of round ``round_``; each measure is sent only when there is one (a Byzantine
    client has no loss, accuracy comes only from rounds with an evaluation)."""
    msg: dict[str, Any] = {"type": "round", "id": client_id, "round": round_}
    for key, value in (("train_loss", train_loss), ("accuracy", accuracy), ("global_accuracy", global_accuracy)):
        if value is not None:
            msg[key] = value
    return msg


def done(client_id: int, accuracy: float | None = None, global_accuracy: float | None = None) -> dict[str, Any]:
    """A client's last message: its final accuracies (null when it made no evaluation)."""
    return {"type": "done", "id": client_id, "accuracy": accuracy, "global_accuracy": global_accuracy}


def address_book(book: Mapping[int, str]) -> dict[str, Any]:
    """The launcher's reply: each registered client's id (a string, as JSON keys are) -> address."""
    return {"type": "addresses", "addresses": {str(k): address for k, address in book.items()}}


def encode(msg: Mapping[str, Any]) -> bytes:
    """A message's payload on the wire (one zmq frame)."""
    return json.dumps(msg).encode()


# -- field checks --------------------------------------------------------------------------
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


# -- readers -------------------------------------------------------------------------------
def parse_frame(frames: list[bytes]) -> dict[str, Any] | str:
    """A ROUTER's [identity, payload]: the message (its fields type-checked) or the drop reason."""
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
    if msg.get("type") not in _CLIENT_TYPES:
        return UNKNOWN_TYPE
    if not _valid_fields(msg):
        return BAD_FIELD
    return msg


def _client_id(key: str) -> int | None:
    # Only the form str(id) gives: "01" or "+1" would let two keys name one client.
    return int(key) if key.isascii() and key.isdigit() and str(int(key)) == key else None


def read_address_book(reply: bytes | Any) -> dict[int, str]:
    """The address book (id -> host:port) in the launcher's reply, as bytes or decoded JSON;
    ValueError naming what is wrong when the reply is not an ``addresses`` message of that form."""
    if isinstance(reply, (bytes, bytearray, memoryview)):
        try:
            reply = json.loads(bytes(reply))
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"launcher's reply to the registration is not JSON: {exc}") from None
    if not isinstance(reply, dict) or reply.get("type") != "addresses":
        kind = reply.get("type") if isinstance(reply, dict) else type(reply).__name__
        raise ValueError(f"launcher's reply to the registration is not an address book (type {repr(kind)[:40]})")
    entries = reply.get("addresses")
    if not isinstance(entries, dict):
        raise ValueError(f"launcher's address book is not an object of id -> address: {type(entries).__name__}")
    book: dict[int, str] = {}
    for key, address in entries.items():
        k = _client_id(key)
        if k is None:
            raise ValueError(f"launcher's address book has a key that is not a client id: {key[:40]!r}")
        if not _is_address(address):
            raise ValueError(f"launcher's address book gives client {k} no host:port address: {str(address)[:60]!r}")
        book[k] = address
    return book
