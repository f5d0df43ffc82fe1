"""A run's certificates: who each certificate says a client is, and what a folder must hold."""

import os
import shutil
import stat

import pytest
from cryptography import x509

from dfedrw.peer.transport.identity import (
    IdentityError,
    client_of_uri,
    client_uri,
    key_file,
    cert_file,
    load_identity,
    make_certificates,
    run_id_of,
    server_name,
)


def test_each_client_gets_a_certificate_naming_it_and_a_private_key(tmp_path):
    run = make_certificates(3, tmp_path, run_id="abc123")

    assert run == "abc123" == run_id_of(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ca.pem", "client-0.key", "client-0.pem", "client-1.key", "client-1.pem", "client-2.key", "client-2.pem",
    ]
    for k in range(3):
        assert stat.S_IMODE(os.stat(tmp_path / key_file(k)).st_mode) == 0o600
        cert = x509.load_pem_x509_certificate((tmp_path / cert_file(k)).read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.UniformResourceIdentifier) == [f"dfedrw://abc123/client/{k}"]
        assert san.get_values_for_type(x509.DNSName) == [f"client-{k}.abc123.dfedrw"]
        ident = load_identity(tmp_path, k)
        assert (ident.run_id, ident.client) == ("abc123", k)
        assert b"PRIVATE KEY" not in repr(ident).encode()


def test_no_ca_key_is_written_and_a_folder_is_never_overwritten(tmp_path):
    make_certificates(2, tmp_path)
    assert not any("ca" in p.name and p.suffix == ".key" for p in tmp_path.iterdir())
    with pytest.raises(IdentityError, match="exists already"):
        make_certificates(2, tmp_path)


def test_uri_names_a_client_of_this_run_only():
    assert client_of_uri(client_uri("run1", 7), "run1") == 7
    assert client_of_uri(client_uri("run1", 7), "run2") is None
    for bad in ("dfedrw://run1/client/-1", "dfedrw://run1/client/01", "dfedrw://run1/client/7/x", "dfedrw://run1/client/", "x"):
        assert client_of_uri(bad, "run1") is None
    assert server_name("run1", 3) == "client-3.run1.dfedrw"


def test_a_certificate_of_another_run_or_client_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    make_certificates(2, a)
    make_certificates(2, b)
    mixed = tmp_path / "mixed"
    shutil.copytree(a, mixed)
    shutil.copy(b / cert_file(1), mixed / cert_file(1))
    shutil.copy(b / key_file(1), mixed / key_file(1))
    with pytest.raises(IdentityError, match="not signed by"):
        load_identity(mixed, 1)
    # Client 0's files presented as client 1's.
    shutil.copy(a / cert_file(0), mixed / cert_file(1))
    shutil.copy(a / key_file(0), mixed / key_file(1))
    with pytest.raises(IdentityError, match="does not name client 1"):
        load_identity(mixed, 1)
    # A certificate with another client's key.
    shutil.copy(a / cert_file(1), mixed / cert_file(1))
    with pytest.raises(IdentityError, match="does not belong"):
        load_identity(mixed, 1)


def test_missing_files_and_loose_key_permissions_are_one_line_errors(tmp_path):
    make_certificates(1, tmp_path)
    with pytest.raises(IdentityError, match="client-5.pem not found"):
        load_identity(tmp_path, 5)
    os.chmod(tmp_path / key_file(0), 0o644)
    with pytest.raises(IdentityError, match="readable by other users"):
        load_identity(tmp_path, 0)
    with pytest.raises(IdentityError, match="ca.pem not found"):
        load_identity(tmp_path / "nowhere", 0)


@pytest.mark.parametrize("kwargs, match", [({"num_clients": 0}, "num_clients"), ({"num_clients": 2, "days": 0}, "days"), ({"num_clients": 2, "run_id": "Bad Id"}, "run id")])
def test_bad_arguments_are_refused(tmp_path, kwargs, match):
    with pytest.raises(IdentityError, match=match):
        make_certificates(out_dir=tmp_path, **kwargs)
