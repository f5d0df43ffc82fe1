"""The client's link to the launcher over pyzmq: registration (address discovery), telemetry.

Registration is a DEALER -> ROUTER request: the client sends its id, address, pid and the secret
the launcher gave it (``DFEDRW_LINK_TOKEN`` in its environment); once every client registered,
the launcher answers with the full address book, and from then on takes this client's telemetry
only from this connection. Telemetry is best effort: sends never block the round loop, and
results never depend on it (each client writes its own JSONL). A round event goes at most every
``ROUND_EVENT_EVERY`` seconds (one with a test's accuracy always): the board shows the newest
round, and an event a round would wake the launcher and the link's I/O thread hundreds of times
a second. The messages and the check of the reply are in ``peer.client.link_messages``."""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq

from dfedrw.peer.client import link_messages

log = logging.getLogger(__name__)

ROUND_EVENT_EVERY = 0.25  # seconds


class LauncherLink:
    def __init__(self, endpoint: str, token: str | None = None) -> None:
        self._token = token
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 2000)
        self._sock.setsockopt(zmq.SNDHWM, 10000)
        self._sock.connect(endpoint)
        self.dropped = 0
        self.held = 0  # round events not sent, a newer one due soon
        self._next_round_event = 0.0

    def register(self, client_id: int, address: str, pid: int, role: str, timeout: float) -> dict[int, str]:
        """Announce this client and wait for every client's address (id -> host:port)."""
        self._sock.send(link_messages.encode(link_messages.register(client_id, address, pid, role, self._token)))
        if not self._sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no address book from the launcher within {timeout:.0f} s")
        return link_messages.read_address_book(self._sock.recv())

    def send(self, event: dict[str, Any]) -> None:
        """Send an event (``link_messages.round_event``, ``done``) without blocking; a round event
        without an accuracy only once ``ROUND_EVENT_EVERY`` has passed since the last one sent."""
        if event.get("type") == "round" and event.get("accuracy") is None:
            now = time.monotonic()
            if now < self._next_round_event:
                self.held += 1
                return
            self._next_round_event = now + ROUND_EVENT_EVERY
        try:
            self._sock.send(link_messages.encode(event), zmq.NOBLOCK)
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
