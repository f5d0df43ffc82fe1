"""A local attacker on the launcher's socket while a real run starts (loopback only): malformed
frames and fake registrations are dropped and counted in summary.json, and every client gets
the other clients' real addresses."""

import json
import threading
import time

import pytest
import zmq

from dfedrw.launch import link
from dfedrw.launch.local import LocalRun
from dfedrw.peer.results.records import read_final
from tests.support.runs import quiet_console

SETTINGS = ("rounds=30", "eval.every=10", "topology.honest=4", "topology.byzantine=0", "attack.name=none")


def _start(small_scenario, tmp_path):
    run = LocalRun(small_scenario(*SETTINGS), tmp_path, console=quiet_console())
    result, errors = {}, []

    def target():
        try:
            result.update(run.run())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    return run, thread, result, errors


def _attack(endpoint, frames_list, sent):
    """Send each message (a list of frames) once, in order, from one DEALER; every send is
    bounded in time. Closing waits (at most a minute) until every queued frame has reached
    the launcher: a shorter linger discarded the frames a busy launcher had not read yet, and
    the count of those it dropped fell short of those sent."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 60_000)
    sock.setsockopt(zmq.SNDTIMEO, 30_000)
    sock.connect(endpoint)
    try:
        for frames in frames_list:
            try:
                sock.send_multipart(frames)
            except zmq.Again:
                break
            sent["frames"] = sent.get("frames", 0) + 1
    finally:
        sock.close()
        ctx.term()


def _finish(run, thread, result, errors, tmp_path, timeout=240):
    try:
        thread.join(timeout=timeout)
        assert not thread.is_alive(), "the run hung"
    finally:
        run.stop_all()
    assert not errors, errors
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == json.loads(json.dumps(result))
    assert summary["failed_peers"] == []
    assert all(p["completed"] and p["rounds_done"] == 30 for p in summary["peers"].values())
    # The address each client listened on is the one the launcher handed to the others.
    for k, child in run.children.items():
        assert child.address == read_final(tmp_path, k)["address"]
    return summary


def _malformed_messages():
    good_register = {"type": "register", "id": 0, "address": "127.0.0.1:1", "pid": 1, "role": "honest"}
    return [
        [b"{}", b"{}"],  # two frames
        [b""],
        [b"not json at all"],
        [b"\xff\xfe{"],
        [b"[" * 50_000],
        [json.dumps([1, 2]).encode()],
        [json.dumps("register").encode()],
        [json.dumps({"id": 0}).encode()],
        [json.dumps({"type": "addresses", "addresses": {"0": "127.0.0.1:1"}}).encode()],
        [json.dumps({**good_register, "id": [0]}).encode()],
        [json.dumps({k: v for k, v in good_register.items() if k != "address"}).encode()],
        [json.dumps({**good_register, "address": "127.0.0.1:1\n"}).encode()],
        [json.dumps({"type": "round", "id": 0, "round": "seven"}).encode()],
        [json.dumps({"type": "round", "id": 1, "round": 1, "train_loss": [1]}).encode()],
        [json.dumps({"type": "done", "id": "2"}).encode()],
    ]


@pytest.mark.slow
def test_malformed_frames_at_the_launcher_socket(small_scenario, tmp_path):
    run, thread, result, errors = _start(small_scenario, tmp_path)
    kinds = _malformed_messages()
    repeats = 100
    sent, big_sent = {}, {}
    # Sent from before the clients exist until well into the run.
    attacker = threading.Thread(target=_attack, args=(run.endpoint, kinds * repeats, sent), daemon=True)
    big = threading.Thread(target=_attack, args=(run.endpoint, [[b" " * (link.MAX_FRAME_BYTES + 1)]] * 5, big_sent), daemon=True)
    start = time.monotonic()
    attacker.start()
    big.start()
    thread.start()
    attacker.join(timeout=60)
    big.join(timeout=60)
    summary = _finish(run, thread, result, errors, tmp_path)
    dropped = summary["launcher_link"]["dropped"]
    print(f"\nsent {sent.get('frames')} malformed + {big_sent.get('frames')} oversized frames; dropped {dropped}; "
          f"run {time.monotonic() - start:.1f} s")
    assert sent["frames"] == len(kinds) * repeats
    assert sum(dropped.values()) == sent["frames"]
    for reason in (link.FRAMES, link.NOT_JSON, link.NOT_OBJECT, link.UNKNOWN_TYPE, link.BAD_FIELD):
        assert dropped[reason] > 0
    assert summary["launcher_link"]["registered"] == 4


@pytest.mark.slow
def test_fake_registrations_at_the_launcher_socket(small_scenario, tmp_path):
    run, thread, result, errors = _start(small_scenario, tmp_path)
    ids = range(4)
    per_id = 1320
    fakes = [
        [json.dumps({"type": "register", "id": k, "address": f"127.0.0.1:{40000 + i}", "pid": 1, "role": "honest",
                     **({} if i % 3 == 0 else {"token": f"{i:032x}"})}).encode()]
        for i in range(per_id)
        for k in ids
    ]
    sent = {}
    attacker = threading.Thread(target=_attack, args=(run.endpoint, fakes, sent), daemon=True)
    start = time.monotonic()
    attacker.start()
    thread.start()
    attacker.join(timeout=120)
    # Then as if each client's secret had leaked: a second registration, and telemetry from
    # another connection, for every client once the run is under way.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not run._book_sent:
        time.sleep(0.2)
    assert run._book_sent
    late = []
    for k in ids:
        token = run.gate.tokens[k]
        late.append([json.dumps({"type": "register", "id": k, "address": "127.0.0.1:1", "pid": 1, "role": "honest", "token": token}).encode()])
        late.append([json.dumps({"type": "round", "id": k, "round": 29}).encode()])
    late_sent = {}
    _attack(run.endpoint, late, late_sent)
    summary = _finish(run, thread, result, errors, tmp_path)
    dropped = summary["launcher_link"]["dropped"]
    print(f"\nsent {sent.get('frames')} fake registrations + {late_sent.get('frames')} with leaked tokens; dropped {dropped}; "
          f"run {time.monotonic() - start:.1f} s")
    assert sent["frames"] == per_id * len(ids)
    assert dropped[link.BAD_TOKEN] == per_id * len(ids)
    assert dropped[link.SECOND_REGISTRATION] == len(ids)
    assert dropped[link.WRONG_SENDER] == len(ids)
    assert summary["launcher_link"]["registered"] == 4
    assert all(not run.children[k].address.endswith(":1") for k in ids)
