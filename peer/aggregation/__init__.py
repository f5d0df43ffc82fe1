"""Aggregation: target performance metrics (TPM), reweighting strategies (CRS) and rules.

Pure tensor code: nothing here imports a transport (gRPC, ZeroMQ) or ``peer.transport``, so
rules can be tested and reused without a network.

Every registered TPM, CRS and rule class is importable from this package by its class name
(``from dfedrw.peer.aggregation import Median``): the names are read off the registries, not
listed by hand, so a class in a new module is exported as soon as it registers.
"""

from typing import Any

from dfedrw.peer.aggregation.crs import CRS, CRS_REGISTRY, ReweightingStrategy, apply_crs_contract, make_crs
from dfedrw.peer.aggregation.rules import (
    RULE_REGISTRY,
    Aggregate,
    RoundBatch,
    RoundInputs,
    Rule,
    build_rule,
    finite_rows,
    takes_tpm_and_crs,
    weighted_sum,
)
from dfedrw.peer.aggregation.tpm import TPM, TPM_REGISTRY, Evaluate, make_tpm

__all__ = [
    "CRS",
    "CRS_REGISTRY",
    "RULE_REGISTRY",
    "TPM",
    "TPM_REGISTRY",
    "Aggregate",
    "Evaluate",
    "ReweightingStrategy",
    "RoundBatch",
    "RoundInputs",
    "Rule",
    "apply_crs_contract",
    "build_rule",
    "finite_rows",
    "make_crs",
    "make_tpm",
    "takes_tpm_and_crs",
    "weighted_sum",
]


def registered_classes() -> dict[str, type]:
    """Class name -> class of every built-in TPM, CRS and rule (what this package exports
    besides :data:`__all__`)."""
    out: dict[str, type] = {}
    for registry in (TPM_REGISTRY, CRS_REGISTRY, RULE_REGISTRY):
        for name in registry.builtin_names():
            cls = registry.resolve(name)
            out[cls.__name__] = cls
    return out


def __getattr__(name: str) -> Any:
    classes = registered_classes()
    if name in classes:
        return classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *registered_classes()})
