"""Frames for the launcher's link (a client's id, tokens, registrations, malformed frames and
the reason each is dropped): what the link tests share."""

import json

from dfedrw.launch import link
from dfedrw.launch.link import MAX_FRAME_BYTES


ID = b"\x00\x80\x00\x00\x01"


TOKENS = {k: link.new_token() for k in range(4)}


def frame(obj) -> list[bytes]:
    return [ID, json.dumps(obj).encode()]


def register(k=0, **fields):
    msg = {"type": "register", "id": k, "address": f"127.0.0.1:{5000 + k}", "pid": 100 + k, "role": "honest", "token": TOKENS.get(k)}
    msg.update(fields)
    return {key: v for key, v in msg.items() if v is not ...}


MALFORMED = {
    "no payload": ([ID], link.FRAMES),
    "two payload frames": ([ID, b"{}", b"{}"], link.FRAMES),
    "nothing": ([], link.FRAMES),
    "oversized": ([ID, b" " * (MAX_FRAME_BYTES + 1)], link.OVERSIZED),
    "empty": ([ID, b""], link.NOT_JSON),
    "text": ([ID, b"hello [red]launcher[/red]"], link.NOT_JSON),
    "not utf-8": ([ID, b"\xff\xfe\x00{"], link.NOT_JSON),
    "nested past the parser": ([ID, b"[" * 50_000], link.NOT_JSON),
    "truncated": ([ID, b'{"type": "register", "id": 0'], link.NOT_JSON),
    "list": (frame([1, 2]), link.NOT_OBJECT),
    "string": (frame("register"), link.NOT_OBJECT),
    "null": (frame(None), link.NOT_OBJECT),
    "no type": (frame({"id": 0}), link.UNKNOWN_TYPE),
    "unknown type": (frame({"type": "addresses", "id": 0}), link.UNKNOWN_TYPE),
    "list as type": (frame({"type": ["register"], "id": 0}), link.UNKNOWN_TYPE),
    "list as id": (frame(register(id=[0])), link.BAD_FIELD),
    "string id": (frame(register(id="0")), link.BAD_FIELD),
    "float id": (frame(register(id=0.0)), link.BAD_FIELD),
    "bool id": (frame(register(id=True)), link.BAD_FIELD),
    "register without address": (frame(register(address=...)), link.BAD_FIELD),
    "empty address": (frame(register(address="")), link.BAD_FIELD),
    "address without port": (frame(register(address="127.0.0.1")), link.BAD_FIELD),
    "port 0": (frame(register(address="127.0.0.1:0")), link.BAD_FIELD),
    "port out of range": (frame(register(address="127.0.0.1:70000")), link.BAD_FIELD),
    "address with a newline": (frame(register(address="127.0.0.1:1\n[red]x")), link.BAD_FIELD),
    "address with a space": (frame(register(address="evil host:1")), link.BAD_FIELD),
    "long address": (frame(register(address="a" * 300 + ":1")), link.BAD_FIELD),
    "list as address": (frame(register(address=["127.0.0.1:1"])), link.BAD_FIELD),
    "register without pid": (frame(register(pid=...)), link.BAD_FIELD),
    "string pid": (frame(register(pid="100")), link.BAD_FIELD),
    "register without role": (frame(register(role=...)), link.BAD_FIELD),
    "list as token": (frame(register(token=[TOKENS[0]])), link.BAD_FIELD),
    "round without round": (frame({"type": "round", "id": 0}), link.BAD_FIELD),
    "non-numeric round": (frame({"type": "round", "id": 0, "round": "3"}), link.BAD_FIELD),
    "fractional round": (frame({"type": "round", "id": 0, "round": 1.5}), link.BAD_FIELD),
    "negative round": (frame({"type": "round", "id": 0, "round": -1}), link.BAD_FIELD),
    "bool round": (frame({"type": "round", "id": 0, "round": True}), link.BAD_FIELD),
    "string loss": (frame({"type": "round", "id": 0, "round": 1, "train_loss": "low"}), link.BAD_FIELD),
    "huge int accuracy": (frame({"type": "round", "id": 0, "round": 1, "accuracy": 10**400}), link.BAD_FIELD),
    "list accuracy on done": (frame({"type": "done", "id": 0, "accuracy": [99]}), link.BAD_FIELD),
    "done without id": (frame({"type": "done"}), link.BAD_FIELD),
}
