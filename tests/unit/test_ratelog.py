"""The rate-limited log for rejections, and escaping of text taken from a message."""

import logging

from dfedrw.peer.transport.ratelog import RateLimitedLog, quote


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append((record.levelname, record.getMessage()))


def logger(name):
    lg = logging.getLogger(f"test.ratelog.{name}")
    lg.setLevel(logging.DEBUG)
    lg.propagate = False
    lines = Lines()
    lg.handlers[:] = [lines]
    return lg, lines


def test_one_line_per_key_per_interval_and_the_next_counts_what_was_left_out():
    lg, lines = logger("interval")
    clock = Clock()
    quiet = RateLimitedLog(lg, interval=10.0, clock=clock)
    assert quiet.log(logging.WARNING, "bad_checksum", "rejected %s", "bad_checksum")
    for _ in range(99):
        clock.now += 0.05
        assert not quiet.log(logging.WARNING, "bad_checksum", "rejected %s", "bad_checksum")
    # Another reason has its own allowance.
    assert quiet.log(logging.WARNING, "duplicate", "rejected %s", "duplicate")
    assert quiet.suppressed() == 99
    clock.now = 1000.0 + 10.0
    assert quiet.log(logging.WARNING, "bad_checksum", "rejected %s", "bad_checksum")
    assert quiet.suppressed() == 0
    assert lines.lines == [
        ("WARNING", "rejected bad_checksum"),
        ("WARNING", "rejected duplicate"),
        ("WARNING", "rejected bad_checksum (99 more like it in the last 10 s not logged)"),
    ]
    clock.now += 10.0
    quiet.log(logging.WARNING, "bad_checksum", "rejected %s", "bad_checksum")
    assert lines.lines[-1] == ("WARNING", "rejected bad_checksum")


def test_a_disabled_level_costs_nothing():
    lg, lines = logger("disabled")
    lg.setLevel(logging.WARNING)
    quiet = RateLimitedLog(lg, clock=Clock())
    assert not quiet.log(logging.INFO, "stale_round", "stale")
    assert lines.lines == [] and quiet.suppressed() == 0


def test_quote_escapes_and_truncates():
    forged = "x\n2026-01-01 00:00:00 ERROR peer.client.client: client 0 crashed"
    q = quote(forged)
    assert "\n" not in q and q.startswith("'x\\n") and q.endswith("...")
    assert q == ascii(forged[:40]) + "..."
    assert quote("w\u202e\x1b[31m") == "'w\\u202e\\x1b[31m'"
    assert quote("0.weight") == "'0.weight'"
    assert quote((1, 2)) == "'(1, 2)'"
    assert quote(b"\xff\x00") == "b'\\xff\\x00'"
