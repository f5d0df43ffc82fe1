"""What an attack is, what it may know, and the one function every engine calls to run it.

An attack is one class registered in :data:`ATTACK_REGISTRY`; its constructor's parameters are
its settings (``[attack.NAME]``), as for rules. It comes in one of two shapes:

* **per receiver** (the classic attacks)::

      message = attack(received, receiver, generator)   # received: float32 [n, D], n may be 0
                                                        # message: float32 [D], or None = silent

* **per round** (attacks that use the round, the senders, the colluders or a plan)::

      crafted = attack.plan(view, generator)             # view: AttackView
      crafted.messages[receiver]                         # float32 [D], or None = silent
      crafted.note                                       # what the attacker's round record keeps

:func:`craft_round` runs either shape on an :class:`AttackView`; the Byzantine client process,
the torchrun rank and the batched engine all call it, so an attack behaves the same in each.

**What an attacker knows** is declared, not assumed: every attack class carries a
:class:`ThreatModel` (its ``threat_model``, shown by ``dfedrw list``). Knowledge beyond the
models comes from the running system through constructor parameters of reserved names (as a
rule gets ``num_byzantine``), passed only to a constructor that has them:

* ``defence``: the aggregation rule the honest clients run, built from the scenario's
  ``[aggregation]`` as a receiver builds it (per-client overrides are not seen);
* ``attacker_data``: the attacker's own data sample (:class:`AttackerData`);
* ``num_clients``, ``num_byzantine``, ``lr``, ``total_rounds``: as for rules;
* ``round_window``: how many rounds ahead a receiver buffers (``network.round_window``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from dfedrw.peer.registry import Registry, check_int

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


ATTACK_REGISTRY = Registry(
    "attack", "dfedrw.attacks", package="dfedrw.peer.attacks",
    modules=tuple(
        f"dfedrw.peer.attacks.{m}" for m in ("classic", "optimized", "dissensus", "behaviour", "reweighting", "poisoning", "backdoor", "backdoor_boosted")
    ),
    required=("__call__", "plan"),
    calls={"__call__": ("received", "receiver", "generator"), "plan": ("view", "generator")},
)
"""The attacks by name; settings in a scenario's ``[attack.NAME]``."""


@dataclass(frozen=True)
class ThreatModel:
    """What an attack knows and does, as ``dfedrw list`` and its docstring state it.

    ``models``: ``"received"`` (the models its honest neighbours sent it this round) or
    ``"pooled"`` (every honest model any of its colluders received this round); ``data``: what
    data it holds (``""``: none); ``defence``: it knows the rule the honest clients run and its
    settings; ``colludes``: it needs colluding partners (``attack.colluding = true``) and agrees
    a plan with them each round; ``tailored``: it may send each receiver a different message
    (when False a per-receiver attack is called once a round, see :func:`craft_round`)."""

    models: str = "received"
    data: str = ""
    defence: bool = False
    colludes: bool = False
    tailored: bool = False

    def __post_init__(self) -> None:
        if self.models not in ("received", "pooled"):
            raise ValueError(f"ThreatModel: models must be 'received' or 'pooled', got {self.models!r}")

    def describe(self) -> str:
        parts = [
            "sees the models its neighbours sent it this round"
            if self.models == "received"
            else "sees every honest model its colluders received this round",
            f"holds {self.data}" if self.data else "holds no data",
            "knows the defence and its settings" if self.defence else "does not know the defence",
            "colludes (agrees one plan with the other Byzantine clients each round)" if self.colludes else "acts alone unless attack.colluding pools its view",
        ]
        if self.tailored:
            parts.append("tailors each receiver's message")
        return "; ".join(parts)


UNDECLARED = "not declared (a class without a threat_model attribute)"


def threat_model_of(cls: Any) -> ThreatModel | None:
    """The class's declared :class:`ThreatModel`, or None when it declares none."""
    model = getattr(cls, "threat_model", None)
    return model if isinstance(model, ThreatModel) else None


