"""Extensions of one's own, in the user's own module: an attack and a CRS, and a data set, a
model, a topology and a transport.

Nothing here is registered in dfedrw; a scenario names them by import path
(``mylab_plugins:ScaledMean``) with this folder on ``PYTHONPATH`` (see README.md). Their
constructor parameters (a builder function's, for the model and the topology) are their
settings, checked when they are built; a parameter named like a value the running system
supplies (``num_clients``, ``num_byzantine``, ``in_features``, ``seed``, ...) is filled in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ScaledMean:
    """Scaled-mean attack: send the received models' mean times ``factor``, plus a little noise.

    ``message = factor * mean(received) + noise * N(0, I)``; silent (None) if nothing was
    received. With ``factor`` near 1 and small noise the message looks like a benign model.
    """

    factor: float = 1.5
    noise: float = 0.01

    def __post_init__(self) -> None:
        if not isinstance(self.factor, (int, float)) or isinstance(self.factor, bool) or self.factor != self.factor:
            raise ValueError(f"ScaledMean: factor must be a real number, got {self.factor!r}")
        if not isinstance(self.noise, (int, float)) or isinstance(self.noise, bool) or not 0 <= self.noise < float("inf"):
            raise ValueError(f"ScaledMean: noise must be a finite number >= 0, got {self.noise!r}")

    def __call__(self, received: torch.Tensor, receiver: int, generator: torch.Generator) -> torch.Tensor | None:
        if received.shape[0] == 0:
            return None
        mean = received.to(torch.float64).mean(dim=0)
        drawn = torch.randn(mean.shape[0], generator=generator, dtype=torch.float64)
        return (self.factor * mean + self.noise * drawn).to(torch.float32)


@dataclass(frozen=True)
class LowestK:
    """Top-k by loss: the ``k`` candidates with the lowest score share the weight equally.

    ``v_i = 1/k`` for the ``k`` smallest finite scores (ties to the lower position), else 0;
    with fewer than ``k`` finite scores, all finite ones share it. Pair with the ``loss`` TPM.
    """

    k: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"LowestK: k must be an integer >= 1, got {self.k!r}")

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        values = torch.as_tensor(scores, dtype=torch.float64)
        weights = torch.zeros_like(values)
        finite = torch.isfinite(values)
        if not bool(finite.any()):
            return weights
        ranked = torch.where(finite, values, torch.full_like(values, float("inf")))
        order = ranked.argsort(stable=True)[: min(self.k, int(finite.sum()))]
        weights[order] = 1.0 / len(order)
        return weights


# ------------------------------------------------------------------------------------------------
# A data set, a model, a topology and a transport of one's own: the other extension kinds.


@dataclass(frozen=True)
class Blobs:
    """Gaussian blobs: ``classes`` clusters in ``features`` dimensions, drawn from ``seed``.

    Class ``c``'s centre is a point drawn once from N(0, I); its samples are the centre plus
    ``spread * N(0, I)``: ``train_rows`` for training, a quarter as many for testing. A data set declares its layout without loading anything (a Byzantine
    client holds no data): ``num_features``, ``num_classes``, ``train_size``; ``load()`` gives
    ``((train_x, train_y), (test_x, test_y))`` as tensors.
    """

    features: int = 16
    classes: int = 4
    train_rows: int = 2000
    spread: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name, minimum in (("features", 1), ("classes", 2), ("train_rows", 4), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"Blobs: {name} must be an integer >= {minimum}, got {value!r}")
        if isinstance(self.spread, bool) or not isinstance(self.spread, (int, float)) or not 0 < self.spread < float("inf"):
            raise ValueError(f"Blobs: spread must be a finite number > 0, got {self.spread!r}")

    @property
    def num_features(self) -> int:
        return self.features

    @property
    def num_classes(self) -> int:
        return self.classes

    @property
    def train_size(self) -> int:
        return self.train_rows

    def load(self) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(self.seed)
        centres = torch.randn(self.classes, self.features, generator=generator)

        def draw(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
            labels = torch.arange(rows) % self.classes
            points = centres[labels] + self.spread * torch.randn(rows, self.features, generator=generator)
            return points, labels

        return draw(self.train_rows), draw(self.train_rows // 4)


class TwoLayer(torch.nn.Module):
    """Two hidden tanh layers of ``width`` units: a model given as an ``nn.Module`` class.

    ``in_features`` and ``num_classes`` come from the data set; ``width`` is a setting.
    """

    def __init__(self, in_features: int, num_classes: int, width: int = 32) -> None:
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"TwoLayer: width must be an integer >= 1, got {width!r}")
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(in_features, width), torch.nn.Tanh(), torch.nn.Linear(width, width), torch.nn.Tanh(),
            torch.nn.Linear(width, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def small_world(num_clients: int, seed: int, neighbours: int = 4, rewire: float = 0.2):
    """Watts-Strogatz small world: a ring where each client links its ``neighbours`` nearest,
    each link rewired with probability ``rewire``, drawn from the scenario's seed until connected.

    A topology is a builder that returns a networkx graph on ``0 .. num_clients - 1``; the
    running system gives ``num_clients`` and ``seed`` (and ``byzantine``, ``rho``, ``file`` to a
    builder that asks for them).
    """
    import networkx as nx

    if isinstance(neighbours, bool) or not isinstance(neighbours, int) or not 2 <= neighbours < num_clients:
        raise ValueError(f"small_world: neighbours must be an integer in [2, {num_clients - 1}], got {neighbours!r}")
    if isinstance(rewire, bool) or not isinstance(rewire, (int, float)) or not 0 <= rewire <= 1:
        raise ValueError(f"small_world: rewire must lie in [0, 1], got {rewire!r}")
    return nx.connected_watts_strogatz_graph(num_clients, neighbours, rewire, tries=1000, seed=seed)


# A topology whose honest subgraph must stay connected too (checked after the Byzantine
# clients are placed).
small_world.honest_connected = True


@dataclass(frozen=True)
class LossyInproc:
    """The in-process transport, losing each message with probability ``drop`` (seeded per
    sender): a transport kind of one's own, to see how a rule copes with lost messages.

    A transport kind says how its clients are placed (``placement``: here every client a
    thread of one process) and makes each client's transport.
    """

    drop: float = 0.1
    seed: int = 0

    placement = "threads"
    uses_tls = False

    def __post_init__(self) -> None:
        if isinstance(self.drop, bool) or not isinstance(self.drop, (int, float)) or not 0 <= self.drop < 1:
            raise ValueError(f"LossyInproc: drop must lie in [0, 1), got {self.drop!r}")

    def network(self, scenario):
        from dfedrw.peer.transport.inproc import InprocHub

        return InprocHub()

    def thread_transport(self, network, client: int):
        import random

        from dfedrw.peer.transport.inproc import InprocTransport

        transport = InprocTransport(network, f"lossy:{client}")
        send, draw = transport.send, random.Random(self.seed * 1_000_003 + client).random

        def lossy_send(to: int, chunks) -> None:
            if draw() < self.drop:
                transport.dropped += 1
                return
            send(to, chunks)

        transport.send = lossy_send
        return transport
