"""A client's parts, built from its scenario: what every launcher needs besides the client's
round loop (:mod:`peer.client.client`). Identity, rule or attack, initial model, data (each
honest client's shard, auxiliary subset and test sets), what a Byzantine client claims and
records. The batched engine builds its clients from the same functions, so that every engine
draws the same partition, models and attacks."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dfedrw.peer.attacks import ATTACK_REGISTRY, AttackerData
from dfedrw.peer.attacks.backdoor import Backdoor
from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.learning.data import Dataset, aux_indices, local_test_indices, partition
from dfedrw.peer.learning.datacache import StoredSplit, stored_dataset
from dfedrw.peer.learning.datasets import input_shape_of, natural_groups_error
from dfedrw.peer.learning.models import build_model
from dfedrw.peer.wiring.plan import dataset_input_shape, dataset_shape, derive_seed, scenario_topology, told_byzantine
from dfedrw.peer.registry import settings_of
from dfedrw.peer.wiring.build import build_attack, build_client_rule, build_rule_from, scenario_dataset, scenario_model_specs
from dfedrw.peer.learning.training import Augmentation
from dfedrw.peer.learning.model_matrix import VectorEvaluator
from dfedrw.peer.transport.serde import Plausible, TensorSpec, model_specs
from dfedrw.topologies import Topology

if TYPE_CHECKING:
    from dfedrw.peer.graph.schedule import RoundGraphs
    from dfedrw.peer.transport.identity import ClientIdentity


def client_identity(scenario: Scenario, certs: Path | None, client: int) -> ClientIdentity | None:
    """Client ``client``'s credentials from a certificate folder when the scenario uses TLS."""
    if scenario.network.tls == "off" or certs is None:
        return None
    # Here, not at the top: the batched engine and the in-process threads build their clients
    # from this module and need no TLS library (cryptography) where nothing is sent.
    from dfedrw.peer.transport.identity import load_identity

    return load_identity(Path(certs), client)


def client_rule(scenario: Scenario, topology: Topology, client: int, senders: tuple[int, ...] | None = None):
    """Client ``client``'s rule, told the Byzantine clients among ``senders`` (a round's
    in-neighbours under a schedule; default: its neighbours in the graph)."""
    cfg = scenario.aggregation_for(client)
    return build_client_rule(
        scenario, client, told_byzantine(cfg, topology, client, senders), scenario.train.lr, derive_seed(scenario.seed, "rule", client)
    )


def scenario_plausible(scenario: Scenario, graphs: RoundGraphs) -> Plausible:
    """What a received message may hold and declare: no sender has more samples than the scenario's
    whole training set (known to every client, data or not), nor scores more clients than the most
    candidates a client of ``graphs`` can hold (its possible senders and itself)."""
    return Plausible(
        max_abs_value=scenario.network.max_abs_value, max_num_samples=int(scenario_dataset(scenario.data).train_size),
        clients=graphs.num_clients, max_scores=1 + max((len(graphs.possible(k)) for k in range(graphs.num_clients)), default=0),
    )


def scenario_model(scenario: Scenario, seed: int = 0) -> torch.nn.Module:
    """The scenario's model (``train.model`` with its settings, the data set's features,
    classes and input shape, ``train.hidden``), initialised from ``seed``: every engine builds
    its models here."""
    t = scenario.train
    features, classes = dataset_shape(scenario)
    return build_model(
        t.model, features, classes, hidden=t.hidden, input_shape=dataset_input_shape(scenario), seed=seed,
        params=settings_of(t.model_params, t.model),
    )


def client_augmentation(scenario: Scenario, client_id: int) -> Augmentation | None:
    """Client k's minibatch augmentation (``data.augment``), seeded per client; None without one."""
    d = scenario.data
    if d.augment == "none":
        return None
    return Augmentation(d.augment, d.augment_padding, dataset_input_shape(scenario), derive_seed(scenario.seed, "augment", client_id))


def initial_model(scenario: Scenario, client_id: int) -> torch.nn.Module:
    """Client k's model before round 0 (``train.init``: shared seeded, its own seeded, zeros)."""
    t = scenario.train
    seed = derive_seed(scenario.seed, "init") if t.init == "shared" else derive_seed(scenario.seed, "init", client_id)
    model = scenario_model(scenario, seed)
    if t.init == "zeros":
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    return model


