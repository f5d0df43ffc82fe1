"""A client process from start to end, the same under every launcher: its parts built once
(:func:`grpc_client`), then started, met with its neighbours, run and closed
(:func:`start_and_run`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dfedrw.peer.client.client import Client
from dfedrw.peer.client.rendezvous import LauncherRendezvous, Rendezvous, StaticRendezvous
from dfedrw.peer.client.telemetry import LauncherLink, NullLink
from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.learning.device import engine_device
from dfedrw.peer.wiring.assembly import client_identity, client_parts
from dfedrw.peer.wiring.build import scenario_transport
from dfedrw.peer.wiring.plan import role_of


def run_grpc_client(scenario: Scenario, client_id: int, out_dir: Path, **where: Any) -> dict[str, Any]:
    """Run one client process to completion: :func:`grpc_client` (``where``: its arguments),
    then :func:`start_and_run`: start, find the neighbours, run every round, write results."""
    return start_and_run(*grpc_client(scenario, client_id, out_dir, **where))


def grpc_client(
    scenario: Scenario,
    client_id: int,
    out_dir: Path,
    *,
    rendezvous: str | None = None,
    addresses: Mapping[int, str] | None = None,
    listen_port: int = 0,
    advertise: str | None = None,
    certs: Path | None = None,
    link_token: str | None = None,
    tensorboard: Path | None = None,
) -> tuple[Client, Rendezvous]:
    """One client process's client and the way it meets its neighbours, built, not started; its
    graph and model are built once (:func:`~dfedrw.peer.wiring.assembly.client_parts`), for its
    transport and for the client. Addresses come from the launcher (``rendezvous``, a zmq
    endpoint, where the client registers with ``link_token``, the secret the launcher gave it)
    or are given (``addresses``). ``certs``: the run's certificate folder (``dfedrw certs``),
    needed with TLS; ``tensorboard``: a folder for TensorBoard event files (``--tensorboard``)."""
    if (rendezvous is None) == (addresses is None):
        raise ValueError("give exactly one of rendezvous (launcher endpoint) or addresses")
    net = scenario.network
    parts = client_parts(scenario, client_id)
    kind = scenario_transport(scenario, topology=parts.topology, specs=parts.specs)
    if kind.placement != "processes":
        if kind.placement == "torchrun":
            raise ValueError(
                f"network.transport = {net.transport!r} runs only under torchrun: "
                "torchrun --nproc-per-node N -m dfedrw.launch.torchrun --scenario FILE"
            )
        raise ValueError(f"network.transport = {net.transport!r} runs its clients as {kind.placement}, not as processes")
    transport = kind.process_transport(
        scenario, client_id, host=net.host, port=listen_port, advertise=advertise, identity=client_identity(scenario, certs, client_id)
    )
    link = LauncherLink(rendezvous, link_token) if rendezvous else NullLink()
    meeting = (
        LauncherRendezvous(link, role_of(parts.topology, client_id)) if rendezvous else StaticRendezvous(addresses)
    )
    device = engine_device(scenario.engine.device)
    return Client(scenario, client_id, out_dir, transport=transport, link=link, device=device, tensorboard=tensorboard, parts=parts), meeting


def start_and_run(client: Client, rendezvous: Rendezvous) -> dict[str, Any]:
    """Start a built client's server, exchange addresses through ``rendezvous``, connect (to the
    neighbours; a colluder to the colluders too), run every round; close it whatever happens."""
    try:
        address = client.start()
        addresses = rendezvous.exchange(client.id, address, client.contacts, client.scenario.network.connect_timeout)
        client.connect(addresses)
        return client.run()
    finally:
        client.close()
