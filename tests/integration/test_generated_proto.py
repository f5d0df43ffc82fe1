"""The committed gRPC modules must be exactly what scripts/gen_proto.py generates."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_current(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--out", str(tmp_path)], check=True, capture_output=True)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert generated, "the generator wrote nothing"
    for rel in generated:
        committed = ROOT / rel
        assert committed.exists(), f"{rel} is generated but not committed"
        assert committed.read_text() == (tmp_path / rel).read_text(), f"{rel} is stale: run python scripts/gen_proto.py"


def test_aggregation_code_imports_no_network_library():
    code = (
        "import sys, dfedrw.peer.aggregation, dfedrw.peer.attacks, dfedrw.peer.learning.training, dfedrw.peer.learning.models, dfedrw.peer.learning.data; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('grpc', 'zmq')]; "
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
