"""From a scenario to objects: the rule or attack, data set, transport kind and model's wire layout.

The layer above both configuration and the registries: :mod:`peer.config.scenario` describes a
scenario and checks it against the registries, which know nothing of configuration; the functions
here read a validated :class:`~dfedrw.peer.config.scenario.Scenario` and build with the registries'
plain functions (:func:`~dfedrw.peer.kinds.registries.build_named_rule`,
:func:`~dfedrw.peer.learning.datasets.dataset_of`, ``TRANSPORT_REGISTRY.build``).
:mod:`peer.wiring.assembly` puts a client together from them; :mod:`peer.wiring.plan` holds what a
scenario says of its clients without building them (graph, roles, seeds)."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from dfedrw.peer.learning.datasets import dataset_of
from dfedrw.peer.kinds.registries import ATTACK_REGISTRY, build_named_rule
from dfedrw.peer.registry import settings_of
from dfedrw.peer.graph.schedule import receive_window
from dfedrw.peer.transport.compression import COMPRESSION_REGISTRY, Compression, Decoder, Encoder
from dfedrw.peer.transport.kinds import PLACEMENTS, TRANSPORT_REGISTRY, Grpc, TransportKind
from dfedrw.peer.transport.links import EmulatedLinks, LinkProfile, LinkSchedule, distance_profiles, links_for

if TYPE_CHECKING:
    from collections.abc import Sequence

    from dfedrw.topologies import Topology
    from dfedrw.peer.config.scenario import AggregationConfig, AttackConfig, DataConfig, Scenario
    from dfedrw.peer.transport.identity import ClientIdentity
    from dfedrw.peer.transport.grpc.transport import GrpcTransport
    from dfedrw.peer.transport.serde import TensorSpec

__all__ = [
    "build_attack",
    "build_attack_from",
    "build_client_rule",
    "build_rule_from",
    "client_codec",
    "client_links",
    "grpc_transport_for",
    "link_profiles",
    "message_bytes",
    "scenario_colluders",
    "scenario_compression",
    "scenario_dataset",
    "scenario_model_specs",
    "scenario_transport",
    "with_links",
]


# -- rules and attacks ---------------------------------------------------------------------------


def build_rule_from(cfg: AggregationConfig, *, num_byzantine: int, lr: float, seed: int, total_rounds: int = 0) -> Any:
    """The rule ``cfg`` names, with its settings; the TPM and CRS are built only for a rule
    that takes them (DFedReweighting). Raises ``ValueError`` from the classes."""
    supplied = {"num_byzantine": num_byzantine, "lr": lr, "seed": seed, "total_rounds": total_rounds}
    settings = {kind: cfg.params(kind) for kind in ("rule", "tpm", "crs")}
    return build_named_rule(cfg.rule, cfg.tpm, cfg.crs, settings, supplied)


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
    """The scenario's attack as a client runs it (``knowledge``: see :func:`build_attack_from`)."""
    return build_attack_from(
        scenario.attack, num_clients=num_clients, num_byzantine=num_byzantine,
        lr=scenario.train.lr, total_rounds=scenario.rounds,
        round_window=receive_window(scenario.network.round_window, scenario.topology.schedule), **knowledge,
    )


# -- data ----------------------------------------------------------------------------------------


def scenario_dataset(data: DataConfig) -> Any:
    """The data set a scenario's ``[data]`` section names, built (nothing loaded)."""
    return dataset_of(data.name, data.params, data.dir)


# -- transports ----------------------------------------------------------------------------------


def scenario_transport(scenario: Scenario, *, topology: Topology | None = None, specs: Sequence[TensorSpec] | None = None) -> TransportKind:
    """The transport kind ``network.transport`` names, with its ``[network.NAME]`` settings;
    ``topology``, ``specs``: as built already, or None (then :func:`message_bytes` builds them)."""
    net = scenario.network
    supplied = {"message_bytes": functools.partial(message_bytes, scenario, topology=topology, specs=specs)}
    kind = TRANSPORT_REGISTRY.build(net.transport, settings_of(net.transport_params, net.transport), supplied)
    if getattr(kind, "placement", None) not in PLACEMENTS:
        raise ValueError(f"transport {net.transport!r}: placement must be one of {', '.join(PLACEMENTS)}, got {getattr(kind, 'placement', None)!r}")
    return kind


