"""The client's link to the launcher, over pyzmq: registration (address discovery) and
per-round telemetry.

Telemetry is best effort: sends never block the round loop, and results never depend on it
(each client writes its own JSONL). Registration is a DEALER -> ROUTER request: the client sends
its id, address, pid and the secret the launcher gave it (``DFEDRW_LINK_TOKEN`` in its
environment); the launcher answers once every client has registered with the full address book,
and from then on takes this client's telemetry only from this connection.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import zmq

log = logging.getLogger(__name__)


class LauncherLink:
    def __init__(self, endpoint: str, token: str | None = None) -> None:
        self._token = token
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 2000)
        self._sock.setsockopt(zmq.SNDHWM, 10000)
        self._sock.connect(endpoint)
        self.dropped = 0

    def register(self, client_id: int, address: str, pid: int, role: str, timeout: float) -> dict[int, str]:
        """Announce this client and wait for every client's address (id -> host:port)."""
        msg = {"type": "register", "id": client_id, "address": address, "pid": pid, "role": role}
        if self._token is not None:
            msg["token"] = self._token
        self._sock.send_json(msg)
        if not self._sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no address book from the launcher within {timeout:.0f} s")
        reply = self._sock.recv_json()
        if reply.get("type") == "abort":
            raise RuntimeError(f"launcher aborted the start: {reply.get('reason', '')}")
        return {int(k): v for k, v in reply["addresses"].items()}

    def send(self, event: dict[str, Any]) -> None:
        try:
            self._sock.send(json.dumps(event).encode(), zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()


class NullLink:
    """Used when a client runs without a launcher (static addresses)."""

    dropped = 0

    def send(self, event: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
