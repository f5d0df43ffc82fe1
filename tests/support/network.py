"""Four clients as threads of the test process over real gRPC with mutual TLS, and something
done to them while they run: what the message-intake tests share."""

from dfedrw.peer.identity import make_certificates
from tests.helpers import ClientThreads, loopback_grpc


def run_network(scenario, out_dir, meddle):
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
