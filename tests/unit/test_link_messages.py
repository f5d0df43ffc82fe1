"""The launcher link's schema (peer/client/link_messages.py): every message a builder makes is
taken by the launcher's ``parse_frame`` as it was sent, the address book the launcher builds
is read back by the client, and a reply that is not one is refused with a clear error."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dfedrw.launch import link
from dfedrw.peer.client import link_messages as lm

IDENTITY = b"\x00\x80\x00\x00\x01"

ids = st.integers(0, 2**31 - 1)
hosts = st.sampled_from(["127.0.0.1", "10.1.2.3", "localhost", "[::1]", "[fe80::1%eth0]", "client-3.run.dfedrw"])
addresses = st.builds(lambda host, port: f"{host}:{port}", hosts, st.integers(1, 65535))
roles = st.text(st.characters(codec="utf-8", categories=["L", "N", "P"]), min_size=1, max_size=256)
tokens = st.none() | st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=256)
# Any float (a diverged loss is inf or nan) or an int the progress board can format.
numbers = st.none() | st.floats() | st.integers(-(2**53) + 1, 2**53 - 1)


def parsed(msg):
    """``msg`` as the launcher's parse_frame takes it, behind a routing identity."""
    return lm.parse_frame([IDENTITY, lm.encode(msg)])


def assert_taken_unchanged(msg):
    got = parsed(msg)
    assert isinstance(got, dict), got
    # Compared as JSON text, so that nan equals nan.
    assert got.keys() == msg.keys() and lm.encode(got) == lm.encode(msg)


@settings(max_examples=200, deadline=None)
@given(k=ids, address=addresses, pid=st.integers(0, 2**22), role=roles, token=tokens)
def test_a_registration_passes_parse_frame_unchanged(k, address, pid, role, token):
    msg = lm.register(k, address, pid, role, token)
    assert ("token" in msg) == (token is not None)
    assert_taken_unchanged(msg)


@settings(max_examples=200, deadline=None)
@given(k=ids, r=st.integers(0, 10**6), train_loss=numbers, accuracy=numbers, global_accuracy=numbers)
def test_a_round_event_passes_parse_frame_unchanged(k, r, train_loss, accuracy, global_accuracy):
    msg = lm.round_event(k, r, train_loss, accuracy=accuracy, global_accuracy=global_accuracy)
    given_ = {"train_loss": train_loss, "accuracy": accuracy, "global_accuracy": global_accuracy}
    # A measure is on the wire only when there is one.
    assert msg == {"type": "round", "id": k, "round": r, **{key: v for key, v in given_.items() if v is not None}}
    assert_taken_unchanged(msg)


@settings(max_examples=100, deadline=None)
@given(k=ids, accuracy=numbers, global_accuracy=numbers)
def test_a_done_event_passes_parse_frame_unchanged(k, accuracy, global_accuracy):
    msg = lm.done(k, accuracy, global_accuracy)
    assert msg.keys() == {"type", "id", "accuracy", "global_accuracy"}  # null when there was no evaluation
    assert_taken_unchanged(msg)


def test_the_events_clients_send_carry_the_fields_they_always_did():
    assert lm.round_event(3, 0) == {"type": "round", "id": 3, "round": 0}  # a Byzantine client's
    last = {"accuracy": 91.5, "global_accuracy": 88.0}
    assert lm.round_event(3, 9, 0.25, **last) == {"type": "round", "id": 3, "round": 9, "train_loss": 0.25, **last}
    assert lm.done(3) == {"type": "done", "id": 3, "accuracy": None, "global_accuracy": None}
    assert lm.register(1, "127.0.0.1:5001", 42, "honest") == {"type": "register", "id": 1, "address": "127.0.0.1:5001", "pid": 42, "role": "honest"}


def test_the_largest_registration_fits_a_frame():
    msg = lm.register(2**31, "a" * 250 + ":65535", 2**22, "r" * 256, "t" * 256)
    assert len(lm.encode(msg)) <= lm.MAX_FRAME_BYTES and isinstance(parsed(msg), dict)


def test_the_launcher_takes_no_address_book_from_a_client():
    assert parsed(lm.address_book({0: "127.0.0.1:1"})) == lm.UNKNOWN_TYPE


def test_launch_link_names_the_schema_s_own_objects():
    for name in ("parse_frame", "TOKEN_ENV", "MAX_FRAME_BYTES", "MALFORMED", *(n.upper() for n in lm.MALFORMED)):
        assert getattr(link, name) is getattr(lm, name), name
    assert set(lm.MALFORMED).isdisjoint({link.UNKNOWN_ID, link.BAD_TOKEN, link.SECOND_REGISTRATION, link.WRONG_SENDER})


@settings(max_examples=100, deadline=None)
@given(book=st.dictionaries(ids, addresses, max_size=20))
def test_read_address_book_takes_what_the_launcher_builds(book):
    reply = lm.address_book(book)
    assert lm.read_address_book(lm.encode(reply)) == book
    assert lm.read_address_book(json.loads(lm.encode(reply))) == book


GOOD = {"0": "127.0.0.1:5000", "1": "[::1]:5001"}


@pytest.mark.parametrize(
    "reply,error",
    [
        (b"", "not JSON"),
        (b"\xff\xfe{", "not JSON"),
        (b"[" * 50_000, "not JSON"),
        ([GOOD], "not an address book .type 'list'"),
        ({"addresses": GOOD}, "not an address book .type None"),
        ({"type": "abort", "reason": "x"}, "not an address book .type 'abort'"),
        ({"type": "round", "id": 0, "round": 1}, "not an address book .type 'round'"),
        ({"type": "addresses"}, "not an object of id -> address: NoneType"),
        ({"type": "addresses", "addresses": list(GOOD.items())}, "not an object of id -> address: list"),
        ({"type": "addresses", "addresses": {**GOOD, "two": "127.0.0.1:1"}}, "key that is not a client id: 'two'"),
        ({"type": "addresses", "addresses": {**GOOD, "-1": "127.0.0.1:1"}}, "key that is not a client id: '-1'"),
        ({"type": "addresses", "addresses": {**GOOD, "01": "127.0.0.1:1"}}, "key that is not a client id: '01'"),
        ({"type": "addresses", "addresses": {**GOOD, "²": "127.0.0.1:1"}}, "key that is not a client id"),
        ({"type": "addresses", "addresses": {**GOOD, "2": None}}, "client 2 no host:port address: 'None'"),
        ({"type": "addresses", "addresses": {**GOOD, "2": 5002}}, "client 2 no host:port address"),
        ({"type": "addresses", "addresses": {**GOOD, "2": "127.0.0.1"}}, "client 2 no host:port address"),
        ({"type": "addresses", "addresses": {**GOOD, "2": "127.0.0.1:0"}}, "client 2 no host:port address"),
        ({"type": "addresses", "addresses": {**GOOD, "2": "127.0.0.1:1\n[red]x"}}, "client 2 no host:port address"),
    ],
)
def test_read_address_book_refuses_what_is_not_one(reply, error):
    with pytest.raises(ValueError, match=error):
        lm.read_address_book(reply if isinstance(reply, bytes) else json.dumps(reply).encode())
