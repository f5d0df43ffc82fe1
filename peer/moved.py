"""Names and modules that moved, still importable from where they were, with a
:class:`DeprecationWarning` naming where they are now (users' plugins and scripts may name the
old place): a name moved out of a module (:func:`moved_names`, that module's ``__getattr__``),
and a module moved to another room (:data:`MOVED_MODULES`, answered by :class:`MovedModules`,
which ``import dfedrw.peer`` installs). A moved module imported by its old name is the same
module object as under its new name, so a registry in it exists once."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["MOVED_MODULES", "MovedModules", "install", "moved_names"]


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


# Old module (or package: its submodules follow it) -> where it is now.
MOVED_MODULES: dict[str, str] = {
    "dfedrw.peer.config_aggregation": "dfedrw.peer.config.aggregation",
    "dfedrw.peer.config_checks": "dfedrw.peer.config.checks",
    "dfedrw.peer.config_legacy": "dfedrw.peer.config.legacy",
    "dfedrw.peer.config_sections": "dfedrw.peer.config.sections",
    "dfedrw.peer.config_tables": "dfedrw.peer.config.tables",
    "dfedrw.peer.overrides": "dfedrw.peer.config.overrides",
    "dfedrw.peer.unused": "dfedrw.peer.config.unused",
    "dfedrw.peer.catalog": "dfedrw.peer.kinds.catalog",
    "dfedrw.peer.plugins": "dfedrw.peer.kinds.rules",
    "dfedrw.peer.transports": "dfedrw.peer.transport.kinds",
    "dfedrw.peer.plan": "dfedrw.peer.wiring.plan",
    "dfedrw.peer.assembly": "dfedrw.peer.wiring.assembly",
    "dfedrw.peer.memory": "dfedrw.peer.wiring.memory",
    "dfedrw.peer.node": "dfedrw.peer.client.client",
    "dfedrw.peer.byzantine_loop": "dfedrw.peer.client.byzantine",
    "dfedrw.peer.collusion": "dfedrw.peer.client.collusion",
    "dfedrw.peer.rejoin": "dfedrw.peer.client.rejoin",
    "dfedrw.peer.presence": "dfedrw.peer.client.presence",
    "dfedrw.peer.rounds": "dfedrw.peer.client.rounds",
    "dfedrw.peer.checkpoint": "dfedrw.peer.client.checkpoint",
    "dfedrw.peer.telemetry": "dfedrw.peer.client.telemetry",
    "dfedrw.peer.rendezvous": "dfedrw.peer.client.rendezvous",
    "dfedrw.peer.identity": "dfedrw.peer.transport.identity",
    "dfedrw.peer.intake": "dfedrw.peer.transport.intake",
    "dfedrw.peer.tensorboard": "dfedrw.peer.results.tensorboard",
    "dfedrw.launch.collect": "dfedrw.peer.results.collect",
    "dfedrw.peer.data": "dfedrw.peer.learning.data",
    "dfedrw.peer.datacache": "dfedrw.peer.learning.datacache",
    "dfedrw.peer.datasets": "dfedrw.peer.learning.datasets",
    "dfedrw.peer.models": "dfedrw.peer.learning.models",
    "dfedrw.peer.training": "dfedrw.peer.learning.training",
    "dfedrw.peer.model_matrix": "dfedrw.peer.learning.model_matrix",
    "dfedrw.peer.topology": "dfedrw.peer.graph.topology",
    "dfedrw.peer.schedule": "dfedrw.peer.graph.schedule",
    "dfedrw.peer.transport.grpc_admission": "dfedrw.peer.transport.grpc.admission",
    "dfedrw.peer.transport.grpc_io": "dfedrw.peer.transport.grpc.loop",
    "dfedrw.peer.transport.grpc_sender": "dfedrw.peer.transport.grpc.sender",
    "dfedrw.peer.transport.grpc_tls": "dfedrw.peer.transport.grpc.tls",
    "dfedrw.peer.transport.grpc_transport": "dfedrw.peer.transport.grpc.transport",
    "dfedrw.launch.batched_run": "dfedrw.engines.batched_run",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a module of :data:`MOVED_MODULES` by its old name: the import warns, and the old
    name is bound to the module under its new name (imported if it was not)."""

    def __init__(self, moves: Mapping[str, str]) -> None:
        self.moves = dict(moves)
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def target(self, name: str) -> str | None:
        """Where the module ``name`` is now, or None if it did not move."""
        for old, new in self.moves.items():
            if name == old or name.startswith(old + "."):
                return new + name[len(old):]
        return None

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if self.target(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = self.target(spec.name)
        assert new is not None
        warnings.warn(f"module {spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import machinery gave the module the old name's spec; it keeps its own.
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)


def install() -> None:
    """Answer imports of moved modules by their old names (once per process; first in
    ``sys.meta_path``, so that a moved package's submodules are never loaded twice)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules(MOVED_MODULES))
