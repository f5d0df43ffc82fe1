"""The classic attacks: each crafts one message per receiver from the models it received.

A Byzantine client holds no data (paper, section "Experiments", following Zhang et al. 2024 and
Ye et al. 2023); each round it crafts one message per receiver from the round-t models its
neighbours sent it (the per-receiver shape of :mod:`~dfedrw.peer.attacks.base`).

Threat model shared by all attacks here (each class's ``threat_model`` says it again):

* Knowledge: only the models its neighbours sent it this round (``received``); not the
  receiver's own model, its other neighbours, or any benign model it was not sent. ``n == 0``:
  it knows nothing this round.
* No collusion by default: with ``attack.colluding = true`` the running system passes the
  colluders' pooled models as ``received`` (see :func:`~dfedrw.peer.attacks.base.craft_round`).
* Randomness comes only from the explicit ``generator``: one call draws fresh values, so two
  receivers of a randomised attack get different messages; equal seeds replay exactly.
* ``receiver`` is part of the interface so an attack *may* tailor messages per receiver (the
  authors' code does); the attacks here use it for nothing beyond the fresh noise per call.

Pure tensor code (no transport); the Byzantine process wires it to the network.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from types import SimpleNamespace
from typing import ClassVar

import torch

from dfedrw.peer.checked import Checked
from dfedrw.peer.registry import check_choice, check_int, check_real
from dfedrw.peer.aggregation.columns import column_blocks, in_blocks, mean_rows
from dfedrw.peer.attacks.base import ATTACK_REGISTRY, ThreatModel
from dfedrw.peer.attacks.moments import column_std

__all__ = ["ALIE", "IPM", "Gaussian", "SignFlip", "alie_z_max"]

_ALONE = ThreatModel()


def _check_call(
    owner: str, received: torch.Tensor, receiver: int, generator: torch.Generator
) -> torch.Tensor:
    check_int(owner, "receiver", receiver)
    return _check_received(owner, received, generator)


def _check_received(owner: str, received: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if not isinstance(received, torch.Tensor) or received.dim() != 2:
        shape = tuple(received.shape) if isinstance(received, torch.Tensor) else type(received)
        raise ValueError(f"{owner}: received must be a 2-D tensor [n, D], got {shape}")
    if not received.is_floating_point():
        raise ValueError(f"{owner}: received must be floating point, got {received.dtype}")
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"{owner}: generator must be a torch.Generator, got {generator!r}")
    return received


def _mean(received: torch.Tensor) -> torch.Tensor:
    # float64 so averaging many float32 models does not add its own rounding noise (a big
    # model's a block of coordinates at a time: no float64 copy of what was received).
    return mean_rows(received)


class _FromReceived(Checked):
    """An attack whose message is a function of this round's received models alone, the same
    for every receiver: the call is checked, nothing received leaves it silent (None), else
    ``craft(received)`` [n >= 1, D] is the message."""

    def __call__(
        self, received: torch.Tensor, receiver: int, generator: torch.Generator
    ) -> torch.Tensor | None:
        received = _check_call(type(self).__name__, received, receiver, generator)
        if received.shape[0] == 0:
            return None
        return self.craft(received)

    def craft(self, received: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


_GAUSSIAN_CENTERS = ("received_mean", "zero")


@ATTACK_REGISTRY.register("gaussian")
@dataclass(frozen=True)
class Gaussian(Checked):
    """Gaussian attack: a random model around a centre.

    ``message = c + std * z``, ``z ~ N(0, I_D)`` drawn from ``generator``; ``c = mean(received)``
    for ``center="received_mean"`` (the authors' code: benign mean + 30 * N(0, I)), ``c = 0`` for
    ``center="zero"`` (paper text: updates from N(0, 30^2)) and whenever nothing was received.

    Source: paper, section "Byzantine Attack Robustness" (GA), after Fang et al. 2024 and
    Ye et al. 2023; default ``std = 30``.

    THREAT MODEL: the module's (the received models give the centre); fresh noise per receiver.
    """

    threat_model: ClassVar[ThreatModel] = ThreatModel(tailored=True)
    std: float = 30.0
    center: str = "received_mean"

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        s.std = check_real("Gaussian", "std", s.std, positive=True)
        check_choice("Gaussian", "center", s.center, _GAUSSIAN_CENTERS)

    def __call__(
        self, received: torch.Tensor, receiver: int, generator: torch.Generator
    ) -> torch.Tensor:
        return self.for_receivers(received, (receiver,), generator)[0]

    def for_receivers(
        self, received: torch.Tensor, receivers: Sequence[int], generator: torch.Generator
    ) -> list[torch.Tensor]:
        """What one call per receiver in turn gives (the same draws, the same bits), the centre
        computed once: see :func:`~dfedrw.peer.attacks.base.craft_round`."""
        for receiver in receivers:
            check_int("Gaussian", "receiver", receiver)
        if not receivers:
            return []
        count, dim = _check_received("Gaussian", received, generator).shape
        noise = [torch.randn(dim, generator=generator, dtype=torch.float32, device=received.device) for _ in receivers]
        centred = self.center == "received_mean" and count > 0
        if in_blocks(dim):
            # A big model: each message made in place of its noise, a block of coordinates at a
            # time, the centre too (the same steps as below, but no float64 copy of it all).
            for block in column_blocks(dim):
                centre = _mean(received[:, block]) if centred else None
                for z in noise:
                    part = z[block].to(torch.float64).mul_(self.std)
                    z[block] = part if centre is None else part.add_(centre)
            return noise
        # Elementwise from here on: each row is what a call for its receiver computes
        # (std * z, then centre + that: in place, the same products and sums).
        messages = torch.stack(noise).to(torch.float64).mul_(self.std)
        if centred:
            messages.add_(_mean(received))
        return list(messages.to(torch.float32).unbind(0))


@ATTACK_REGISTRY.register("sign_flip")
@dataclass(frozen=True)
class SignFlip(_FromReceived):
    """Sign-flipping attack: the benign models' mean scaled by a negative factor.

    ``message = scale * mean(received)``, default ``scale = -10``; nothing received: silent (None).

    Source: paper, section "Byzantine Attack Robustness" (S-F: local model weights x -10), after
    Ye et al. 2023; the received mean stands in for the attacker's missing "benign model".

    THREAT MODEL: the module's; deterministic, the same message to every receiver.
    """

    threat_model: ClassVar[ThreatModel] = _ALONE
    scale: float = -10.0

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        s.scale = check_real("SignFlip", "scale", s.scale)

    def craft(self, received: torch.Tensor) -> torch.Tensor:
        return (self.scale * _mean(received)).to(torch.float32)


def alie_z_max(num_clients: int, num_byzantine: int) -> float:
    """Largest z for which ALIE's message still looks benign (Baruch et al. 2019, sec. 3).

    ``s = floor(n/2 + 1) - f`` benign clients must be "won over" for a majority;
    ``z_max = Phi^{-1}((n - s) / n)`` with Phi the standard normal CDF.

    Example: n = 12, f = 2 -> s = 5, z_max = Phi^{-1}(7/12) ~= 0.2104.
    """
    n = check_int("ALIE", "num_clients", num_clients, minimum=2)
    f = check_int("ALIE", "num_byzantine", num_byzantine, minimum=1)
    if f >= n:
        raise ValueError(
            f"ALIE: num_byzantine must be < num_clients ({n}), got {num_byzantine!r}"
        )
    supporters = math.floor(n / 2 + 1) - f
    if not 1 <= supporters <= n - 1:
        raise ValueError(
            f"ALIE: s = floor(num_clients/2 + 1) - num_byzantine = {supporters} for "
            f"num_clients={n}, num_byzantine={f}; it must lie in [1, {n - 1}] so that "
            f"(n - s)/n is a probability in (0, 1); use num_byzantine <= {n // 2}"
        )
    return NormalDist().inv_cdf((n - supporters) / n)


@ATTACK_REGISTRY.register("alie")
@dataclass(frozen=True)
class ALIE(_FromReceived):
    """"A Little Is Enough": shift the benign mean by z standard deviations per coordinate.

    ``message_j = mean_j(received) - z * std_j(received)`` (population std, ``correction=0``;
    one received model has std 0 and is the message); nothing received: silent (None).
    ``z = None`` uses ``z_max`` of :func:`alie_z_max` with ``num_clients`` (all nodes, benign +
    Byzantine; paper: 12) and ``num_byzantine`` (paper: 2), read only then. In use: ``z_used``.

    Source: Baruch, Baruch, Goldberg, "A Little Is Enough: Circumventing Defenses for
    Distributed Learning", NeurIPS 2019; paper, section "Byzantine Attack Robustness" (ALIE).

    THREAT MODEL: the module's (mean and std from the models it received, where the original
    knows every benign update); deterministic, the same message to every receiver.
    """

    threat_model: ClassVar[ThreatModel] = _ALONE
    z: float | None = None
    num_clients: int = 12
    num_byzantine: int = 2
    z_used: float = field(init=False)

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        s.num_clients = check_int("ALIE", "num_clients", s.num_clients)
        s.num_byzantine = check_int("ALIE", "num_byzantine", s.num_byzantine)
        if s.z is None:
            alie_z_max(s.num_clients, s.num_byzantine)  # its own checks of the counts
        else:
            s.z = check_real("ALIE", "z", s.z)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "z_used", alie_z_max(self.num_clients, self.num_byzantine) if self.z is None else self.z)

    def craft(self, received: torch.Tensor) -> torch.Tensor:
        models = received.to(torch.float64)
        std = column_std(models, correction=0)
        return (models.mean(dim=0) - self.z_used * std).to(torch.float32)



@ATTACK_REGISTRY.register("ipm")
@dataclass(frozen=True)
class IPM(_FromReceived):
    """Inner product manipulation: send the benign mean reversed and shrunk by epsilon.

    ``message = -epsilon * mean(received)``, default ``epsilon = 0.1``; nothing received: silent
    (None). On gradients, which are small, a small epsilon keeps it close to the benign ones (Krum
    or the median let it through) while its inner product with the true mean is negative; on
    models, as here, it lies about ``(1 + epsilon) ||mean||`` from the benign models, far outside
    their spread: distance-based rules drop it, and it harms those that do not measure distance.

    Source: Xie, Koyejo and Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD by Inner
    Product Manipulation", UAI 2019 (PMLR 115, 2020), where the Byzantine workers send
    ``-epsilon`` times the mean of the correct gradients; here, as for the sign-flip attack and
    as in He, Karimireddy and Jaggi's decentralized experiments (ClippedGossip, 2022), applied
    to the models a client received.

    THREAT MODEL: the module's; deterministic, the same message to every receiver.
    """

    threat_model: ClassVar[ThreatModel] = _ALONE
    epsilon: float = 0.1

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        s.epsilon = check_real("IPM", "epsilon", s.epsilon, positive=True)

    def craft(self, received: torch.Tensor) -> torch.Tensor:
        return (-self.epsilon * _mean(received)).to(torch.float32)
