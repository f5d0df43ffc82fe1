"""Clients as threads of the test process, each on a transport of the test's choosing (real
gRPC with mutual TLS on loopback, by :func:`loopback_grpc`), and something done to them while
they run: what the client and message-intake tests share."""

from __future__ import annotations

import threading

from dfedrw.peer.transport.identity import make_certificates


def loopback_grpc(scenario, certs):
    """Client ``k``'s gRPC transport on 127.0.0.1 (any free port) with its certificate from
    ``certs`` (made by ``make_certificates``)."""
    from dfedrw.peer.transport.identity import load_identity
    from dfedrw.peer.wiring.build import grpc_transport_for

    return lambda k: grpc_transport_for(scenario, "127.0.0.1", 0, identity=load_identity(certs, k))


class ClientThreads:
    """One Client per id (all of the scenario's by default), each on ``transport_for(k)``,
    started and listening; ``start()`` runs each in a thread of this process (connect, then
    run), ``join()`` waits for them and closes every client, ``check()`` fails on a client's
    exception or a client still running."""

    def __init__(self, scenario, out_dir, transport_for, ids=None):
        from dfedrw.peer.client.client import Client

        ids = range(scenario.num_clients) if ids is None else ids
        self.peers = {k: Client(scenario, k, out_dir, transport=transport_for(k)) for k in ids}
        self.addresses = {k: p.start() for k, p in self.peers.items()}
        self.finals: dict[int, dict] = {}
        self.errors: list[tuple[int, Exception]] = []
        self.threads: list[threading.Thread] = []

    def _client(self, k):
        try:
            self.peers[k].connect(self.addresses)
            self.finals[k] = self.peers[k].run()
        except Exception as exc:  # surfaced by check()
            self.errors.append((k, exc))

    def start(self) -> None:
        self.threads = [threading.Thread(target=self._client, args=(k,), daemon=True) for k in self.peers]
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout=timeout)
        for p in self.peers.values():
            p.close()

    def check(self) -> None:
        assert not self.errors, self.errors
        assert all(not t.is_alive() for t in self.threads), "a client hung"


def run_network(scenario, out_dir, meddle):
    """Every client of ``scenario`` as a thread over gRPC with mutual TLS (certificates made in
    ``out_dir/certs``); ``meddle(peers, addresses)`` runs while they do. Returns (the clients,
    their final records by id) once all are done."""
    certs = out_dir / "certs"
    make_certificates(scenario.num_clients, certs)
    net = ClientThreads(scenario, out_dir, loopback_grpc(scenario, certs))
    net.start()
    try:
        meddle(net.peers, net.addresses)
    finally:
        net.join(timeout=120)
    net.check()
    return net.peers, net.finals
