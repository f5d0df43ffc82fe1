"""Building a client's rule or a Byzantine client's attack from a scenario (what is registered,
of every kind, is listed by :mod:`peer.catalog`).

A rule, TPM, CRS or attack is one class registered by name (see
:mod:`peer.registry`); its constructor's parameters are its settings. This module
adds what the running system knows: :func:`build_rule_from` and :func:`build_attack_from`
pass the supplied values (a client's number of Byzantine neighbours, the learning rate, a
seed, the number of clients, the TPM and CRS objects) to the constructors that take them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dfedrw.peer.aggregation.crs import CRS_REGISTRY
from dfedrw.peer.aggregation.rules import RULE_REGISTRY, takes_tpm_and_crs
from dfedrw.peer.aggregation.tpm import TPM_REGISTRY
from dfedrw.peer.attacks import ATTACK_REGISTRY
from dfedrw.peer.schedule import receive_window

if TYPE_CHECKING:
    from dfedrw.peer.config import AggregationConfig, AttackConfig, Scenario

__all__ = [
    "ATTACK_REGISTRY",
    "CRS_REGISTRY",
    "RULE_REGISTRY",
    "TPM_REGISTRY",
    "build_attack",
    "build_attack_from",
    "build_client_rule",
    "build_rule_from",
]


def build_rule_from(cfg: AggregationConfig, *, num_byzantine: int, lr: float, seed: int, total_rounds: int = 0) -> Any:
    """The rule ``cfg`` names, with its settings; the TPM and CRS are built only for a rule
    that takes them (DFedReweighting). Raises ``ValueError`` from the classes."""
    supplied: dict[str, Any] = {"num_byzantine": num_byzantine, "lr": lr, "seed": seed, "total_rounds": total_rounds}
    if takes_tpm_and_crs(cfg.rule):
        supplied["tpm"] = TPM_REGISTRY.build(cfg.tpm, cfg.params("tpm"))
        supplied["crs"] = CRS_REGISTRY.build(cfg.crs, cfg.params("crs"))
    return RULE_REGISTRY.build(cfg.rule, cfg.params("rule"), supplied)


def build_attack_from(cfg: AttackConfig, *, num_clients: int, num_byzantine: int, **knowledge: Any) -> Any:
    """The attack ``cfg`` names, with its settings; ``knowledge`` (``defence``,
    ``attacker_data``, ``lr``, ``total_rounds``) goes to a constructor that declares it.
    Raises ``ValueError`` for ``"none"``."""
    if cfg.name == "none":
        raise ValueError("attack.name='none' has no Byzantine behaviour")
    return ATTACK_REGISTRY.build(cfg.name, cfg.params(), {"num_clients": num_clients, "num_byzantine": num_byzantine, **knowledge})


def build_client_rule(scenario: Scenario, client: int, num_byzantine: int, lr: float, seed: int) -> Any:
    """Client ``client``'s rule: [aggregation] with its [peers.K.aggregation] overrides."""
    return build_rule_from(
        scenario.aggregation_for(client), num_byzantine=num_byzantine, lr=lr, seed=seed, total_rounds=scenario.rounds
    )


def build_attack(scenario: Scenario, num_clients: int, num_byzantine: int, **knowledge: Any) -> Any:
    """The scenario's attack, as a Byzantine client runs it (``knowledge``: see
    :func:`build_attack_from`)."""
    return build_attack_from(
        scenario.attack, num_clients=num_clients, num_byzantine=num_byzantine,
        lr=scenario.train.lr, total_rounds=scenario.rounds,
        round_window=receive_window(scenario.network.round_window, scenario.topology.schedule), **knowledge,
    )
