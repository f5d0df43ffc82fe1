"""Aggregation: target performance metrics (TPM), reweighting strategies (CRS) and rules.

Pure tensor code, no transport (gRPC, ZeroMQ, ``peer.transport``): rules run without a network.

Every registered TPM, CRS and rule class is importable from this package by its class name
(``from dfedrw.peer.aggregation import Median``): the names are read off the registries, so a
class in a new module is exported as soon as it registers.
"""

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
from dfedrw.peer.registry import export_registered

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


__getattr__, __dir__ = export_registered(__name__, globals(), TPM_REGISTRY, CRS_REGISTRY, RULE_REGISTRY)
