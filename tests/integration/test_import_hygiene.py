"""Import hygiene, checked in a fresh interpreter (a subprocess), so modules that other tests
imported do not count."""

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_aggregation_and_attacks_import_no_transport():
    # Prepare: a fresh interpreter, so modules other tests imported do not count
    code = (
        "import dfedrw.peer.aggregation, dfedrw.peer.attacks, sys; "
        "assert not any(m.split('.')[0] in ('grpc', 'zmq') for m in sys.modules), "
        "sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'zmq')); "
        "assert 'dfedrw.peer.transport' not in sys.modules and 'peer' not in sys.modules"
    )

    # Execute
    completed = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=120)

    # Assert
    assert completed.returncode == 0, completed.stderr
