"""The layering of the packages: what a light module may import, checked in a fresh interpreter."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_scenario_plan_imports_neither_torch_nor_grpc():
    code = "import peer.plan, sys; print('torch' in sys.modules, 'grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr
