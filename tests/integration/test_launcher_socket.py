"""The launcher's own zmq socket (a ROUTER on loopback), with in-process clients: the real
address book reaches the real clients under attack, and dropped frames are logged sparingly."""

import io
import threading
import time

import pytest
import zmq
from rich.console import Console

from dfedrw.launch import link
from dfedrw.launch.link import MAX_FRAME_BYTES
from dfedrw.launch.local import Child, LocalRun
from dfedrw.launch.progress import ProgressBoard
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.client.telemetry import LauncherLink
from tests.support.runs import quiet_console
from tests.support.link import MALFORMED, TOKENS, register


class _AliveProc:
    pid = 0

    def poll(self):
        return None


@pytest.fixture
def launcher(tmp_path):
    scenario = load_scenario(None, ["topology.honest=4", "topology.byzantine=0", "attack.name=none"])
    run = LocalRun(scenario, tmp_path, console=quiet_console())
    for k, token in TOKENS.items():
        run.gate.tokens[k] = token
        run.children[k] = Child(k, "honest", _AliveProc(), tmp_path / f"{k}.log")
    board = ProgressBoard(run.console, {k: "honest" for k in TOKENS}, scenario.rounds)
    yield run, board
    run._sock.close()
    run._ctx.term()


def _dealer(ctx, endpoint):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def test_launcher_hands_the_real_book_to_real_clients_under_attack(launcher):
    run, board = launcher
    ctx = zmq.Context()
    attacker = _dealer(ctx, run.endpoint)
    big = _dealer(ctx, run.endpoint)
    books, errors = {}, []

    def client(k):
        link_ = LauncherLink(run.endpoint, TOKENS[k])
        try:
            books[k] = link_.register(k, f"127.0.0.1:{5000 + k}", 100 + k, "honest", timeout=20)
            link_.send({"type": "round", "id": k, "round": 0, "train_loss": 0.5})
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            link_.close()

    try:
        # The attacker goes first, so its fakes are ahead of every real registration.
        big.send(b" " * (MAX_FRAME_BYTES + 1))  # zmq closes this connection; the launcher never sees it
        # A DEALER sends no identity frame (the ROUTER adds its own) and never an empty message.
        malformed = [frames[1:] or [b""] for frames, _ in MALFORMED.values() if len(frames) > 1 and len(frames[-1]) <= MAX_FRAME_BYTES]
        for frames in malformed:
            attacker.send_multipart(frames)
        for i in range(250):
            for k in TOKENS:
                attacker.send_json(register(k, address=f"127.0.0.1:{40000 + i}", token=... if i % 2 else f"{i:032x}"))
        for k in TOKENS:
            attacker.send_json({"type": "round", "id": k, "round": 5})
        threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in TOKENS]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not run._book_sent:
            run._receive(board, 100)
            run._maybe_send_book()
        for t in threads:
            t.join(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and board.round != {k: 0 for k in TOKENS}:
            run._receive(board, 100)
        assert not errors and run._book_sent
        real = {k: f"127.0.0.1:{5000 + k}" for k in TOKENS}
        assert all(books[k] == real for k in TOKENS)
        assert {k: c.address for k, c in run.children.items()} == real
        assert not attacker.poll(200), "the attacker was sent the address book"
        dropped = run.gate.dropped
        assert dropped[link.BAD_TOKEN] == 1000
        assert dropped[link.WRONG_SENDER] == 4
        assert sum(dropped[r] for r in link.MALFORMED) == len(malformed)
        assert board.round == {k: 0 for k in TOKENS}
    finally:
        attacker.close()
        big.close()
        ctx.term()


def test_dropped_frames_are_logged_escaped_short_and_rate_limited(launcher):
    run, _ = launcher
    out = io.StringIO()
    run.console = Console(file=out, width=200)
    hostile = b"\x1b[31m[red]:smile:\n" + b"A" * 5000
    for _ in range(100):
        assert run._handle([b"x", hostile]) is None
    text = out.getvalue()
    assert text.count("\n") == 1 and len(text) < 200
    assert "\x1b" not in text and "[red]" in text and ":smile:" in text
    assert run.gate.dropped == {link.NOT_JSON: 100}