def grpc_transport_for(
    scenario: Scenario,
    host: str,
    port: int,
    *,
    advertise: str | None = None,
    identity: ClientIdentity | None = None,
    client: int | None = None,
) -> GrpcTransport:
    """The gRPC transport with the scenario's limits (:meth:`~dfedrw.peer.transport.kinds.Grpc.process_transport`),
    whatever ``network.transport`` names. ``client`` (default: the identity's) is whose transport it is."""
    kind = Grpc(message_bytes=functools.partial(message_bytes, scenario))
    return kind.process_transport(scenario, client, host=host, port=port, advertise=advertise, identity=identity)


def message_bytes(
    scenario: Scenario, client: int | None, *, topology: Topology | None = None, specs: Sequence[TensorSpec] | None = None,
) -> int:
    """The largest message ``client`` receives: one model, or for a colluding Byzantine client
    a pool of up to one model per client (``topology``, ``specs``: as built already, or None)."""
    from dfedrw.peer.transport.pools import pool_bytes

    specs = scenario_model_specs(scenario) if specs is None else specs
    if client is not None and client in scenario_colluders(scenario, topology):
        return pool_bytes(specs, scenario.num_clients)
    return sum(s.nbytes for s in specs)


def scenario_colluders(scenario: Scenario, topology: Topology | None = None) -> tuple[int, ...]:
    """The colluding Byzantine clients of the scenario (every one with ``attack.colluding``,
    else ()), of ``topology`` (default: drawn here)."""
    from dfedrw.peer.wiring.plan import colluding_group
    from dfedrw.peer.wiring.plan import scenario_topology

    topology = scenario_topology(scenario) if topology is None else topology
    return colluding_group(topology.byzantine, scenario.attack.colluding)


def scenario_model_specs(scenario: Scenario) -> tuple[TensorSpec, ...]:
    """The scenario model's wire layout, from a meta-device model (no memory, no initialisation)."""
    import torch

    from dfedrw.peer.learning.models import make_model
    from dfedrw.peer.wiring.plan import dataset_input_shape, dataset_shape
    from dfedrw.peer.transport.serde import model_specs

    features, classes = dataset_shape(scenario)
    t = scenario.train
    with torch.device("meta"):
        model = make_model(
            t.model, features, classes, hidden=t.hidden, input_shape=dataset_input_shape(scenario), params=settings_of(t.model_params, t.model)
        )
    return model_specs(model)


# -- emulated links ------------------------------------------------------------------------------


def link_profiles(scenario: Scenario) -> tuple[LinkProfile, dict[tuple[int, int], LinkProfile]]:
    """The scenario's ``[links]``: the profile of every link, and the links with their own (the
    distance generator's, then each ``[links.pairs]`` entry over it)."""
    links = scenario.links
    default = LinkProfile(latency=links.latency, jitter=links.jitter, bandwidth=links.bandwidth, loss=links.loss)
    own: dict[tuple[int, int], LinkProfile] = {}
    if links.generator == "distance":
        own = distance_profiles(scenario.num_clients, scenario.seed, latency_per_unit=links.latency_per_unit, base=default)
    for pair, values in links.pairs:
        own[pair] = dataclasses.replace(own.get(pair, default), **dict(values))
    return default, own


def client_links(scenario: Scenario, client: int) -> dict[int, LinkSchedule] | None:
    """Client ``client``'s outgoing links to every other client, timed and seeded; None when
    ``[links]`` emulates nothing (the transport is then used as it is)."""
    if not scenario.links.emulates:
        return None
    default, own = link_profiles(scenario)
    others = [k for k in range(scenario.num_clients) if k != client]
    return links_for(default, own, scenario.seed, client, others)


def with_links(scenario: Scenario, client: int, transport: Any) -> Any:
    """``transport`` sending over the scenario's emulated links (:class:`EmulatedLinks`), or
    itself when ``[links]`` emulates nothing."""
    schedules = client_links(scenario, client)
    return transport if schedules is None else EmulatedLinks(transport, schedules, newest_only=scenario.network.asynchronous)


# -- compression ---------------------------------------------------------------------------------


def scenario_compression(scenario: Scenario) -> Compression:
    """The compression ``network.compression`` names, with its settings."""
    net = scenario.network
    return COMPRESSION_REGISTRY.build(net.compression, settings_of(net.compression_params, net.compression))


def client_codec(scenario: Scenario, client: int, specs: Sequence[TensorSpec]) -> tuple[Encoder, Decoder | None]:
    """Client ``client``'s two sides of the scenario's compression: the encoder of the models it
    sends, and the decoder its intake rebuilds received ones with (None without compression)."""
    compression = scenario_compression(scenario)
    encoder = Encoder(compression, client, specs, seed=scenario.seed, chunk_bytes=scenario.network.chunk_bytes)
    return encoder, (Decoder(compression, specs) if compression.encoding else None)
