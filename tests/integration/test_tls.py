"""Mutual TLS over loopback: a message's sender is the client its certificate names."""

import threading

import grpc
import pytest

from dfedrw.peer.transport.identity import load_identity, make_certificates
from dfedrw.peer.transport.grpc.tls import channel_credentials, identity_options
from dfedrw.peer.transport.grpc.transport import GrpcTransport
from dfedrw.peer.transport.pb import peer_pb2_grpc as pb_grpc
from dfedrw.peer.transport.serde import encode
from tests.support.wire import SPECS_4, filled


class Receiver:
    """Client 0 of a run: records (authenticated sender, claimed sender) of each message."""

    def __init__(self, identity):
        self.got, self.lock = [], threading.Lock()
        self.transport = GrpcTransport("127.0.0.1", 0, identity=identity)
        self.address = self.transport.start(self.deliver)

    def deliver(self, chunks, sender):
        chunks = list(chunks)
        with self.lock:
            self.got.append((sender, chunks[0].header.sender))
        if sender != chunks[0].header.sender:
            return False, "impersonation", 0
        return True, "", 0


@pytest.fixture
def run(tmp_path):
    make_certificates(4, tmp_path / "run")
    make_certificates(4, tmp_path / "other")
    receiver = Receiver(load_identity(tmp_path / "run", 0))
    yield tmp_path, receiver
    receiver.transport.close()


def push(address, chunks, credentials, options):
    with grpc.secure_channel(address, credentials, options=options) as channel:
        return pb_grpc.PeerStub(channel).Push(iter(chunks), timeout=10)


def test_the_receiver_learns_the_sender_from_its_certificate(run):
    tmp, receiver = run
    sender = GrpcTransport("127.0.0.1", 0, identity=load_identity(tmp / "run", 2))
    sender.start(lambda chunks, s: (True, "", 0))
    try:
        sender.connect({0: receiver.address}, lambda peer, state: None)
        assert sender.wait_ready(10.0) == []
        for r in range(3):
            sender.send(0, encode(2, r, filled(r), SPECS_4))
        sender.flush(10.0)
    finally:
        sender.close()
    assert receiver.got == [(2, 2)] * 3


def test_a_member_claiming_another_id_is_named_an_impostor(run):
    tmp, receiver = run
    me = load_identity(tmp / "run", 3)
    reply = push(receiver.address, encode(1, 0, filled(0), SPECS_4), channel_credentials(me), identity_options(me, 0))
    assert (reply.accepted, reply.reason) == (False, "impersonation")
    assert receiver.got == [(3, 1)]


def test_a_member_forging_another_clients_scores_is_named_an_impostor(run):
    # Scores ride in the model message's header: whoever sends them is the certificate's client.
    tmp, receiver = run
    me = load_identity(tmp / "run", 3)
    forged = encode(1, 0, filled(0), SPECS_4, scores={0: 100.0, 2: 100.0, 3: 0.01})
    reply = push(receiver.address, forged, channel_credentials(me), identity_options(me, 0))
    assert (reply.accepted, reply.reason) == (False, "impersonation")
    assert receiver.got == [(3, 1)]


def test_another_runs_certificate_and_no_certificate_are_refused_at_the_handshake(run):
    tmp, receiver = run
    stranger = load_identity(tmp / "other", 1)  # names client 1, of another run
    with pytest.raises(grpc.RpcError) as err:
        push(receiver.address, encode(1, 0, filled(0), SPECS_4), channel_credentials(stranger), identity_options(stranger, 0))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    # Trusting the run's CA but presenting no certificate of its own.
    ca_only = grpc.ssl_channel_credentials(root_certificates=load_identity(tmp / "run", 1).ca_pem)
    with pytest.raises(grpc.RpcError) as err:
        push(receiver.address, encode(1, 0, filled(0), SPECS_4), ca_only, identity_options(stranger, 0))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError):
        with grpc.insecure_channel(receiver.address) as channel:
            pb_grpc.PeerStub(channel).Push(iter(encode(1, 0, filled(0), SPECS_4)), timeout=10)
    assert receiver.got == []


def test_a_sender_checks_that_the_receiver_is_the_client_it_meant(run):
    tmp, receiver = run
    me = load_identity(tmp / "run", 2)
    # Client 0 listens at this address; a sender that meant client 1 must not talk to it.
    with pytest.raises(grpc.RpcError) as err:
        push(receiver.address, encode(2, 0, filled(0), SPECS_4), channel_credentials(me), identity_options(me, 1))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert receiver.got == []
