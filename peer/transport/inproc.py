"""In-process transport: every client in one process, messages handed over in memory.

The same client code runs on it as on gRPC; messages still go through the wire encoding and
the same validation (they are protobuf chunks handed to the receiver's ``deliver``), so a run
here and a run over gRPC processes compute the same thing. Used for fast tests and sweeps."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from dfedrw.peer.transport.base import Deliver, Reachability
from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.chunks import wire_size


class InprocHub:
    """The 'network': address -> the receiving client's deliver callback."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._receivers: dict[str, Deliver] = {}

    def register(self, address: str, deliver: Deliver) -> None:
        with self._lock:
            if address in self._receivers:
                raise OSError(f"address {address} already in use")
            self._receivers[address] = deliver

    def unregister(self, address: str) -> None:
        with self._lock:
            self._receivers.pop(address, None)

    def receiver(self, address: str) -> Deliver | None:
        with self._lock:
            return self._receivers.get(address)


class InprocTransport:
    def __init__(self, hub: InprocHub, address: str) -> None:
        self.hub = hub
        self.address = address
        self._peers: dict[int, str] = {}
        self._on_reachability: Reachability = lambda peer, state: None
        self.bytes_sent = 0
        # Delivery is synchronous: nothing ever waits in a queue.
        self.dropped = 0
        self.skipped_stale = 0

    def start(self, deliver: Deliver) -> str:
        self.hub.register(self.address, deliver)
        return self.address

    def connect(self, addresses: Mapping[int, str], on_reachability: Reachability) -> None:
        self._peers = dict(addresses)
        self._on_reachability = on_reachability

    def wait_ready(self, timeout: float) -> list[int]:
        return [k for k, a in self._peers.items() if self.hub.receiver(a) is None]

    def send(self, to: int, chunks: list[pb.ModelChunk]) -> None:
        address = self._peers.get(to)
        if address is None:
            return
        deliver = self.hub.receiver(address)
        if deliver is None:  # that client has finished or failed
            self._on_reachability(to, "unreachable")
            return
        self.bytes_sent += wire_size(chunks)
        deliver(iter(chunks), None)  # threads of one process: nobody to authenticate

    def flush(self, timeout: float) -> None:
        pass  # delivery is synchronous

    def close(self) -> None:
        self.hub.unregister(self.address)