@dataclass(frozen=True)
class AttackView:
    """What one Byzantine client knows when it crafts round ``round``'s messages.

    ``received [len(senders), D]``: the round-``round`` models its honest neighbours ``senders``
    sent it (rows in that order, senders sorted). ``receivers``: the honest neighbours it sends to,
    one message each. ``colluders``: the colluding Byzantine clients, itself included, and
    ``pool [len(pool_senders), D]``: every honest model of this round any of them received, once
    per sender (sorted); empty and None when it acts alone. ``reference``: the mean of the models
    it knew in the previous round (its estimate of where the honest models stood before this
    round's local step); None in its first round or when it knew none then. ``total_rounds``: T.
    """

    round: int
    attacker: int
    receivers: tuple[int, ...]
    senders: tuple[int, ...]
    received: torch.Tensor
    colluders: tuple[int, ...] = ()
    pool_senders: tuple[int, ...] = ()
    pool: torch.Tensor | None = None
    reference: torch.Tensor | None = None
    total_rounds: int = 0

    def __post_init__(self) -> None:
        check_int("AttackView", "round", self.round, minimum=0)
        if not isinstance(self.received, torch.Tensor) or self.received.dim() != 2:
            raise ValueError("AttackView: received must be a 2-D tensor [n, D]")
        if self.received.shape[0] != len(self.senders):
            raise ValueError(f"AttackView: {self.received.shape[0]} received rows for {len(self.senders)} senders")
        if self.pool is not None and (self.pool.dim() != 2 or self.pool.shape[0] != len(self.pool_senders)):
            raise ValueError("AttackView: pool must be [len(pool_senders), D]")
        if self.colluders and self.attacker not in self.colluders:
            raise ValueError(f"AttackView: colluders {self.colluders} must include the attacker {self.attacker}")

    @property
    def dim(self) -> int:
        return int(self.received.shape[1])

    @property
    def colluding(self) -> bool:
        return self.pool is not None

    def known(self) -> tuple[tuple[int, ...], torch.Tensor]:
        """(senders, models) it knows: the pool when colluding, else what it received."""
        if self.pool is not None:
            return self.pool_senders, self.pool
        return self.senders, self.received


@dataclass(frozen=True)
class Crafted:
    """A round's messages, one per receiver (None: silent to it), and a JSON-ready note for the
    record. ``extra``: messages labelled with other rounds, sent besides, receiver -> ((round
    label, message), ...): stale or far-future ones a receiver's intake must drop (flooding)."""

    messages: Mapping[int, torch.Tensor | None]
    note: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[int, tuple[tuple[int, torch.Tensor], ...]] = field(default_factory=dict)


@runtime_checkable
class Attack(Protocol):
    """Per receiver: (received [n, D], receiver id, generator) -> a message [D] or None."""

    def __call__(self, received: torch.Tensor, receiver: int, generator: torch.Generator) -> torch.Tensor | None: ...


@runtime_checkable
class RoundAttack(Protocol):
    """Per round: (view, generator) -> :class:`Crafted`."""

    threat_model: ClassVar[ThreatModel]

    def plan(self, view: AttackView, generator: torch.Generator) -> Crafted: ...


