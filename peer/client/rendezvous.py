"""How a client learns its neighbours' addresses once its own server is up.

A rendezvous is any object with ``exchange(client_id, address, neighbours, timeout)``: it
publishes ``address`` and returns the addresses it knows of ``neighbours`` (id -> address), within
``timeout`` seconds; the client goes on without one left out. Called between starting the client
and connecting (:func:`~dfedrw.peer.client.process.start_and_run`).

Here: given addresses (:class:`StaticRendezvous`), the launcher's zmq socket
(:class:`LauncherRendezvous`) and clients in one process (:class:`SharedRendezvous`). Under
torchrun the addresses go through torchrun's store (``launch.torchrun.StoreRendezvous``)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Protocol


def host_port(text: str) -> tuple[str, int] | None:
    """(host, port) of a client's address ``HOST:PORT`` (``[IPv6]:PORT`` too) with a port in
    1..65535 and no space in the host, else None."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or any(c.isspace() for c in host) or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    return host, int(port)


class Rendezvous(Protocol):
    def exchange(self, client_id: int, address: str, neighbours: Iterable[int], timeout: float) -> dict[int, str]: ...


class StaticRendezvous:
    """Addresses known beforehand (``--peer ID=HOST:PORT``); nothing is published."""

    def __init__(self, addresses: Mapping[int, str]) -> None:
        self.addresses = dict(addresses)

    def exchange(self, client_id: int, address: str, neighbours: Iterable[int], timeout: float) -> dict[int, str]:
        return dict(self.addresses)


class LauncherRendezvous:
    """Register through the launcher's link (``dfedrw run``); answered once every client has."""

    def __init__(self, link, role: str, pid: int | None = None) -> None:
        self.link = link
        self.role = role
        self.pid = os.getpid() if pid is None else pid

    def exchange(self, client_id: int, address: str, neighbours: Iterable[int], timeout: float) -> dict[int, str]:
        return self.link.register(client_id, address, self.pid, self.role, timeout)


class SharedRendezvous:
    """Clients in one process: each publishes its address in a shared book and waits until every
    expected client has published its own or left (:meth:`leave`, for one that failed first)."""

    def __init__(self, clients: Iterable[int]) -> None:
        self.expected = frozenset(clients)
        self.book: dict[int, str] = {}
        self.gone: set[int] = set()
        self._cond = threading.Condition()

    def _settled(self) -> bool:
        return self.expected <= (self.book.keys() | self.gone)

    def exchange(self, client_id: int, address: str, neighbours: Iterable[int], timeout: float) -> dict[int, str]:
        deadline = time.monotonic() + timeout
        with self._cond:
            self.book[client_id] = address
            self._cond.notify_all()
            while not self._settled() and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            return dict(self.book)

    def leave(self, client_id: int) -> None:
        with self._cond:
            self.gone.add(client_id)
            self._cond.notify_all()
