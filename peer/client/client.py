"""A client: its state and round loop, honest or Byzantine, from start to final record. Its
parts (transport, rule or attack, model, data) come from :mod:`peer.wiring.assembly`, which every
launcher and the batched engine use too; checkpoints and the way back after a restart, its own
or a neighbour's, from :mod:`peer.client.rejoin`; a client process's start-up and end from
:mod:`peer.client.process`.

Round t at an honest client k (paper, Algorithm 1):
  1. local SGD step(s) -> w_k^{t+1/2};
  2. send it to every neighbour; wait until each neighbour's round-t model arrived or the
     round deadline passed (neighbours presumed gone are not waited for);
  3. aggregate own + received with the client's rule (DFedReweighting scores every candidate
     on the auxiliary set A_k) -> w_k^{t+1}.
Under a schedule (``topology.schedule``, :mod:`peer.graph.schedule`) the graph is the round's: k
sends to its out-neighbours of round t, waits for its in-neighbours of round t, and a robust
rule is told the Byzantine clients among them. A Byzantine client's rounds (its attack, the
colluders' pools) are :func:`peer.client.byzantine.run_byzantine`'s."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dfedrw.peer.wiring.assembly import (
    ClientParts, client_attack, client_augmentation, client_data, client_parts, scenario_backdoor, scenario_plausible,
)
from dfedrw.peer.client.byzantine import run_byzantine
from dfedrw.peer.client.checkpoint import Checkpoint, CheckpointError, checkpoint_path, load_checkpoint, memory_of, scenario_fingerprint
from dfedrw.peer.client.collusion import Collusion
from dfedrw.peer.transport.intake import ModelIntake
from dfedrw.peer.transport.serde import shareable
from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.learning.models import get_vector, set_vector
from dfedrw.peer.round.told import ToldRules
from dfedrw.peer.wiring.plan import colluding_group, derive_seed, scenario_graphs, told_byzantine
from dfedrw.peer.aggregation.rules import Aggregate, finite_rows
from dfedrw.peer.graph.schedule import receive_window
from dfedrw.peer.client.presence import PROBE_EVERY, Presence
from dfedrw.peer.client.rejoin import Resume
from dfedrw.peer.results.records import RoundLog, write_json_atomic
from dfedrw.peer.client.rounds import Pace, RoundGather, end_of_round
from dfedrw.peer.round.records import final_keys, honest_record, loop_times, with_round_graph
from dfedrw.peer.client.telemetry import LauncherLink, NullLink
from dfedrw.peer.client import link_messages
from dfedrw.peer.transport.links import EmulatedLinks
from dfedrw.peer.wiring.build import client_codec, with_links
from dfedrw.peer.learning.training import LocalTrainer
from dfedrw.peer.learning.model_matrix import VectorEvaluator
from dfedrw.peer.learning.device import device_memory
from dfedrw.peer.transport.base import Transport
from dfedrw.peer.client.asynchronous import GossipGather, client_inbox, run_async_byzantine

log = logging.getLogger(__name__)


class Stopped(RuntimeError):
    """The client was asked to stop before its last round."""


class Client:
    """A client process's state and round loop (honest or Byzantine); ``tensorboard``: a folder for
    its round records as TensorBoard scalars too (:mod:`dfedrw.peer.results.tensorboard`). Whom it
    waits for and sends to: :attr:`presence`; checkpoints and restarts: :attr:`resume`."""

    def __init__(
        self,
        scenario: Scenario,
        client_id: int,
        out_dir: Path,
        *,
        transport: Transport,
        link: LauncherLink | NullLink | None = None,
        device: torch.device | str = "cpu",
        tensorboard: Path | None = None,
        parts: ClientParts | None = None,
    ) -> None:
        # Graph, initial model and layout: given (built once for its transport too), or built here.
        parts = client_parts(scenario, client_id) if parts is None else parts
        self.scenario = scenario
        # The model's, data's and evaluation's device; wire and aggregation vectors stay on the CPU.
        self.device = torch.device(device)
        self.id = client_id
        self.out_dir = Path(out_dir)
        self.topology = parts.topology
        self.role = "byzantine" if client_id in self.topology.byzantine else "honest"
        self.graphs = scenario_graphs(scenario, self.topology)
        # All it may exchange models with (a fixed graph: its neighbours), each round's among them.
        self.neighbours = self.graphs.possible(client_id)
        self.link = link or NullLink()
        net = scenario.network
        # Its transport's backend where it picks one (torch: gloo or NCCL), and why, for its record.
        self.transport_backend = {
            key: value for key, value in (("transport_backend", getattr(transport, "backend", None)), ("transport_backend_note", getattr(transport, "backend_note", None))) if value
        }
        self.transport = transport = with_links(scenario, client_id, transport)
        self.pace = Pace(scenario.speed_of(client_id))
        self.plausible = scenario_plausible(scenario, self.graphs)
        self.shared_scores: dict[int, float] | None = None
        self.memory: dict[int, float] | None = None
        # A Byzantine client needs only the model's layout (a model on the meta device: no values).
        self.model, self.specs = parts.model, parts.specs
        self.inbox = client_inbox(
            scenario, client_id, self.neighbours, self.topology.num_clients, receive_window(net.round_window, scenario.topology.schedule),
            senders_at=self.graphs.senders_at(client_id) if self.graphs.dynamic else None,
            model_size=sum(s.numel for s in self.specs), rows_at=self._candidate_rows,
        )
        self.max_bytes = min(net.max_message_bytes, sum(s.nbytes for s in self.specs) + 1)
        # A colluder exchanges pools with the other colluders too (graph neighbours or not).
        colluders = colluding_group(self.topology.byzantine, scenario.attack.colluding) if self.role == "byzantine" else ()
        self.collusion: Collusion | None = None
        if colluders:
            self.collusion = Collusion(
                client_id, colluders, specs=self.specs, num_clients=self.topology.num_clients, transport=transport,
                counters=self.inbox, window=net.round_window, max_missed=net.max_missed_rounds, plausible=self.plausible,
                chunk_bytes=net.chunk_bytes, probe_every=PROBE_EVERY,
            )
            self.max_bytes = min(net.max_message_bytes, max(self.max_bytes, self.collusion.max_bytes))
        self.contacts = (*self.neighbours, *(k for k in colluders if k != client_id and k not in self.neighbours))
        self.presence = Presence(
            client_id, self.neighbours, inbox=self.inbox, transport=transport, graphs=self.graphs, round_timeout=net.round_timeout,
            round_window=net.round_window, collusion=self.collusion, stall_timeout=net.stall_timeout, newest_only=net.asynchronous,
            tolerate=told_byzantine(scenario.aggregation_for(client_id), self.topology, client_id) if self.role == "honest" else 0,
        )
        self.encoder, decoder = client_codec(scenario, client_id, self.specs)  # its models on the wire, and its neighbours'
        self.intake = ModelIntake(self.inbox, self.specs, self.plausible, self.max_bytes, collusion=self.collusion, after=self.presence.after_offer, decoder=decoder)
        self.checkpoint_file = checkpoint_path(self.out_dir, client_id)
        self.fingerprint = scenario_fingerprint(scenario)
        # A checkpoint of this client in its results folder: it was killed, and resumes.
        resumed: Checkpoint | None = None
        if scenario.checkpoint.every and self.checkpoint_file.exists():
            size = None if self.role == "byzantine" else sum(s.numel for s in self.specs)
            resumed = load_checkpoint(self.checkpoint_file, client=client_id, scenario=self.fingerprint, vector_size=size)
            if resumed.vector is not None:
                set_vector(self.model, torch.from_numpy(resumed.vector.copy()))
            log.warning("client %d: resuming from its checkpoint of round %d (%s)", client_id, resumed.round, self.checkpoint_file)
        self.results = RoundLog(
            self.out_dir, client_id, keep_through=resumed.round if resumed else None,
            tensorboard=tensorboard, byzantine=self.topology.byzantine,
        )
        self.resume = Resume(
            client_id, self.role, scenario, graphs=self.graphs, byzantine=self.topology.byzantine, transport=transport, inbox=self.inbox,
            specs=self.specs, presence=self.presence, results=self.results, checkpoint_file=self.checkpoint_file,
            fingerprint=self.fingerprint, resumed=resumed,
        )
        self.stop_requested = threading.Event()
        self._prepared = False
        # Where this client listens, once started (kept in its final record).
        self.address: str | None = None

    # -- receiving ---------------------------------------------------------------------
    def deliver(self, chunks, sender: int | None = None) -> tuple[bool, str, int]:
        """Validate one incoming message and buffer it (on the transport's thread); ``sender``:
        the id the transport authenticated (None: it authenticates nobody). Returns (accepted,
        reason, this client's round): the sender drops what it still has queued for earlier
        rounds. Transports that hand messages over as they arrive use :attr:`intake`'s ``begin``."""
        return self.intake(chunks, sender)

    def _candidate_rows(self, r: int) -> tuple[int, ...]:
        """The senders whose round-``r`` models are rows of the round's matrix, in the order the
        round uses them: by id (a Byzantine client: its honest senders, the models it crafts from)."""
        senders = self.graphs.senders_to(self.id, r)
        return tuple(sorted(k for k in senders if self.role == "honest" or k not in self.topology.byzantine))

    # -- lifecycle ---------------------------------------------------------------------
    def prepare(self) -> None:
        """Load data and build the rule or attack. Done before the server starts, so that a
        client that can be reached is ready to run round 0 at once: clients that started
        rounds far apart would otherwise count each other as missing."""
        sc = self.scenario
        if self.role == "honest":
            self.data = client_data(sc, self.topology, self.id)
            if self.device.type != "cpu":
                # The model computes where its data is; wire and rule get CPU copies (get_vector).
                self.data = self.data.to(self.device)
                self.model.to(self.device)
            t = sc.train
            self.trainer = LocalTrainer(
                self.model, self.data.train, lr=t.lr, batch_size=t.batch_size, local_steps=t.local_steps,
                seed=derive_seed(sc.seed, "batches", self.id), local_epochs=t.local_epochs, momentum=t.momentum,
                weight_decay=t.weight_decay, augment=client_augmentation(sc, self.id),
            )
            if self.resumed is not None:
                try:
                    self.trainer.load_state(self.resumed.generators, self.resumed.arrays, int(self.resumed.counters.get("trainer_pos", 0)))
                except (KeyError, ValueError, RuntimeError) as exc:
                    raise CheckpointError(f"checkpoint {self.checkpoint_file}: trainer state unusable ({exc})") from None
                self.memory = memory_of(self.resumed, self.checkpoint_file)
            # Its rule; under a schedule, the one told the Byzantine senders of a round.
            self.rules = ToldRules(sc, self.topology, (self.id,), dynamic=self.graphs.dynamic)
            self.aux_eval = VectorEvaluator(self.model, self.data.aux)
            self.backdoor = scenario_backdoor(sc)
        else:
            self.attack = client_attack(sc, self.topology, self.id)

    def start(self) -> str:
        if not self._prepared:
            self.prepare()
            self._prepared = True
        self.address = self.transport.start(self.intake)
        return self.address

    def connect(self, addresses: Mapping[int, str]) -> None:
        """Connect to the neighbours and, for a colluder, the other colluders (``contacts``)."""
        for k in self.contacts:
            if k not in addresses:
                # A neighbour that never came up (e.g. it died at start) is not waited for.
                log.warning("client %d: no address for %s %d; going on without it", self.id, self._kind(k), k)
                self._set_gone(k)
        self.transport.connect({k: addresses[k] for k in self.contacts if k in addresses}, self.presence.on_reachability)
        opener = getattr(self.transport, "open", None)
        if self.graphs.dynamic and opener is not None:
            # Connections on demand: those of the first round now (a peer that is not up is
            # found out before round 0, as with a fixed graph), the others when first sent to.
            r = min(self.resumed.round + 1, self.scenario.rounds - 1) if self.resumed is not None else 0
            first = {*self.graphs.senders_to(self.id, r), *self.graphs.receivers_of(self.id, r)}
            opener(sorted(k for k in self.contacts if k in addresses and (k in first or k not in self.neighbours)))
        late = self.transport.wait_ready(self.scenario.network.connect_timeout)
        for k in late:
            log.warning("client %d: %s %d not reachable at start", self.id, self._kind(k), k)
            self._set_gone(k)

    def _kind(self, peer: int) -> str:
        return "neighbour" if peer in self.neighbours else "colluder"

    def _set_gone(self, peer: int) -> None:
        if peer in self.neighbours:
            self.inbox.set_gone(peer)
        if self.collusion is not None and peer in self.collusion.peers:
            self.collusion.set_gone(peer)

    def run(self) -> dict[str, Any]:
        torch.set_num_threads(1)
        start = time.monotonic()
        try:
            if self.role == "honest":
                final = self._run_honest()
            else:  # under asynchronous gossip no round barrier (peer/client/asynchronous.py)
                final = run_async_byzantine(self) if self.scenario.network.asynchronous else run_byzantine(self)
        finally:
            self.transport.flush(timeout=5.0)
            self.results.close()
        if self.role == "honest":
            # Under a schedule: the most it was told in a round (each round's in its record).
            final["aggregation"] = self.rules.summary(self.id)
        final.update(
            final_keys(
                self.id, self.role, pid=os.getpid(), address=self.address, device=str(self.device), wall_seconds=round(time.monotonic() - start, 3),
                rejected=self.resume.rejected(), stale_messages=self.resume.stale_messages(), unsent_messages=self._unsent(),
                refused_calls_by_reason=getattr(self.transport, "refused", {}),
                tls="mutual" if getattr(self.transport, "identity", None) is not None else "off",
                restarts=self.resume.restarts, rounds_lost=self.resume.rounds_lost(), resumed_from=self.resume.resumed_from,
            ),
            **self.transport_backend,
            **device_memory(self.device),
        )
        presence = self.presence
        if presence.held_rounds:
            # Rounds begun late because a neighbour was more than round_window rounds behind.
            final["held_back"] = {"rounds": presence.held_rounds, "seconds": round(presence.held_seconds, 3)}
        if presence.shut_out_count:
            # Senders this client's server shut out for sending past their rate bound, and how often.
            final["shut_out"] = {str(k): n for k, n in sorted(presence.shut_out_count.items())}
        if self.pace.extra:
            final["speed"] = {"speed": self.scenario.speed_of(self.id), "waited_seconds": round(self.pace.waited, 3)}
        if isinstance(self.transport, EmulatedLinks):
            # What its emulated links did with what it sent ([links]).
            final["links"] = {"lost": self.transport.lost, "delayed": self.transport.delayed, "skipped_busy": self.transport.skipped_busy}
        final.update(self.encoder.final(self.scenario.network.compression) if self.role == "honest" else {})  # per link
        if self.graphs.dynamic:
            final["schedule"] = self.scenario.topology.schedule
            if hasattr(self.transport, "channels_opened"):
                final["channels"] = {"opened": self.transport.channels_opened, "closed_idle": self.transport.channels_closed}
        write_json_atomic(self.out_dir / "peers" / f"{self.id}.json", final)
        # Done: a client started again with this id starts a new run (its round log moved aside).
        self.checkpoint_file.unlink(missing_ok=True)
        self.link.send(link_messages.done(self.id, final.get("accuracy"), final.get("global_accuracy")))
        return final

    def _unsent(self) -> dict[str, int]:
        """What this client's transport did not send: queued messages pushed out by newer ones
        (``dropped``), those for rounds their receiver had passed (``stale``), and under
        asynchronous gossip models not made for a neighbour that still had one waiting
        (``busy``; emulated links count theirs in ``links``)."""
        unsent = {"dropped": self.transport.dropped, "stale": self.transport.skipped_stale}
        if self.scenario.network.asynchronous:
            unsent["busy"] = getattr(getattr(self.transport, "inner", self.transport), "skipped_busy", 0)
        return unsent

    @property
    def resumed(self) -> Checkpoint | None:
        """The checkpoint this client resumed from (its resume holds it), or None."""
        return self.resume.resumed

    def close(self) -> None:
        self.transport.close()
        self.link.close()

    # -- round loops -------------------------------------------------------------------
    def _check_stop(self) -> None:
        if self.stop_requested.is_set():
            raise Stopped(f"client {self.id} stopped")

    def begin_round(self, r: int) -> tuple[int, int, int]:
        """The start of round ``r`` (a client rejoining may skip ahead): (the round it is in,
        bytes sent and received so far, from which the round's own are counted: an honest
        client's as it made them for its links, not as a transport or link let them go)."""
        self._check_stop()
        r = self.resume.catch_up(r)  # (a no-op under asynchronous gossip: it rejoins by resume_steps)
        if self.role == "honest" and not self.scenario.network.asynchronous:
            self.presence.hold_back(r, self._check_stop)
        self.inbox.advance(r)
        self.presence.begin_round(r)
        self.resume.note_round(r)
        return r, self.encoder.total if self.role == "honest" else self.transport.bytes_sent, self.inbox.bytes_received

    def _send_all(self, round_: int, vector: torch.Tensor, num_samples: int, to, train_loss: float) -> None:
        outgoing = self.encoder.round(round_, vector, num_samples=num_samples, train_loss=train_loss, scores=self.shared_scores)
        self.presence.send_all(round_, outgoing, to)

    def _keep(self, agg: Aggregate) -> None:
        """What an aggregation leaves for the next round: the scores its next model carries
        (network.share_scores) and its rule's memory."""
        if self.scenario.network.share_scores:
            self.shared_scores = shareable(agg.scores)
        self.memory = agg.memory

    def _flatten(self) -> torch.Tensor | None:
        """On the CPU: make the model's parameters views of one flat vector (their values as
        they are) and return it; elsewhere None."""
        if self.device.type != "cpu":
            return None
        flat = get_vector(self.model)
        set_vector(self.model, flat)
        return flat

    def _run_honest(self) -> dict[str, Any]:
        """Every round (under asynchronous gossip, every local step) of an honest client: one
        loop for both protocols, which differ only in where a resumed client goes on, how a
        model is sent and what the round aggregates (``gather``: :class:`RoundGather` or
        :class:`~dfedrw.peer.client.asynchronous.GossipGather`)."""
        sc = self.scenario
        data, trainer, inbox = self.data, self.trainer, self.inbox
        gather = GossipGather(self) if sc.network.asynchronous else RoundGather(self)
        num_samples = len(data.train.y)
        last: dict[str, float] = {}
        loop_start, cpu_start, started_at = time.monotonic(), time.process_time(), time.time()
        r = first = gather.first(num_samples)
        first_after_resume = self.resumed is not None
        # On the CPU the parameters are views of one flat vector (set_vector makes them so):
        # after the local step that vector is the model to send, no copy of it needed.
        flat = self._flatten()
        while r < sc.rounds:
            r, sent0, recv0 = self.begin_round(r)
            reference = get_vector(self.model)
            with self.pace.work():
                loss = trainer.step(sc.train.lr_at(r, sc.rounds))
            own = flat if flat is not None else get_vector(self.model)
            gather.send(r, own, num_samples, loss)
            notes: dict[str, Any] = {"resumed_from": self.resumed.round} if first_after_resume else {}
            first_after_resume = False
            held, own, reference, told_of = gather.candidates(r, own, reference, num_samples, loss, notes)
            # The round's matrix itself when every model was decoded into its row, else a stack.
            vectors = inbox.stacked(r, list(held.models[1:]), own)
            rule, told = self.rules.at(self.id, told_of)
            # The intake checked every received model's values: only the own model's need a look.
            finite = (bool(finite_rows(own[None])[0]), *(True for _ in held.senders))
            with self.pace.work():
                agg = rule(held.inputs(r, vectors, evaluate=self.aux_eval, total_rounds=sc.rounds, reference=reference, finite=finite, gossip=gather.gossip))
            model = agg.model
            self._keep(agg)
            if model.untyped_storage().data_ptr() == vectors.untyped_storage().data_ptr():
                # A candidate kept as it is: the parameters must not pin the round's whole matrix.
                model = model.clone()
            set_vector(self.model, model)
            # Done with the round's models: let them go before evaluating and checkpointing.
            inbox.close(r)
            flat = model if flat is not None else None
            record = honest_record(
                r, loss, agg.weights, held.missing, scores=agg.scores, notes=notes,
                bytes_sent=self.encoder.total - sent0, bytes_received=inbox.bytes_received - recv0,
                seconds=round(time.monotonic() - loop_start, 3),
            )
            with_round_graph(record, self.graphs, self.id, r, told)
            del vectors, held, agg, reference, own
            last = end_of_round(self, r, loss, record, model, last, step=gather.unit)
            del model
            r += 1
        return {
            **last, **loop_times(loop_start, cpu_start, started_at), "num_samples": num_samples, "aux_samples": len(data.aux.y),
            "local_test_samples": len(data.local_test.y), **gather.final(sc.rounds - first, time.monotonic() - loop_start),
        }