def craft_round(attack: Any, view: AttackView, generator: torch.Generator) -> Crafted:
    """The round's messages of ``attack`` for every receiver of ``view``, whichever its shape.

    A per-round attack's ``plan`` is called once. A per-receiver attack sees every model it knows
    (:meth:`AttackView.known`: the colluders' pool when it colludes); if its declared threat model
    is not ``tailored`` it is called once, for the first receiver, and that message goes to all.
    Otherwise it is called for each receiver in order, or once through its ``for_receivers(received,
    receivers, generator) -> [message, ...]`` if it has one: the messages those calls would give
    (the same draws, the same bits), what they share computed once (the Gaussian attack's centre).
    Each message must be a float tensor of ``D`` values or None."""
    if hasattr(attack, "plan"):
        crafted = attack.plan(view, generator)
        if not isinstance(crafted, Crafted):
            raise ValueError(f"attack {type(attack).__qualname__}.plan returned {type(crafted).__name__}, not Crafted")
        unknown = set(crafted.messages) - set(view.receivers)
        if unknown:
            raise ValueError(f"attack {type(attack).__qualname__}.plan addressed {sorted(unknown)}, not among its receivers {view.receivers}")
    else:
        _, known = view.known()
        declared = threat_model_of(type(attack))
        if declared is not None and not declared.tailored and view.receivers:
            message = attack(known, view.receivers[0], generator)
            crafted = Crafted(dict.fromkeys(view.receivers, message))
        elif hasattr(attack, "for_receivers"):
            messages = attack.for_receivers(known, view.receivers, generator)
            crafted = Crafted(dict(zip(view.receivers, messages, strict=True)))
        else:
            crafted = Crafted({k: attack(known, k, generator) for k in view.receivers})
    # One check per message, however many receive it; each message is held here so that its id
    # cannot be reused by another while the loop runs (a mapping may make them as it is read).
    checked: dict[int, tuple[Any, torch.Tensor | None]] = {}
    messages = {}
    for k in view.receivers:
        message = crafted.messages.get(k)
        if id(message) not in checked:
            checked[id(message)] = (message, _checked(attack, k, message, view.dim))
        messages[k] = checked[id(message)][1]
    extra = {}
    for k, labelled in crafted.extra.items():
        if k not in view.receivers:
            raise ValueError(f"attack {type(attack).__qualname__} addressed extra messages to {k}, not among its receivers {view.receivers}")
        extra[k] = tuple((check_int(type(attack).__qualname__, "round label", r, minimum=0), _checked(attack, k, m, view.dim)) for r, m in labelled)
    return Crafted(messages, dict(crafted.note), extra)


def _checked(attack: Any, k: int, message: Any, dim: int) -> torch.Tensor | None:
    if message is None:
        return None
    if not isinstance(message, torch.Tensor) or not message.is_floating_point() or message.numel() != dim:
        shape = tuple(message.shape) if isinstance(message, torch.Tensor) else type(message).__name__
        raise ValueError(f"attack {type(attack).__qualname__}: message to {k} must be a float tensor of {dim} values, got {shape}")
    if message.dtype == torch.float32 and message.dim() == 1 and not message.requires_grad:
        return message  # already what the checks below make of it
    return message.detach().reshape(-1).to(torch.float32)


class AttackerData:
    """A Byzantine client's own data sample, for attacks that declare they hold data.

    ``samples(n)`` are ``n`` rows of the scenario's training set drawn without replacement by the
    attacker's own seed (so every honest shard is the same whether or not an attack holds data);
    ``evaluate(n)`` scores candidate models on them as a client's auxiliary evaluator does
    (``{"accuracy": [C], "loss": [C]}``). ``input_shape``: one input's shape (``(channels,
    height, width)`` for images; rows come flattened), for attacks that place a trigger. Nothing
    is loaded until an attack asks. ``load(n) -> (x, y)`` and ``evaluator(x, y) -> evaluate``
    come from the running system (the transport-free client code)."""

    def __init__(
        self,
        load: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
        evaluator: Callable[[torch.Tensor, torch.Tensor], Callable[[torch.Tensor], Mapping[str, torch.Tensor]]],
        *,
        num_classes: int,
        input_shape: tuple[int, ...] = (),
        description: str = "",
    ) -> None:
        self._load, self._evaluator = load, evaluator
        self.num_classes = num_classes
        self.input_shape = tuple(input_shape)
        self.description = description
        self._samples: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._evaluators: dict[int, Callable] = {}

    def samples(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        check_int("AttackerData", "n", n, minimum=1)
        if n not in self._samples:
            self._samples[n] = self._load(n)
        return self._samples[n]

    def evaluate(self, n: int) -> Callable[[torch.Tensor], Mapping[str, torch.Tensor]]:
        if n not in self._evaluators:
            self._evaluators[n] = self._evaluator(*self.samples(n))
        return self._evaluators[n]

    def __repr__(self) -> str:  # attacks are frozen dataclasses: keep their repr short
        return f"AttackerData({self.description})"

    # Two attacks of equal settings are equal whatever sample object each was handed.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, AttackerData)

    def __hash__(self) -> int:
        return hash(AttackerData)


def make_attack(name: str, **params: object) -> Any:
    """Build the attack registered as ``name`` with keyword ``params`` (checked, see registry)."""
    return ATTACK_REGISTRY.create(name, **params)
