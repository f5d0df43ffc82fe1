"""Names that moved to another module, still importable from where they were, with a
:class:`DeprecationWarning` naming where they are now (users' plugins and scripts may name the
old place)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["moved_names"]


def moved_names(module: str, moves: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module`` whose names ``moves`` (name -> the module that now
    holds it) are looked up there on use, with a warning. The new module is imported only then:
    it may lie above ``module`` (a registry keeps no import of the wiring that builds from a
    scenario)."""

    def getattr_(name: str) -> Any:
        if name not in moves:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} moved to {moves[name]}.{name}; import it from there", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(moves[name]), name)

    return getattr_
