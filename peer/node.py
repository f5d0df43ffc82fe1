"""The one module that wires a client together: data, model, aggregation rule or attack,
inbox, transport, launcher link, results.

Round t at an honest client k (paper, Algorithm 1):
  1. local SGD step(s) -> w_k^{t+1/2};
  2. send it to every neighbour; wait until each neighbour's round-t model arrived or the
     round deadline passed (neighbours presumed gone are not waited for);
  3. aggregate own + received with the client's rule (DFedReweighting scores every candidate
     on the auxiliary set A_k) -> w_k^{t+1}.
A Byzantine client holds no data: each round it waits for its honest neighbours' round-t
models, crafts one message per receiver with its attack, and sends them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from peer.aggregation import RoundInputs
from peer.config import Scenario
from peer.identity import ClientIdentity, IdentityError, load_identity
from peer.data import TRAIN_SIZES, Dataset, aux_indices, load_dataset, local_test_indices, partition
from peer.models import build_model, get_vector, set_vector
from peer.plugins import build_attack, build_client_rule
from peer.plan import DATASET_SHAPES, derive_seed, role_of, scenario_topology, told_byzantine  # noqa: F401 - re-exported
from peer.rendezvous import LauncherRendezvous, Rendezvous, StaticRendezvous
from peer.results import RoundLog, write_json_atomic
from peer.telemetry import LauncherLink, NullLink
from peer.training import LocalTrainer, VectorEvaluator, evaluate
from peer.transport.base import Transport
from peer.transport.grpc_transport import CallLimits, GrpcTransport
from peer.transport.inbox import Inbox
from peer.transport.serde import Plausible, WireError, decode, encode, join_chunks, model_specs
from topologies import Topology

log = logging.getLogger(__name__)

# A neighbour presumed gone is still sent a model every this many rounds.
_PROBE_EVERY = 5



def grpc_transport_for(
    scenario: Scenario, host: str, port: int, *, advertise: str | None = None, identity: ClientIdentity | None = None
) -> GrpcTransport:
    """The gRPC transport with the scenario's limits. Each sender gets its own call slots (its
    ``Exchange`` call, which stays open for the whole run, and ``network.calls_per_sender``
    pushes) and a message bucket of ``round_window + 2`` messages a round (one is honest);
    the server's bound on concurrent calls leaves room for every client's slots. With
    ``network.tls = "mutual"`` it needs the client's ``identity``."""
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
    return GrpcTransport(
        host, port, chunk_bytes=net.chunk_bytes, send_timeout=max(30.0, net.round_timeout * 3),
        max_message_bytes=net.max_message_bytes, max_calls=scenario.num_clients * (1 + net.calls_per_sender) + 8,
        advertise=advertise, identity=identity, limits=limits,
    )


def client_identity(scenario: Scenario, certs: Path | None, client: int) -> ClientIdentity | None:
    """Client ``client``'s credentials from a certificate folder when the scenario uses TLS."""
    if scenario.network.tls == "off" or certs is None:
        return None
    return load_identity(Path(certs), client)


def client_rule(scenario: Scenario, topology: Topology, client: int):
    cfg = scenario.aggregation_for(client)
    return build_client_rule(
        scenario, client, told_byzantine(cfg, topology, client), scenario.train.lr, derive_seed(scenario.seed, "rule", client)
    )


@dataclass
class ClientData:
    train: Dataset
    aux: Dataset
    local_test: Dataset
    global_test: Dataset

    def to(self, device: torch.device) -> ClientData:
        """The same sets with their tensors on ``device``."""

        def move(d: Dataset) -> Dataset:
            return Dataset(x=d.x.to(device), y=d.y.to(device), num_classes=d.num_classes)

        return ClientData(move(self.train), move(self.aux), move(self.local_test), move(self.global_test))


