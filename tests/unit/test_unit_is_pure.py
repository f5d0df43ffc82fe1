"""tests/unit stays pure: no sockets, no subprocesses, no client processes and no in-process
networks. Tests that need them belong in tests/integration (several clients in this process,
loopback allowed, or a tool run as a subprocess) or tests/multiprocess (real client processes).
A cheap check of the source: the names below do not appear in any tests/unit file."""

import re
from pathlib import Path

FORBIDDEN = (
    "subprocess",
    "Popen",
    "socket.",
    "zmq.",
    "grpc.server",
    "grpc.aio",
    "secure_channel",
    "insecure_channel",
    "GrpcTransport(",
    "TCPStore(",
    "LocalRun(",
    "run_scenario(",
    "run_inproc(",
)
PATTERN = re.compile("|".join(r"(?<!\w)" + re.escape(name) for name in FORBIDDEN))  # socket. but not test_launcher_socket.py
HERE = Path(__file__).resolve()


def test_no_unit_test_opens_a_socket_or_starts_a_process():
    found = []
    for path in sorted(HERE.parent.glob("*.py")):
        if path == HERE:
            continue  # the list itself
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = PATTERN.search(line)
            if match:
                found.append(f"tests/unit/{path.name}:{number}: {match.group(0)!r} in {line.strip()!r}")
    assert not found, "move these tests to tests/integration or tests/multiprocess:\n" + "\n".join(found)
