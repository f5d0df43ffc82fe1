"""Byzantine attacks: what a malicious client sends its honest neighbours each round.

:mod:`.base` says what an attack is and what it may know (:class:`ThreatModel`,
:class:`AttackView`, :func:`craft_round`); the attacks themselves live in one module per
family, each class registered in :data:`ATTACK_REGISTRY` under its scenario name. Pure tensor
code: nothing here imports a transport.
"""

from dfedrw.peer.attacks.base import (
    ATTACK_REGISTRY,
    Attack,
    AttackerData,
    AttackView,
    Crafted,
    RoundAttack,
    ThreatModel,
    craft_round,
    make_attack,
    threat_model_of,
)
from dfedrw.peer.attacks.classic import ALIE, IPM, Gaussian, SignFlip, alie_z_max

__all__ = [
    "ALIE",
    "ATTACK_REGISTRY",
    "IPM",
    "Attack",
    "AttackView",
    "AttackerData",
    "Crafted",
    "Gaussian",
    "RoundAttack",
    "SignFlip",
    "ThreatModel",
    "alie_z_max",
    "craft_round",
    "make_attack",
    "threat_model_of",
]
