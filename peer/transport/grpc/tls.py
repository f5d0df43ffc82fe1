"""Mutual TLS for the gRPC transport: a client's server and channel credentials from its identity,
the name a channel expects its peer's certificate to carry, and who a call's certificate says
sent it."""

from __future__ import annotations
import grpc
from dfedrw.peer.transport.identity import ClientIdentity, client_of_uri, server_name


def authenticated_sender(context, run_id: str | None) -> int | None:
    """The client id in the caller's verified certificate (gRPC checked it against the run's
    CA during the handshake); None when the server runs without TLS. Raises ``PermissionError``
    for a certificate that names no client of this run."""
    if run_id is None:
        return None
    uris = context.auth_context().get("peer_uri", [])
    ids = {client_of_uri(u.decode("ascii", "replace"), run_id) for u in uris}
    if len(ids) != 1 or None in ids:
        raise PermissionError("no client identity of this run in the peer certificate")
    return ids.pop()


def server_credentials(identity: ClientIdentity) -> grpc.ServerCredentials:
    """Mutual TLS: a caller must present a certificate from the run's CA."""
    return grpc.ssl_server_credentials([(identity.key_pem, identity.cert_pem)], root_certificates=identity.ca_pem, require_client_auth=True)


def channel_credentials(identity: ClientIdentity) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=identity.ca_pem, private_key=identity.key_pem, certificate_chain=identity.cert_pem)


def identity_options(identity: ClientIdentity, peer: int) -> list[tuple[str, str]]:
    """Channel options that make the receiver prove it is client ``peer`` of this run, not only
    that the run's CA signed its certificate: its DNS name says which client it is."""
    return [("grpc.ssl_target_name_override", server_name(identity.run_id, peer))]
