"""The transports a scenario can name (``network.transport``): one registry of kinds.

A transport kind is a class registered in :data:`TRANSPORT_REGISTRY` (or ``"module:Class"``, or a
plugin of the ``dfedrw.transports`` entry-point group); its constructor's keyword parameters are
its settings (``[network.NAME]``). It says how its clients are placed (``placement``) and makes
each client's :class:`~dfedrw.peer.transport.base.Transport`:

* ``"processes"``: one OS process per client (``dfedrw run``, ``dfedrw peer``, compose, and
  torchrun ranks): :meth:`TransportKind.process_transport` makes a client's transport from the
  address it listens on and its identity. gRPC is one.
* ``"threads"``: every client a thread of one process (``dfedrw run``): :meth:`network` makes
  the shared in-memory network once, :meth:`thread_transport` each client's end of it.
* ``"torchrun"``: ranks of a torchrun job only, which make their transport themselves
  (:mod:`dfedrw.launch.torchrun`).

``uses_tls``: whether ``network.tls`` applies (mutual TLS with the run's certificates, the
sender of a message being the client its certificate names); a transport without it must
authenticate its senders some other way, or every claim of a sender id is taken on trust.

A hook's ``scenario`` is the run's validated :class:`~dfedrw.peer.config.scenario.Scenario`, only
read here; :func:`dfedrw.peer.wiring.build.scenario_transport` builds the kinds from it, giving
the gRPC kind ``message_bytes``, the largest message a client receives."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from dfedrw.peer.registry import Registry

if TYPE_CHECKING:
    from dfedrw.peer.transport.identity import ClientIdentity
    from dfedrw.peer.transport.base import Transport

log = logging.getLogger(__name__)

__all__ = ["PLACEMENTS", "TRANSPORT_REGISTRY", "Grpc", "Inproc", "TorchDistributed", "TransportKind"]


PLACEMENTS = ("processes", "threads", "torchrun")

TRANSPORT_REGISTRY = Registry("transport", "dfedrw.transports", required=("placement",), supplied=("message_bytes",))
"""The transports by name; settings in a scenario's ``[network.NAME]``; ``message_bytes``:
the largest message client K receives (``message_bytes(K)``), given by the run."""


class TransportKind:
    """Every kind's hooks (see the module): a subclass sets ``placement`` and overrides its own."""

    placement: ClassVar[str] = "processes"
    uses_tls: ClassVar[bool] = False

    def process_transport(
        self, scenario: Any, client: int, *, host: str, port: int, advertise: str | None = None, identity: ClientIdentity | None = None
    ) -> Transport:
        """Client ``client``'s transport, listening on ``host:port`` (0: any free port) and
        reachable at ``advertise`` when given (``"processes"`` kinds)."""
        raise NotImplementedError(f"{type(self).__name__} runs clients as {self.placement}, not as processes")

    def rank_transport(self, scenario: Any, rank: int, *, edges: list[tuple[int, int]], device: Any, linger: float) -> Transport:
        """Rank ``rank``'s transport in a torchrun job (``"torchrun"`` kinds): ``edges``, who
        exchanges messages (every rank gets the same list); ``linger``: how long a rank that
        finished keeps answering the others."""
        raise NotImplementedError(f"{type(self).__name__} runs clients as {self.placement}, not as torchrun ranks")

    def network(self, scenario: Any) -> Any:
        """The shared network of a run whose clients are threads of one process."""
        raise NotImplementedError(f"{type(self).__name__} runs clients as {self.placement}, not as threads")

    def thread_transport(self, network: Any, client: int) -> Transport:
        """Client ``client``'s end of ``network`` (``"threads"`` kinds)."""
        raise NotImplementedError(f"{type(self).__name__} runs clients as {self.placement}, not as threads")


