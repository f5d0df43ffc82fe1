"""The aggregation stack's and the attacks' registries in one place, and the one builder of a
rule from names (what is registered, of every kind, is listed by :mod:`peer.kinds.catalog`).

:func:`build_named_rule` adds to the settings what the running system knows: the supplied values
(a client's number of Byzantine neighbours, the learning rate, a seed, the TPM and CRS objects) go
to the constructors that take them (see :mod:`peer.registry`). Building from a scenario's
sections is :mod:`peer.wiring.build`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dfedrw.peer.aggregation.crs import CRS_REGISTRY
from dfedrw.peer.aggregation.rules import RULE_REGISTRY, takes_tpm_and_crs
from dfedrw.peer.aggregation.tpm import TPM_REGISTRY
from dfedrw.peer.attacks import ATTACK_REGISTRY

__all__ = ["ATTACK_REGISTRY", "CRS_REGISTRY", "RULE_REGISTRY", "TPM_REGISTRY", "build_named_rule"]


def build_named_rule(rule: str, tpm: str, crs: str, settings: Mapping[str, Mapping[str, Any]], supplied: Mapping[str, Any]) -> Any:
    """The rule ``rule`` with ``settings["rule"]``, given ``supplied`` where its constructor takes
    them; the TPM ``tpm`` and CRS ``crs`` (with ``settings["tpm"]``, ``settings["crs"]``) are built
    only for a rule that takes them (DFedReweighting). Raises ``ValueError`` from the classes."""
    given = dict(supplied)
    if takes_tpm_and_crs(rule):
        # A CRS may take what the running system gives too (a bound on Byzantine neighbours).
        given["tpm"] = TPM_REGISTRY.build(tpm, settings.get("tpm"))
        given["crs"] = CRS_REGISTRY.build(crs, settings.get("crs"), supplied)
    supplied = given
    return RULE_REGISTRY.build(rule, settings.get("rule"), supplied)
