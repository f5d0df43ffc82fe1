"""Aggregation: target performance metrics (TPM), reweighting strategies (CRS) and rules.

Pure tensor code: nothing here imports a transport (gRPC, ZeroMQ) or ``peer.transport``, so
rules can be tested and reused without a network.
"""

from dfedrw.peer.aggregation.crs import (
    CRS,
    CRS_REGISTRY,
    AccuracyClippedAtMean,
    Clip,
    LossClippedAtMean,
    Proportional,
    ReweightingStrategy,
    Softmax,
    apply_crs_contract,
    make_crs,
)
from dfedrw.peer.aggregation.gossip import UBAR, ClippedGossip, CSPlusRG
from dfedrw.peer.aggregation.registry import build_from_registry
from dfedrw.peer.aggregation.coordinate import Median, TrimmedMean
from dfedrw.peer.aggregation.distance import GeometricMedian, Krum, MultiKrum
from dfedrw.peer.aggregation.robust import QFDFL, AccuracyAboveMean, Balance, CenteredClipping, Flame
from dfedrw.peer.aggregation.rules import (
    RULE_REGISTRY,
    Aggregate,
    DFedAvg,
    DFedReweighting,
    RoundBatch,
    RoundInputs,
    Rule,
    build_rule,
    finite_rows,
    weighted_sum,
)
from dfedrw.peer.aggregation.tpm import (
    TPM,
    TPM_REGISTRY,
    Accuracy,
    Evaluate,
    Loss,
    WeightedCombination,
    make_tpm,
)

__all__ = [
    "Accuracy",
    "AccuracyAboveMean",
    "AccuracyClippedAtMean",
    "Aggregate",
    "Balance",
    "CRS",
    "CRS_REGISTRY",
    "CSPlusRG",
    "CenteredClipping",
    "Clip",
    "ClippedGossip",
    "DFedAvg",
    "DFedReweighting",
    "Evaluate",
    "Flame",
    "GeometricMedian",
    "Krum",
    "Loss",
    "LossClippedAtMean",
    "Median",
    "MultiKrum",
    "Proportional",
    "QFDFL",
    "RULE_REGISTRY",
    "ReweightingStrategy",
    "RoundBatch",
    "RoundInputs",
    "Rule",
    "Softmax",
    "TPM",
    "TPM_REGISTRY",
    "TrimmedMean",
    "UBAR",
    "WeightedCombination",
    "apply_crs_contract",
    "build_from_registry",
    "build_rule",
    "finite_rows",
    "make_crs",
    "make_tpm",
    "weighted_sum",
]
