"""What the launcher reads from its zmq socket: malformed frames and fake registrations are
dropped and counted, never raised, and never change a client's address (no socket here: the
socket itself is in tests/integration/test_launcher_socket.py)."""

import json
from collections import Counter

import pytest

from dfedrw.launch import link
from dfedrw.launch.link import LinkGate, parse_frame
from dfedrw.launch.progress import ProgressBoard
from tests.support.runs import quiet_console
from tests.support.link import MALFORMED, TOKENS, frame, register


@pytest.mark.parametrize("frames,reason", MALFORMED.values(), ids=MALFORMED.keys())
def test_parse_frame_names_why_a_malformed_frame_is_dropped(frames, reason):
    assert parse_frame(frames) == reason


@pytest.mark.parametrize(
    "msg",
    [
        register(),
        register(token=...),  # accepted by the parser; the gate refuses it
        register(address="[::1]:5000"),
        {"type": "round", "id": 0, "round": 0},
        {"type": "round", "id": 1, "round": 7, "train_loss": 0.5, "accuracy": 91.0, "global_accuracy": None},
        {"type": "round", "id": 1, "round": 7, "train_loss": float("nan")},
        {"type": "done", "id": 2, "accuracy": 90, "global_accuracy": 88.5},
    ],
)
def test_parse_frame_returns_well_formed_messages(msg):
    assert parse_frame(frame(msg)) == json.loads(json.dumps(msg))


def test_gate_counts_every_malformed_frame_and_learns_nothing():
    gate = LinkGate(dict(TOKENS))
    for frames, _ in MALFORMED.values():
        assert isinstance(gate.admit(frames), str)
    assert gate.dropped == Counter(reason for _, reason in MALFORMED.values())
    assert gate.addresses == {} and gate.identities == {}


@pytest.mark.parametrize(
    "token",
    [None, "", "0" * 32, TOKENS[1], TOKENS[0][:-1], TOKENS[0] + "0", TOKENS[0].upper(), "é" * 32, "\ud800" * 32],
    ids=["none", "empty", "zeros", "another client's", "short", "long", "look-alike", "non-ascii", "lone surrogate"],
)
def test_registration_without_the_clients_token_is_dropped(token):
    gate = LinkGate(dict(TOKENS))
    assert gate.admit(frame(register(0, token=token if token is not None else ...))) == link.BAD_TOKEN
    assert gate.dropped == {link.BAD_TOKEN: 1} and gate.addresses == {}


def test_registration_for_a_client_the_launcher_did_not_start_is_dropped():
    gate = LinkGate(dict(TOKENS))
    for k in (4, -1, 10**30):
        assert gate.admit(frame(register(k, address="127.0.0.1:5000", token=TOKENS[0]))) == link.UNKNOWN_ID
    assert gate.dropped == {link.UNKNOWN_ID: 3}


def test_fake_registrations_for_every_client_never_take_an_address():
    gate = LinkGate(dict(TOKENS))
    fakes = 0
    for i in range(1320):
        for k in TOKENS:
            token = ... if i % 3 == 0 else f"{i:032x}"
            identity = i.to_bytes(4, "big")
            assert gate.admit([identity, json.dumps(register(k, address=f"127.0.0.1:{40000 + i}", token=token)).encode()]) == link.BAD_TOKEN
            fakes += 1
    assert fakes == 5280 and gate.dropped == {link.BAD_TOKEN: 5280}
    for k in TOKENS:
        assert isinstance(gate.admit([b"real%d" % k, json.dumps(register(k)).encode()]), dict)
    assert gate.addresses == {k: f"127.0.0.1:{5000 + k}" for k in TOKENS}


def test_second_registration_never_moves_an_address_even_with_the_right_token():
    gate = LinkGate(dict(TOKENS))
    assert isinstance(gate.admit([b"first", json.dumps(register(0)).encode()]), dict)
    for identity in (b"first", b"thief"):
        assert gate.admit([identity, json.dumps(register(0, address="127.0.0.1:6666")).encode()]) == link.SECOND_REGISTRATION
    assert gate.addresses == {0: "127.0.0.1:5000"} and gate.identities == {0: b"first"}
    assert gate.dropped == {link.SECOND_REGISTRATION: 2}


def test_telemetry_is_taken_only_from_the_connection_that_registered():
    gate = LinkGate(dict(TOKENS))
    round_msg = json.dumps({"type": "round", "id": 0, "round": 3, "train_loss": 0.1}).encode()
    assert gate.admit([b"early", round_msg]) == link.WRONG_SENDER
    gate.admit([b"client0", json.dumps(register(0)).encode()])
    assert gate.admit([b"other", round_msg]) == link.WRONG_SENDER
    assert gate.admit([b"other", json.dumps({"type": "done", "id": 0}).encode()]) == link.WRONG_SENDER
    assert gate.admit([b"client0", round_msg])["round"] == 3
    assert gate.dropped == {link.WRONG_SENDER: 3}


def test_progress_board_ignores_ill_typed_events():
    board = ProgressBoard(quiet_console(), {0: "honest", 1: "honest"}, rounds=10)
    for msg in [
        {"type": "round", "id": [0], "round": 1},
        {"type": "round", "id": True, "round": 1},
        {"type": "round", "id": 0, "round": "3"},
        {"type": "round", "id": 0, "round": 10**6},
        {"type": "round", "id": 0},
        {"type": "done", "id": "1"},
    ]:
        board.event(msg)
    assert board.round == {0: -1, 1: -1}
    board.event({"type": "round", "id": 0, "round": 2, "train_loss": "low", "accuracy": 10**400})
    board.event({"type": "round", "id": 1, "round": 4, "train_loss": 0.25, "accuracy": 91.5})
    board.refresh()
    assert board.round == {0: 2, 1: 4} and board.last == {0: {}, 1: {"train_loss": 0.25, "accuracy": 91.5}}



def test_round_events_go_at_most_every_quarter_second_and_evaluations_always(monkeypatch):
    from dfedrw.peer.client import link_messages, telemetry

    sent = []

    class _Sock:
        def send(self, data, flags=0):
            sent.append(json.loads(data))

    clock = [100.0]
    monkeypatch.setattr(telemetry.time, "monotonic", lambda: clock[0])
    link = telemetry.LauncherLink.__new__(telemetry.LauncherLink)
    link._sock, link.dropped, link.held, link._next_round_event = _Sock(), 0, 0, 0.0
    for r in range(10):  # ten rounds in 0.09 s: one event, then the evaluation's
        link.send(link_messages.round_event(0, r, 0.5, accuracy=80.0 if r == 7 else None))
        clock[0] += 0.01
    clock[0] += telemetry.ROUND_EVENT_EVERY
    link.send(link_messages.round_event(0, 10, 0.4))
    link.send(link_messages.done(0, 81.0, None))
    assert [(m["type"], m.get("round")) for m in sent] == [("round", 0), ("round", 7), ("round", 10), ("done", None)]
    assert link.held == 8
