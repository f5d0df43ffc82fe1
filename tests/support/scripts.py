"""A script of ``scripts/`` (or a bench of ``bench/``) loaded as a module, for the tests that
call its ``main`` or its parts."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


def load_script(name: str, folder: Path = SCRIPTS) -> ModuleType:
    """``scripts/<name>.py`` (or ``folder/<name>.py``), executed as a fresh module named ``name``."""
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` as a fresh module."""
    return load_script(name, REPO / "bench")
