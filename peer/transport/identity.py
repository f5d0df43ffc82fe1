"""Who a client is: a run's own certificate authority and one certificate per client.

Every client, honest or Byzantine, gets an ECDSA P-256 key and a certificate signed by the run's
CA whose subject alternative names say which client of which run it is: the URI
``dfedrw://RUN/client/K`` (what a receiver reads the sender's id from) and the DNS name
``client-K.RUN.dfedrw`` (what a sender checks the receiver's certificate against). Robust
aggregation rules assume that a model labelled "from client J" was sent by client J; with these
certificates gRPC's mutual TLS makes that true: a Byzantine client can lie about its models but
not about who it is.

The CA's private key is never written: a folder of certificates is complete when made, and
nobody holding it can mint another identity. Private keys are written 0600, never logged or sent."""

from __future__ import annotations

import datetime
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE = "ca.pem"
# A run id is a short lowercase token: it goes into DNS names, so letters, digits and '-' only.
_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
_URI = re.compile(r"^dfedrw://([a-z0-9][a-z0-9-]{0,31})/client/(0|[1-9][0-9]{0,5})$")


class IdentityError(ValueError):
    """A certificate folder is missing, incomplete, or does not fit the run."""


def cert_file(client: int) -> str:
    return f"client-{client}.pem"


def key_file(client: int) -> str:
    return f"client-{client}.key"


def client_uri(run_id: str, client: int) -> str:
    return f"dfedrw://{run_id}/client/{client}"


def server_name(run_id: str, client: int) -> str:
    """The DNS name in client ``client``'s certificate: a sender checks the receiver against it."""
    return f"client-{client}.{run_id}.dfedrw"


def client_of_uri(uri: str, run_id: str) -> int | None:
    """The client id a certificate URI names, when it names a client of ``run_id`` (else None)."""
    m = _URI.match(uri)
    if m is None or m.group(1) != run_id:
        return None
    return int(m.group(2))


def new_run_id() -> str:
    return secrets.token_hex(6)


@dataclass(frozen=True)
class ClientIdentity:
    """One client's credentials: PEM bytes as gRPC takes them."""

    run_id: str
    client: int
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def __repr__(self) -> str:  # the key never reaches a log line
        return f"ClientIdentity(run_id={self.run_id!r}, client={self.client})"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dfedrw"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_private(path: Path, data: bytes) -> None:
    # Created 0600 from the start: no moment at which another user could read it.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def make_certificates(num_clients: int, out_dir: Path, *, run_id: str | None = None, days: int = 30) -> str:
    """Write a new CA and one key and certificate per client id 0..num_clients-1 into
    ``out_dir``; returns the run id. Refuses a folder that already holds a CA."""
    if not 1 <= num_clients <= 100_000:
        raise IdentityError(f"num_clients={num_clients} must be in 1..100000")
    if not 1 <= days <= 3650:
        raise IdentityError(f"days={days} must be in 1..3650")
    run_id = run_id or new_run_id()
    if not _RUN_ID.match(run_id):
        raise IdentityError(f"run id {run_id!r} must be 1-32 lowercase letters, digits or '-'")
    out = Path(out_dir)
    if (out / CA_FILE).exists():
        raise IdentityError(f"{out / CA_FILE} exists already; choose an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"dfedrw run {run_id} CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (out / CA_FILE).write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for k in range(num_clients):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(f"client-{k}"))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(client_uri(run_id, k)), x509.DNSName(server_name(run_id, k))]),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        (out / cert_file(k)).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(
            out / key_file(k),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        )
    return run_id


def _load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        raise IdentityError(f"{path} not found (make a certificate folder with `dfedrw certs`)") from None
    except ValueError:
        raise IdentityError(f"{path} is not a PEM certificate") from None


def run_id_of(folder: Path) -> str:
    """The run id of a certificate folder, read from its CA."""
    ca = _load_cert(Path(folder) / CA_FILE)
    names = ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    m = re.match(r"^dfedrw run ([a-z0-9-]+) CA$", str(names[0].value)) if names else None
    if m is None:
        raise IdentityError(f"{Path(folder) / CA_FILE} is not a dfedrw run CA")
    return m.group(1)


def load_identity(folder: Path, client: int) -> ClientIdentity:
    """Client ``client``'s credentials from a certificate folder, checked: its certificate is
    signed by the folder's CA, names this client of this run, and is valid now; its key fits."""
    folder = Path(folder)
    run_id = run_id_of(folder)
    ca = _load_cert(folder / CA_FILE)
    cert = _load_cert(folder / cert_file(client))
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise IdentityError(f"{folder / cert_file(client)} is not signed by {folder / CA_FILE}") from None
    try:
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    if client_uri(run_id, client) not in uris:
        raise IdentityError(f"{folder / cert_file(client)} does not name client {client} of run {run_id}")
    now = datetime.datetime.now(datetime.timezone.utc)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise IdentityError(f"{folder / cert_file(client)} is not valid now (valid {cert.not_valid_before_utc:%Y-%m-%d} to {cert.not_valid_after_utc:%Y-%m-%d})")
    key_path = folder / key_file(client)
    try:
        key_pem = key_path.read_bytes()
    except FileNotFoundError:
        raise IdentityError(f"{key_path} not found") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise IdentityError(f"{key_path} is not an unencrypted PEM private key") from None
    if key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) != cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise IdentityError(f"{key_path} does not belong to {folder / cert_file(client)}")
    if os.stat(key_path).st_mode & 0o077:
        raise IdentityError(f"{key_path} is readable by other users; chmod 600 it")
    return ClientIdentity(run_id, client, ca.public_bytes(serialization.Encoding.PEM), cert.public_bytes(serialization.Encoding.PEM), key_pem)
