"""Byzantine attacks: what a malicious client sends its honest neighbours each round.

:mod:`.base` says what an attack is and what it may know (:class:`ThreatModel`,
:class:`AttackView`, :func:`craft_round`); the attacks themselves live in one module per
family, each class registered in :data:`ATTACK_REGISTRY` under its scenario name. Pure tensor
code: nothing here imports a transport.

Every registered attack class is importable from this package by its class name (``from
dfedrw.peer.attacks import ALIE``): the names are read off the registry, not listed by hand.
"""

from typing import Any

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

__all__ = [
    "ATTACK_REGISTRY",
    "Attack",
    "AttackView",
    "AttackerData",
    "Crafted",
    "RoundAttack",
    "ThreatModel",
    "craft_round",
    "make_attack",
    "threat_model_of",
]


def registered_classes() -> dict[str, type]:
    """Class name -> class of every built-in attack (what this package exports besides
    :data:`__all__`)."""
    return {ATTACK_REGISTRY.resolve(n).__name__: ATTACK_REGISTRY.resolve(n) for n in ATTACK_REGISTRY.builtin_names()}


def __getattr__(name: str) -> Any:
    classes = registered_classes()
    if name in classes:
        return classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *registered_classes()})