def client_data(scenario: Scenario, topology: Topology, client_id: int) -> ClientData:
    """Client k's shard, auxiliary subset and test sets. Every client computes the same seeded
    partition over the honest clients and keeps its own part."""
    d = scenario.data
    train, test = load_dataset(d.name, d.dir or None)
    honest = sorted(topology.honest())
    shards = partition(train.y.numpy(), len(honest), d.partition, scenario.seed, labelskew_assign=d.labelskew_assign)
    shard = train.subset(shards[honest.index(client_id)])
    aux = shard.subset(aux_indices(len(shard.y), d.aux_fraction, derive_seed(scenario.seed, "aux", client_id)))
    size = min(d.local_test_size, len(test.y))
    local = test.subset(
        local_test_indices(shard.y.numpy(), test.y.numpy(), test.num_classes, size, derive_seed(scenario.seed, "test", client_id))
    )
    return ClientData(train=shard, aux=aux, local_test=local, global_test=test)


@dataclass
class Liveness:
    """Consecutive missed deadlines per neighbour; past the limit a neighbour is not waited for."""

    limit: int
    missed: dict[int, int] = field(default_factory=dict)

    def update(self, inbox: Inbox, expected: frozenset[int], arrived: Mapping[int, Any]) -> None:
        for k in expected:
            if k in arrived:
                self.missed[k] = 0
            else:
                self.missed[k] = self.missed.get(k, 0) + 1
                if self.missed[k] == self.limit:
                    log.warning("client %d: neighbour %d missed %d deadlines, no longer waiting for it", inbox.own_id, k, self.limit)
                    inbox.set_gone(k)


class Stopped(RuntimeError):
    """The client was asked to stop before its last round."""


def _loop_times(wall_start: float, cpu_start: float) -> dict[str, float]:
    """Wall and CPU seconds of the round loop. CPU time is the whole process's (all its
    threads; with the in-process transport, all its clients)."""
    return {"loop_seconds": round(time.monotonic() - wall_start, 3), "loop_cpu_seconds": round(time.process_time() - cpu_start, 3)}