@dataclass(frozen=True)
class ClientParts:
    """What a client process is built from, each made once: the scenario's graph and Byzantine
    placement, the client's initial model (None for a Byzantine client, which trains none) and
    the model's wire layout (a Byzantine client's from a model on the meta device)."""

    topology: Topology
    model: torch.nn.Module | None
    specs: tuple[TensorSpec, ...]


def client_parts(scenario: Scenario, client_id: int) -> ClientParts:
    """Client ``client_id``'s :class:`ClientParts`, made once for its transport and the client."""
    topology = scenario_topology(scenario)
    if not 0 <= client_id < topology.num_clients:
        raise ValueError(f"client id {client_id} out of range 0..{topology.num_clients - 1}")
    if client_id in topology.byzantine:
        return ClientParts(topology, None, scenario_model_specs(scenario))
    model = initial_model(scenario, client_id)
    return ClientParts(topology, model, model_specs(model))


def attacker_data(scenario: Scenario, attacker: int) -> AttackerData:
    """Byzantine client ``attacker``'s own data sample, for attacks that declare they hold data:
    ``n`` rows of the scenario's training set drawn without replacement by the attacker's own seed
    (colluders share one, so each computes the group's plan from the same inputs), independent of
    the honest partition (public data from the same distribution: the honest shards are the same
    whether or not an attack holds data). Nothing is read until an attack asks for its sample."""
    d = scenario.data
    classes = dataset_shape(scenario)[1]
    seed = derive_seed(scenario.seed, "attacker data", "colluders" if scenario.attack.colluding else attacker)

    def load(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        train = stored_dataset(scenario_dataset(d)).train
        if n > len(train):
            raise ValueError(f"an attack asked for {n} samples; the {d.name} training set has {len(train)}")
        rows = np.sort(np.random.default_rng(seed).choice(len(train), n, replace=False))
        sample = train.subset(rows)
        return sample.x, sample.y

    def evaluator(x: torch.Tensor, y: torch.Tensor) -> VectorEvaluator:
        return VectorEvaluator(scenario_model(scenario), Dataset(x=x, y=y, num_classes=classes))

    return AttackerData(
        load, evaluator, num_classes=classes, input_shape=input_shape_of(scenario_dataset(d)), description=f"{d.name} rows drawn for client {attacker}"
    )


@dataclass(frozen=True)
class BackdoorProbe:
    """What the honest clients measure a backdoor attack by: its :class:`Backdoor` and the data
    set's input shape. ``rows(test)``: the triggered test rows of another class than the
    target, labelled the target (a model's accuracy on them is its attack success rate)."""

    backdoor: Backdoor
    input_shape: tuple[int, ...]

    def rows(self, test: Dataset) -> Dataset:
        return self.backdoor.probe(test, self.input_shape)


def scenario_backdoor(scenario: Scenario) -> BackdoorProbe | None:
    """The probe of the scenario's attack when it plants a backdoor (its class has a
    ``backdoor``); else None. Without Byzantine clients to run it the probe still measures its
    trigger on the honest models: the base rate a backdoor's success is read against (the
    share of triggered inputs a clean model puts in the target class)."""
    if scenario.attack.name == "none":
        return None
    if not hasattr(ATTACK_REGISTRY.resolve(scenario.attack.name), "backdoor"):
        return None
    attack = build_attack(scenario, scenario.num_clients, scenario.topology.byzantine)
    return BackdoorProbe(attack.backdoor, input_shape_of(scenario_dataset(scenario.data)))


def attacker_knowledge(scenario: Scenario, topology: Topology, attacker: int) -> dict[str, Any]:
    """What the running system gives Byzantine client ``attacker``'s attack beyond the models it
    receives, for a constructor that declares it: ``defence`` (the rule of the scenario's
    ``[aggregation]``, told what its receivers are told: ``assumed_byzantine``, else the number
    of Byzantine clients of the run) and ``attacker_data`` (:func:`attacker_data`)."""
    cfg = scenario.aggregation
    told = cfg.assumed_byzantine if cfg.assumed_byzantine >= 0 else len(topology.byzantine)
    defence = build_rule_from(
        cfg, num_byzantine=told, lr=scenario.train.lr, seed=derive_seed(scenario.seed, "rule", attacker), total_rounds=scenario.rounds
    )
    return {"defence": defence, "attacker_data": attacker_data(scenario, attacker)}


def client_attack(scenario: Scenario, topology: Topology, attacker: int) -> Any:
    """Byzantine client ``attacker``'s attack, with the knowledge its class declares."""
    return build_attack(scenario, topology.num_clients, len(topology.byzantine), **attacker_knowledge(scenario, topology, attacker))


@dataclass
class ClientData:
    """A client's training shard and auxiliary subset (its own copies) and the test sets: the
    global one shared by every client (``test``: mapped from the data cache and converted when
    used, or held), its local one as rows of it (made on first use, so that thousands of
    clients in one process do not each hold a copy)."""

    train: Dataset
    aux: Dataset
    test: StoredSplit | Dataset
    local_test_index: torch.Tensor  # rows of the test set
    train_index: torch.Tensor | None = None  # rows of the training set that make up ``train``

    @property
    def global_test(self) -> Dataset:
        """The whole test set as float32: held, or converted from the mapped rows (a transient
        copy, so that a client process does not keep one)."""
        return self.test if isinstance(self.test, Dataset) else self.test.dataset()

    @functools.cached_property
    def local_test(self) -> Dataset:
        return self.test.subset(self.local_test_index)

    def to(self, device: torch.device) -> ClientData:
        """The same sets with their tensors on ``device`` (the test set held there)."""
        return ClientData(move(self.train, device), move(self.aux, device), move(self.global_test, device), self.local_test_index, self.train_index)


def move(d: Dataset, device: torch.device | str) -> Dataset:
    """``d`` with its tensors on ``device``."""
    return Dataset(x=d.x.to(device), y=d.y.to(device), num_classes=d.num_classes)


def client_data(scenario: Scenario, topology: Topology, client_id: int) -> ClientData:
    """Client k's shard, auxiliary subset and test sets. Every client computes the same seeded
    partition over the honest clients and keeps its own part."""
    return clients_data(scenario, topology, [client_id])[client_id]


def clients_data(scenario: Scenario, topology: Topology, ids: Iterable[int], *, shards: bool = True) -> dict[int, ClientData]:
    """:func:`client_data` of several honest clients, the partition computed once. The data
    set is mapped from the machine's data cache; only each client's rows are converted.
    ``shards=False``: each client's shard is left unconverted (``train`` empty, ``train_index``
    its rows), for a caller that reads the shards as rows of the training set; the auxiliary
    sets are the same values, converted from the same rows."""
    d = scenario.data
    source = scenario_dataset(d)
    stored = stored_dataset(source)
    train, test = stored.train, stored.test
    if d.partition == "natural" and stored.train_groups is None:
        raise ValueError(natural_groups_error(source))
    honest = sorted(topology.honest())
    parts = partition(
        train.y.numpy(), len(honest), d.partition, scenario.seed, labelskew_assign=d.labelskew_assign, groups=stored.train_groups
    )
    size = min(d.local_test_size, len(test))
    out = {}
    for client_id in ids:
        rows = np.asarray(parts[honest.index(client_id)], dtype=np.int64)
        aux_rows = aux_indices(len(rows), d.aux_fraction, derive_seed(scenario.seed, "aux", client_id))
        if shards:
            shard = train.subset(rows)
            aux, labels = shard.subset(aux_rows), shard.y.numpy()
        else:
            shard, aux = train.subset(rows[:0]), train.subset(rows[aux_rows])
            labels = train.y.numpy()[rows]
        local = local_test_indices(labels, test.y.numpy(), test.num_classes, size, derive_seed(scenario.seed, "test", client_id))
        out[client_id] = ClientData(
            train=shard, aux=aux, test=test, local_test_index=torch.as_tensor(np.asarray(local, dtype=np.int64)),
            train_index=torch.as_tensor(rows),
        )
    return out