@TRANSPORT_REGISTRY.register("grpc")
class Grpc(TransportKind):
    """gRPC over TCP, one process per client, mutual TLS: the real network.

    The run's own certificates (``network.tls``), the server's admission limits, chunked streams."""

    placement: ClassVar[str] = "processes"
    uses_tls: ClassVar[bool] = True

    def __init__(self, message_bytes: Callable[[int | None], int] | None = None) -> None:
        self.message_bytes = message_bytes

    def process_transport(
        self, scenario: Any, client: int | None, *, host: str, port: int, advertise: str | None = None, identity: ClientIdentity | None = None
    ) -> Transport:
        """The gRPC transport with the scenario's limits: each sender gets its own call slots (its
        ``Exchange`` call, open all run, and ``network.calls_per_sender`` pushes) and a bucket of
        ``round_window + 2`` messages a round (one is honest); the server's bound on concurrent
        calls leaves room for every client's slots. ``network.tls = "mutual"`` needs the client's
        ``identity``. ``client`` (None: the identity's) is whose transport it is: a receiver
        buffers at most ``message_bytes(client)`` per open call."""
        from dfedrw.peer.transport.identity import IdentityError
        from dfedrw.peer.transport.grpc.limits import CallLimits
        from dfedrw.peer.transport.grpc.transport import GrpcTransport

        if self.message_bytes is None:
            raise ValueError("transport 'grpc' is built from a scenario by dfedrw.peer.wiring.build.scenario_transport (it gives message_bytes)")
        net = scenario.network
        if net.tls == "mutual" and identity is None:
            raise IdentityError("network.tls = 'mutual' needs this client's certificate: give --certs DIR (made by `dfedrw certs`)")
        if net.tls == "off":
            log.warning(
                "network.tls = 'off': no sender is authenticated, so any process that reaches this client can send models "
                "in a neighbour's name; use it for debugging only"
            )
            identity = None
        per_round = net.round_window + 2
        limits = CallLimits(
            calls_per_sender=net.calls_per_sender,
            idle_call_timeout=net.idle_call_timeout,
            burst=4 * per_round,
            per_round=float(per_round),
            per_second=per_round / net.round_timeout,
            block_seconds=min(5 * net.round_timeout, 300.0),
            # Without TLS a sender is an IP address: every client of the run may share one host.
            shared_host=1 if identity is not None else scenario.num_clients,
        )
        # What an honest message holds (a colluder's pools hold more), not the scenario's ceiling.
        client = identity.client if client is None and identity is not None else client
        model_bytes = self.message_bytes(client)
        return GrpcTransport(
            host, port, chunk_bytes=net.chunk_bytes, send_timeout=max(30.0, net.round_timeout * 3),
            max_message_bytes=min(net.max_message_bytes, model_bytes), max_calls=scenario.num_clients * (1 + net.calls_per_sender) + 8,
            advertise=advertise, identity=identity, limits=limits,
            # A graph that changes from round to round: connect to a peer when first sending to it.
            on_demand=bool(scenario.topology.schedule), idle_channel_timeout=net.idle_channel_timeout,
            newest_only=net.asynchronous,
        )


@TRANSPORT_REGISTRY.register("inproc")
class Inproc(TransportKind):
    """Every client a thread of one process, messages handed over in memory.

    Encoded and checked as on gRPC: fast tests and the parity reference."""

    placement: ClassVar[str] = "threads"

    def network(self, scenario: Any) -> Any:
        from dfedrw.peer.transport.inproc import InprocHub

        return InprocHub()

    def thread_transport(self, network: Any, client: int) -> Transport:
        from dfedrw.peer.transport.inproc import InprocTransport

        return InprocTransport(network, f"inproc:{client}")


@TRANSPORT_REGISTRY.register("torch")
class TorchDistributed(TransportKind):
    """``torch.distributed`` point-to-point between torchrun ranks; only under torchrun.

    gloo, or NCCL on GPUs; senders are the ranks the process groups name."""

    placement: ClassVar[str] = "torchrun"

    def rank_transport(self, scenario: Any, rank: int, *, edges: list[tuple[int, int]], device: Any, linger: float) -> Transport:
        from dfedrw.peer.transport.torchdist import TorchDistTransport

        net = scenario.network
        return TorchDistTransport(
            rank,
            edges,
            device=device,
            # A neighbour may be silent (e.g. an attacker with nothing to answer) for the
            # whole run, in the worst case every round at its deadline.
            timeout=net.connect_timeout + scenario.rounds * 2 * net.round_timeout,
            max_message_bytes=net.max_message_bytes,
            max_messages=scenario.rounds,
            linger=linger,
        )