class Peer:
    """A client process's state and round loop (honest or Byzantine)."""

    def __init__(
        self,
        scenario: Scenario,
        client_id: int,
        out_dir: Path,
        *,
        transport: Transport,
        link: LauncherLink | NullLink | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.scenario = scenario
        # Where the model, training data and evaluation live; vectors on the wire and in
        # aggregation stay on the CPU.
        self.device = torch.device(device)
        self.id = client_id
        self.out_dir = Path(out_dir)
        self.topology = scenario_topology(scenario)
        if not 0 <= client_id < self.topology.num_clients:
            raise ValueError(f"client id {client_id} out of range 0..{self.topology.num_clients - 1}")
        self.role = "byzantine" if client_id in self.topology.byzantine else "honest"
        self.neighbours = tuple(self.topology.neighbours(client_id))
        self.link = link or NullLink()
        net = scenario.network
        self.transport = transport
        self.inbox = Inbox(client_id, self.neighbours, self.topology.num_clients, net.round_window)
        # What a received message may hold and declare: no sender has more samples than the
        # whole training set of the scenario's dataset (known to every client, data or not).
        self.plausible = Plausible(max_abs_value=net.max_abs_value, max_num_samples=TRAIN_SIZES[scenario.data.name])
        features, classes = DATASET_SHAPES[scenario.data.name]
        t = scenario.train
        init_seed = derive_seed(scenario.seed, "init") if t.init == "shared" else derive_seed(scenario.seed, "init", client_id)
        self.model = build_model(t.model, features, classes, hidden=t.hidden, seed=init_seed)
        if t.init == "zeros":
            with torch.no_grad():
                for p in self.model.parameters():
                    p.zero_().to(self.device)
        self.specs = model_specs(self.model)
        self.max_bytes = min(net.max_message_bytes, sum(s.nbytes for s in self.specs) + 1)
        self.results = RoundLog(self.out_dir, client_id)
        self.stop_requested = threading.Event()
        self._prepared = False
        # Where this client listens, once started (kept in its final record).
        self.address: str | None = None

    # -- receiving ---------------------------------------------------------------------
    def deliver(self, chunks, sender: int | None = None) -> tuple[bool, str, int]:
        """Validate one incoming message and buffer it (called on the transport's thread).
        ``sender`` is the id the transport authenticated (None: it authenticates nobody).

        Returns (accepted, reason, this client's round): the sender drops what it still has
        queued for earlier rounds."""
        return (*self._accept(chunks, sender), self.inbox.round)

    def _accept(self, chunks, sender: int | None) -> tuple[bool, str]:
        # Every message ends in one counter (accepted, stale or a rejection reason) and at most a
        # rate-limited log line: a peer can send bad messages as fast as it likes.
        try:
            if sender is not None:
                # A stranger is turned away before its bytes are even joined.
                refused = self.inbox.screen(sender)
                if refused is not None:
                    return refused
            header, payload, wire = join_chunks(chunks, self.max_bytes)
            if sender is not None and header.sender != sender:
                # The sender is who its certificate says, never who the message says.
                return self.inbox.reject("impersonation", f"client {sender} claimed to be {header.sender}")
            # Screened before decoding so a stranger costs no tensor work.
            refused = self.inbox.screen(header.sender)
            if refused is not None:
                return refused
            msg = decode(header, payload, self.specs, wire, self.plausible)
        except WireError as exc:
            return self.inbox.reject(exc.reason, exc.detail)
        except Exception as exc:  # noqa: BLE001 - a message no check foresaw is still only rejected
            return self.inbox.reject("malformed", type(exc).__name__)
        return self.inbox.offer(msg)

    def _on_reachability(self, peer: int, reachable: bool) -> None:
        if not reachable and peer not in self.inbox.gone():
            log.warning("client %d: neighbour %d unreachable, no longer waiting for it", self.id, peer)
            self.inbox.set_gone(peer)

    # -- lifecycle ---------------------------------------------------------------------
    def prepare(self) -> None:
        """Load data and build the rule or attack. Done before the server starts, so that a
        client that can be reached is ready to run round 0 at once: clients that started
        rounds far apart would otherwise count each other as missing."""
        sc = self.scenario
        if self.role == "honest":
            self.data = client_data(sc, self.topology, self.id)
            if self.device.type != "cpu":
                self.data = self.data.to(self.device)
            t = sc.train
            self.trainer = LocalTrainer(
                self.model, self.data.train, lr=t.lr, batch_size=t.batch_size, local_steps=t.local_steps,
                seed=derive_seed(sc.seed, "batches", self.id),
            )
            self.rule = client_rule(sc, self.topology, self.id)
            self.aux_eval = VectorEvaluator(self.model, self.data.aux)
        else:
            self.attack = build_attack(sc, self.topology.num_clients, len(self.topology.byzantine))

    def start(self) -> str:
        if not self._prepared:
            self.prepare()
            self._prepared = True
        self.address = self.transport.start(self.deliver)
        return self.address

    def connect(self, addresses: Mapping[int, str]) -> None:
        for k in self.neighbours:
            if k not in addresses:
                # A neighbour that never came up (e.g. it died at start) is not waited for.
                log.warning("client %d: no address for neighbour %d; going on without it", self.id, k)
                self.inbox.set_gone(k)
        self.transport.connect({k: addresses[k] for k in self.neighbours if k in addresses}, self._on_reachability)
        late = self.transport.wait_ready(self.scenario.network.connect_timeout)
        for k in late:
            log.warning("client %d: neighbour %d not reachable at start", self.id, k)
            self.inbox.set_gone(k)

    def run(self) -> dict[str, Any]:
        torch.set_num_threads(1)
        start = time.monotonic()
        try:
            if self.role == "honest":
                final = self._run_honest()
            else:
                final = self._run_byzantine()
        finally:
            self.transport.flush(timeout=5.0)
            self.results.close()
        if self.role == "honest":
            cfg = self.scenario.aggregation_for(self.id)
            final["aggregation"] = {"rule": cfg.rule, "told_byzantine": told_byzantine(cfg, self.topology, self.id)}
        final.update(
            id=self.id,
            role=self.role,
            pid=os.getpid(),
            address=self.address,
            device=str(self.device),
            completed=True,
            wall_seconds=round(time.monotonic() - start, 3),
            rejected_messages=self.inbox.total_rejected(),
            rejected_by_reason=dict(self.inbox.rejected),
            stale_messages=self.inbox.stale,
            unsent_messages={"dropped": self.transport.dropped, "stale": self.transport.skipped_stale},
            refused_calls_by_reason=dict(getattr(self.transport, "refused", {})),
            tls="mutual" if getattr(self.transport, "identity", None) is not None else "off",
        )
        write_json_atomic(self.out_dir / "peers" / f"{self.id}.json", final)
        self.link.send({"type": "done", "id": self.id, "accuracy": final.get("accuracy"), "global_accuracy": final.get("global_accuracy")})
        return final

    def close(self) -> None:
        self.transport.close()
        self.link.close()

    # -- round loops -------------------------------------------------------------------
    def _check_stop(self) -> None:
        if self.stop_requested.is_set():
            raise Stopped(f"client {self.id} stopped")

    def _send_all(self, round_: int, vector: torch.Tensor, num_samples: int, to, train_loss: float) -> None:
        chunks = encode(self.id, round_, vector, self.specs, num_samples=num_samples, train_loss=train_loss, chunk_bytes=self.scenario.network.chunk_bytes)
        gone = self.inbox.gone()
        for k in to:
            # A neighbour presumed gone only gets a probe now and then: a send to a silently
            # dead host hangs until its timeout, but two clients that lost each other must keep
            # probing or neither would ever hear from the other again.
            if k in gone and round_ % _PROBE_EVERY:
                continue
            self.transport.send(k, chunks)

    def _run_honest(self) -> dict[str, Any]:
        sc = self.scenario
        data, trainer, rule, aux_eval = self.data, self.trainer, self.rule, self.aux_eval
        neighbours = frozenset(self.neighbours)
        liveness = Liveness(sc.network.max_missed_rounds)
        num_samples = len(data.train.y)
        last: dict[str, float] = {}
        loop_start, cpu_start = time.monotonic(), time.process_time()
        log_every = max(1, sc.rounds // 20)
        for r in range(sc.rounds):
            self._check_stop()
            self.inbox.advance(r)
            sent0, recv0 = self.transport.bytes_sent, self.inbox.bytes_received
            reference = get_vector(self.model)
            loss = trainer.step()
            own = get_vector(self.model)
            self._send_all(r, own, num_samples, self.neighbours, loss)
            expected = neighbours - self.inbox.gone()
            got = self.inbox.wait(r, expected, sc.network.round_timeout)
            liveness.update(self.inbox, expected, got)
            ids = (self.id, *sorted(got))
            vectors = torch.stack([own, *(got[k].vector for k in ids[1:])])
            sizes = (num_samples, *(got[k].num_samples for k in ids[1:]))
            losses = (loss, *(got[k].train_loss for k in ids[1:]))
            agg = rule(
                RoundInputs(
                    own_id=self.id, round=r, ids=ids, vectors=vectors, num_samples=sizes, evaluate=aux_eval,
                    total_rounds=sc.rounds, declared_losses=losses, reference=reference,
                )
            )
            set_vector(self.model, agg.model)
            record: dict[str, Any] = {
                "round": r,
                "train_loss": loss,
                "weights": {str(k): round(float(w), 6) for k, w in agg.weights.items()},
                "bytes_sent": self.transport.bytes_sent - sent0,
                "bytes_received": self.inbox.bytes_received - recv0,
                "missing": sorted(expected - got.keys()),
            }
            if agg.scores is not None:
                record["scores"] = {str(k): _finite_or_none(v) for k, v in agg.scores.items()}
            every = sc.eval.every
            if r == sc.rounds - 1 or (every and (r + 1) % every == 0):
                last = {
                    "accuracy": 100.0 * evaluate(self.model, data.local_test)["accuracy"],
                    "global_accuracy": 100.0 * evaluate(self.model, data.global_test)["accuracy"],
                }
                record.update(last)
            self.results.write(record)
            self.link.send({"type": "round", "id": self.id, "round": r, "train_loss": loss, **last})
            if (r + 1) % log_every == 0 or r == sc.rounds - 1:
                # A progress line for whoever reads this client's log (docker-compose logs, torchrun).
                acc = f", local accuracy {last['accuracy']:.2f}%" if last else ""
                log.info("client %d round %d/%d: train loss %.4f%s", self.id, r + 1, sc.rounds, loss, acc)
        return {**last, **_loop_times(loop_start, cpu_start), "num_samples": num_samples, "aux_samples": len(data.aux.y), "local_test_samples": len(data.local_test.y)}

    def _run_byzantine(self) -> dict[str, Any]:
        sc = self.scenario
        attack = self.attack
        gen = torch.Generator().manual_seed(derive_seed(sc.seed, "attack", self.id))
        targets = tuple(k for k in self.neighbours if k not in self.topology.byzantine)
        liveness = Liveness(sc.network.max_missed_rounds)
        loop_start, cpu_start = time.monotonic(), time.process_time()
        for r in range(sc.rounds):
            self._check_stop()
            self.inbox.advance(r)
            sent0, recv0 = self.transport.bytes_sent, self.inbox.bytes_received
            expected = frozenset(targets) - self.inbox.gone()
            got = self.inbox.wait(r, expected, sc.network.round_timeout)
            liveness.update(self.inbox, expected, got)
            honest_msgs = [got[k] for k in sorted(got) if k not in self.topology.byzantine]
            received = (
                torch.stack([m.vector for m in honest_msgs]) if honest_msgs else torch.empty(0, sum(s.numel for s in self.specs))
            )
            # Claim the data size and loss the honest neighbours claim, so data-size or
            # loss-based weighting cannot single the attacker out by its metadata.
            claimed_size = round(float(np.mean([m.num_samples for m in honest_msgs]))) if honest_msgs else 0
            losses = [m.train_loss for m in honest_msgs if np.isfinite(m.train_loss)]
            claimed_loss = float(np.mean(losses)) if losses else float("nan")
            silent = 0
            for k in targets:
                crafted = attack(received, k, gen)
                if crafted is None:
                    silent += 1
                    continue
                self.transport.send(
                    k,
                    encode(self.id, r, crafted, self.specs, num_samples=claimed_size, train_loss=claimed_loss, chunk_bytes=sc.network.chunk_bytes),
                )
            self.results.write({
                "round": r,
                "train_loss": None,
                "weights": {},
                "bytes_sent": self.transport.bytes_sent - sent0,
                "bytes_received": self.inbox.bytes_received - recv0,
                "received_from": sorted(got),
                "silent_to": silent,
            })
            self.link.send({"type": "round", "id": self.id, "round": r})
        return {"attack": sc.attack.name, **_loop_times(loop_start, cpu_start)}


def _finite_or_none(x: float) -> float | None:
    x = float(x)
    return round(x, 6) if np.isfinite(x) else None


def run_peer(
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
) -> dict[str, Any]:
    """Run one client process to completion (through :func:`run_client`): start, find the
    neighbours, run every round, write results.

    Addresses come either from the launcher (``rendezvous``, a zmq endpoint, where the client
    registers with ``link_token``, the secret the launcher gave it) or are given.
    ``certs`` is the run's certificate folder (``dfedrw certs``), needed with TLS.
    """
    if (rendezvous is None) == (addresses is None):
        raise ValueError("give exactly one of rendezvous (launcher endpoint) or addresses")
    net = scenario.network
    if net.transport == "torch":
        raise ValueError(
            "network.transport = 'torch' runs only under torchrun: torchrun --nproc-per-node N -m launch.torchrun --scenario FILE"
        )
    transport = grpc_transport_for(
        scenario, net.host, listen_port, advertise=advertise, identity=client_identity(scenario, certs, client_id)
    )
    link = LauncherLink(rendezvous, link_token) if rendezvous else NullLink()
    meeting = (
        LauncherRendezvous(link, role_of(scenario_topology(scenario), client_id)) if rendezvous else StaticRendezvous(addresses)
    )
    return run_client(scenario, client_id, out_dir, transport=transport, rendezvous=meeting, link=link)


def run_client(
    scenario: Scenario,
    client_id: int,
    out_dir: Path,
    *,
    transport: Transport,
    rendezvous: Rendezvous,
    link: LauncherLink | NullLink | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """A client's start-up sequence, the same under every launcher: build the client, then
    :func:`start_and_run`. Returns its final record."""
    client = Peer(scenario, client_id, out_dir, transport=transport, link=link, device=device)
    return start_and_run(client, rendezvous)


def start_and_run(client: Peer, rendezvous: Rendezvous) -> dict[str, Any]:
    """Start a built client's server, exchange addresses through ``rendezvous``, connect to the
    neighbours, run every round; the client is closed whatever happens."""
    try:
        address = client.start()
        addresses = rendezvous.exchange(client.id, address, client.neighbours, client.scenario.network.connect_timeout)
        client.connect(addresses)
        return client.run()
    finally:
        client.close()
