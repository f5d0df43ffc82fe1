"""Byzantine attacks: what a malicious client sends its honest neighbours each round.

:mod:`.base` says what an attack is and what it may know (:class:`ThreatModel`,
:class:`AttackView`, :func:`craft_round`); the attacks live in one module per family, each class
registered in :data:`ATTACK_REGISTRY` under its scenario name. Pure tensor code: nothing here
imports a transport. Every registered class is importable from here by its class name (``from
dfedrw.peer.attacks import ALIE``), the names read off the registry.
"""

from dfedrw.peer.attacks import base
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
from dfedrw.peer.registry import export_registered

__all__ = list(base.__all__)
__getattr__, __dir__ = export_registered(__name__, globals(), ATTACK_REGISTRY)
