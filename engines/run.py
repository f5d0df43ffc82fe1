"""One run of the batched engine (:mod:`dfedrw.engines.together`): its honest clients' models as
the rows of one tensor, their data, rules and records, its Byzantine clients' attacks and the
intake checks their messages pass, the candidates each honest client aggregates, and its
results folder. :func:`~dfedrw.engines.together.run_together` drives one or several of them."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfedrw.peer.results.collect import collect_summary
from dfedrw.peer.config.scenario import Scenario, dump_scenario
from dfedrw.peer.aggregation import Aggregate
from dfedrw.peer.learning.models import get_vector
from dfedrw.peer.wiring.assembly import (
    client_attack, scenario_backdoor, client_augmentation, clients_data, initial_model, move, scenario_model, scenario_plausible,
)
from dfedrw.peer.learning.datacache import test_set, training_pixels
from dfedrw.peer.wiring.build import scenario_dataset
from dfedrw.engines.network import SimulatedNetwork
from dfedrw.engines.network import pooled as pooled_links
from dfedrw.peer.round.byzantine import ByzantineStep, scenario_lie
from dfedrw.peer.round.candidates import ClientCandidates, Offer, assemble
from dfedrw.peer.round.told import ToldRules
from dfedrw.peer.transport.inbox import window_outcome
from dfedrw.peer.wiring.plan import derive_seed, scenario_graphs, scenario_topology
from dfedrw.peer.results.records import RoundLog, write_json_atomic
from dfedrw.peer.round.records import byzantine_record, evaluation_due, final_keys, honest_record, measures, with_round_graph
from dfedrw.peer.learning.training import BatchOrder, local_step_count
from dfedrw.peer.learning.device import device_memory, engine_device
from dfedrw.peer.learning.model_matrix import FlatModel, VectorEvaluator


@dataclasses.dataclass
class Candidates:
    """One run's round as its honest clients aggregate it (see :meth:`BatchedRun.candidates`)."""

    # [rows, D] on the CPU once concatenated: the honest models, then the accepted Byzantine
    # messages. Kept in pieces: a batch of runs concatenates every run's pieces in one copy.
    pieces: list[torch.Tensor]
    # Each honest client's candidates, their models rows of the pool (its own first).
    clients: list[ClientCandidates]
    evaluate: list[Any]
    reference: torch.Tensor
    # Per pooled row, whether it is finite, as the intake found (None: not known).
    finite: list[bool] | None = None
    # Asynchronous gossip: the rules are told each candidate's staleness.
    gossip: bool = False

    @property
    def count(self) -> int:
        """The number of pooled rows."""
        return sum(len(piece) for piece in self.pieces)

    @property
    def vectors(self) -> torch.Tensor:
        """The pooled rows as one ``[rows, D]`` tensor."""
        return torch.cat(self.pieces) if len(self.pieces) > 1 else self.pieces[0]


class BatchedRun:
    """One scenario, all clients at once. ``run()`` writes the results folder and returns the summary."""

    def __init__(self, scenario: Scenario, out_dir: Path, *, tensorboard: Path | None = None) -> None:
        self.scenario = sc = scenario
        if sc.paced and not (sc.clock.step_seconds or sc.clock.aggregate_seconds):
            raise ValueError(
                "train.speed, train.speed_spread or a [peers.K] speed slows a client's compute, which in the batched engine "
                "takes the simulated seconds of [clock]: set clock.step_seconds (its local steps a round at speed 1)"
            )
        if sc.network.asynchronous and not sc.clock.step_seconds:
            # Each client's steps on the simulated clock: without compute time nothing is asynchronous.
            raise ValueError("network.protocol = \"async\" in the batched engine times each client's steps on the simulated clock: set clock.step_seconds (its local steps at speed 1)")
        self.out_dir = Path(out_dir)
        self.tensorboard = tensorboard  # a folder for the honest clients' TensorBoard event files
        self.device = engine_device(sc.engine.device)
        self.topology = topo = scenario_topology(sc)
        self.honest = sorted(topo.honest())
        self.byzantine = sorted(topo.byzantine)
        self.row = {k: i for i, k in enumerate(self.honest)}
        # On the CPU: each client's aux set (a copy) and its shard's rows of the training set. The
        # test set (read once per process) goes to the device once: local test sets are rows of it.
        self.data = clients_data(sc, topo, self.honest, shards=False)
        self.test = move(test_set(scenario_dataset(sc.data)), self.device)
        # Under a backdoor attack: the triggered test rows each honest client's success rate is read on.
        backdoor = scenario_backdoor(sc)
        self.probe = backdoor.rows(self.test) if backdoor is not None else None
        t = sc.train
        template = scenario_model(sc)
        self.model = FlatModel(template, self.device)
        # The layout its models run in, once picked for its batch (engines/layout.py).
        self.layout: dict[str, Any] = {}
        self.models = torch.stack([get_vector(initial_model(sc, k)) for k in self.honest]).to(self.device)
        # The training set once (shared by every run of a batch: read once per process), each
        # client's shard as rows of it: client c's minibatch rows are shard_rows[offsets[c] + i]
        # for the positions i its BatchOrder draws. Kept as stored (uint8 pixels for a cached
        # set): rows are converted as gathered (train_features), the same values as all at once.
        self.pixels = training_pixels(scenario_dataset(sc.data))
        self.train_x, self.train_y = self.pixels.x.to(self.device), self.pixels.y.to(self.device)
        self.shard_rows = torch.cat([self.data[k].train_index for k in self.honest]).to(self.device)
        sizes = [len(self.data[k].train_index) for k in self.honest]
        self.num_samples = dict(zip(self.honest, sizes, strict=True))
        self.offsets = torch.tensor(np.concatenate([[0], np.cumsum(sizes)[:-1]]), dtype=torch.long, device=self.device)
        self.batches = [BatchOrder(n, t.batch_size, derive_seed(sc.seed, "batches", k)) for k, n in zip(self.honest, sizes, strict=True)]
        # Each client's local steps a round (they differ under train.local_epochs when the shards
        # do) and its momentum buffer (a row each; None until the first step, or without momentum).
        self.steps = [local_step_count(t.local_steps, t.local_epochs, n, t.batch_size) for n in sizes]
        self.momentum: torch.Tensor | None = None
        self.wave: list[int] | None = None  # under asynchronous gossip: the rows that train now
        self.augment = [client_augmentation(sc, k) for k in self.honest]
        # Under a schedule each client's rule is the one told the Byzantine senders of the round.
        self.graphs = scenario_graphs(sc, topo)
        self.told_rules = ToldRules(sc, topo, self.honest, dynamic=self.graphs.dynamic)
        self.rules = dict(self.told_rules.fixed)  # each client's rule this round (under a schedule: begin_round's)
        self.told: dict[int, int] = {}
        self.memory: dict[int, dict[int, float] | None] = {}
        # Scoring on the auxiliary sets: many clients at once, or each client's own evaluator.
        self.aux = {k: VectorEvaluator(template, move(self.data[k].aux, self.device)) for k in self.honest}
        self.plausible = scenario_plausible(sc, self.graphs)
        # Each Byzantine client's attack, generator (seeded by its id), reference, reported scores.
        self.attack_steps = {
            b: ByzantineStep(
                sc, b, client_attack(sc, topo, b), torch.Generator().manual_seed(derive_seed(sc.seed, "attack", b)),
                lie=scenario_lie(sc, self.graphs, topo.byzantine, b, self.plausible.max_scores), byzantine=topo.byzantine,
            )
            for b in self.byzantine
        }
        # Colluding Byzantine clients pool what they received: here the pool is rows of the models.
        self.colluders = tuple(self.byzantine) if sc.attack.colluding else ()
        # With links that cost something, slow clients or [clock] compute, each round on a
        # simulated clock (which models reach each receiver by its deadline); with a compression,
        # the models as their receivers rebuild them.
        self.network = SimulatedNetwork(sc, self.honest, self.byzantine)
        self.begin_round(0)
        self.rejected: dict[int, dict[str, int]] = {}  # receiver -> reason -> messages refused
        self.stale: dict[int, int] = {}  # receiver -> messages dropped as stale
        self.silent = dict.fromkeys(self.byzantine, 0)

    def train_features(self, x: torch.Tensor) -> torch.Tensor:
        """Rows gathered from ``train_x`` as float32 features."""
        return self.pixels.features(x)

    # -- one round ---------------------------------------------------------------------------
    def begin_round(self, r: int) -> None:
        """Round ``r``'s graph: whom each client hears from (``senders``) and sends to
        (``receivers``); under a schedule, each honest client's rule of the round."""
        n = self.topology.num_clients
        self.senders = {k: self.graphs.senders_to(k, r) for k in range(n)}
        self.receivers = {k: self.graphs.receivers_of(k, r) for k in range(n)} if self.graphs.dynamic else self.senders
        for b in self.byzantine:  # what its messages of the round carry besides the model
            self.network.sizes.scored[b] = len(self.attack_steps[b].reported(r) or ())
        self.network.begin_round(r, self.senders)
        if not self.graphs.dynamic:
            return
        for k in self.honest:
            self.rules[k], self.told[k] = self.told_rules.at(k, self.senders[k])

    def active_rows(self, step: int) -> torch.Tensor | None:
        """The rows of the clients taking local step ``step``: None for all (the usual case), else
        their positions (int64, on the models' device); under gossip, those of ``self.wave``."""
        if self.wave is not None:
            return torch.tensor([c for c in self.wave if step < self.steps[c]], dtype=torch.long, device=self.device)
        if all(step < n for n in self.steps):
            return None
        return torch.tensor([c for c, n in enumerate(self.steps) if step < n], dtype=torch.long, device=self.device)

    def picks(self, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One local step's minibatch of every client (``rows``: of those clients only): rows of
        the training set ``[C, B]`` and, when a shard is smaller than the batch size (its batch
        padded), the weight of each row (the padding weighs 0) else None."""
        which = range(len(self.batches)) if rows is None else rows.tolist()
        picks = [self.batches[c].next() for c in which]
        offsets = self.offsets if rows is None else self.offsets[rows]
        if not picks:
            return torch.empty(0, 0, dtype=torch.long, device=self.device), None
        width = max(len(p) for p in picks)
        if all(len(p) == width for p in picks):
            return self.shard_rows[torch.stack(picks).to(self.device) + offsets[:, None]], None
        index = torch.zeros(len(picks), width, dtype=torch.long)
        weight = torch.zeros(len(picks), width)
        for i, p in enumerate(picks):
            index[i, : len(p)] = p
            weight[i, : len(p)] = 1.0 / len(p)
        return self.shard_rows[index.to(self.device) + offsets[:, None]], weight.to(self.device)

    def augmented(self, x: torch.Tensor, rows: torch.Tensor | None, weight: torch.Tensor | None) -> torch.Tensor:
        """This run's minibatches ``x [C, B, F]`` (of the clients ``rows``, else all) with each
        client's augmentation applied by its own generator, as a client applies it: to the rows
        of its batch (a padded batch's padding left as it is)."""
        if self.augment[0] is None:
            return x
        x = x.clone()
        which = range(len(self.honest)) if rows is None else rows.tolist()
        for i, c in enumerate(which):
            width = x.shape[1] if weight is None else int((weight[i] > 0).sum())
            x[i, :width] = self.augment[c](x[i, :width])
        return x

    def refused_rows(self) -> dict[int, str]:
        """Honest clients whose model this round any receiver's intake would refuse (a
        diverged model: NaN, Inf or past ``network.max_abs_value``) -> the reason."""
        # Two reductions: aminmax along a dim is several times slower here than amin and amax.
        low, high = self.models.amin(dim=1).tolist(), self.models.amax(dim=1).tolist()
        out = {}
        for k, i in self.row.items():
            error = self.plausible.values_error(low[i], high[i])
            if error is not None:
                out[k] = error.reason
        return out

    def _reject(self, receiver: int, reason: str) -> None:
        counts = self.rejected.setdefault(receiver, {})
        counts[reason] = counts.get(reason, 0) + 1

    def _rows(self, senders, at=None) -> torch.Tensor:
        """The honest models of ``senders`` as a CPU tensor [len(senders), D]: under a
        compression, as the receiver ``at`` (sender -> receiver, or one receiver) rebuilt them."""
        if not senders:
            return torch.empty(0, self.models.shape[1])
        rebuilt = self.network.rows(senders, at) if at is not None else None
        if rebuilt is not None:
            return rebuilt
        return self.models.index_select(0, torch.tensor([self.row[k] for k in senders], device=self.models.device)).cpu()

    def byzantine_messages(
        self, r: int, losses: dict[int, float], refused: dict[int, str]
    ) -> tuple[dict[tuple[int, int], tuple[torch.Tensor, int, float, Any]], dict[int, list[int]]]:
        """(Byzantine b, receiver k) -> (model, declared size, declared loss, reported scores) of
        every message a receiver accepts; and who each Byzantine client heard from."""
        out: dict[tuple[int, int], tuple[torch.Tensor, int, float, Any]] = {}
        heard: dict[int, list[int]] = {}
        self.notes: dict[int, Any] = {}
        for b in self.byzantine:
            for k in sorted(k for k in self.senders[b] if k in refused):
                self._reject(b, refused[k])
            heard[b] = sorted(k for k in self.network.arrived(b, self.senders[b]) if k in self.row and k not in refused)
        pool_senders = tuple(sorted({k for b in self.colluders for k in heard[b]}))
        # Under a compression a pooled model is as the first colluder that heard it rebuilt it.
        first = {k: min(b for b in self.colluders if k in heard[b]) for k in pool_senders}
        pool = self._rows(pool_senders, first) if self.colluders else None
        for b in self.byzantine:
            senders = heard[b]
            receivers = tuple(k for k in self.receivers[b] if k in self.row)
            crafted, claimed_size, claimed_loss = self.attack_steps[b](
                r, receivers=receivers, senders=tuple(senders), received=self._rows(senders, b), sizes=[self.num_samples[k] for k in senders],
                losses=[losses[k] for k in senders], reports={k: self.network.shared.get(k) for k in senders}, colluders=self.colluders, pool_senders=pool_senders if self.colluders else (), pool=pool,
            )
            self.notes[b] = crafted
            values_errors: dict[int, Any] = {}  # one check per message, however many receive it
            for k in receivers:
                message = crafted.messages[k]
                if message is None:
                    self.silent[b] += 1
                    continue
                vector = message
                if id(vector) not in values_errors:
                    values_errors[id(vector)] = self.plausible.model_error(vector)
                error = self.plausible.samples_error(claimed_size) or values_errors[id(vector)]
                if error is not None:  # what the receiver's intake would refuse
                    self._reject(k, error.reason)
                    continue
                out[(b, k)] = (vector.to(self.device), claimed_size, self.plausible.train_loss(claimed_loss), self.attack_steps[b].reported(r))
            for k, labelled in crafted.extra.items():
                for label, _ in labelled:
                    self._misrouted(k, label, r)
        return out, heard

    def _misrouted(self, receiver: int, label: int, r: int) -> None:
        """What a receiver's intake does with a message labelled ``label`` from a sender in round
        ``r``: the receiver is then in round ``r`` or ``r + 1`` (it sent its round-``r`` model and
        waits for this sender's round ``r + 1``), so the message is what its inbox makes of it in
        both (:func:`window_outcome`): stale (below ``r``) or refused as ``future_round`` (past
        ``r + 1 + round_window``). Labels in between would be buffered and used, which depends on
        timing the batched engine does not model: a ``ValueError``."""
        if self.graphs.dynamic:
            # Under a schedule a receiver may be several rounds behind or ahead of its sender
            # (each waits only for its own senders): what becomes of the message is timing.
            raise ValueError(
                f"an attack sent client {receiver} a round-{label} message in round {r}: under a topology schedule what a "
                "receiver does with it depends on the rounds clients are in, which the batched engine does not model; use the client engine"
            )
        window = self.scenario.network.round_window
        at_r, at_next = window_outcome(label, r, window), window_outcome(label, r + 1, window)
        if at_r == at_next == "stale":
            self.stale[receiver] = self.stale.get(receiver, 0) + 1
        elif at_r == at_next == "future":
            self._reject(receiver, "future_round")
        else:
            raise ValueError(
                f"an attack sent client {receiver} a round-{label} message in round {r}: within the rounds a receiver "
                f"buffers ({r}..{r + 1 + window}), whose use the batched engine does not model; use the client engine"
            )

    def candidates(self, r: int, reference: torch.Tensor, losses: dict[int, float], byz, refused: dict[int, str]) -> Candidates:
        """What every honest client aggregates this round: the pooled candidates (the honest
        models, rows 0..C-1 in ``self.honest`` order, then each accepted Byzantine message) and,
        per client, its rows (its own first), senders, declared sizes and losses."""
        pool = [self.models]
        pooled = len(self.honest)
        byz_row = {}
        # Under a compression: (sender, receiver) -> the row of the model the receiver rebuilt.
        rows, link_row = pooled_links(self.network.rebuilt, self.row, pooled)
        pool += [row.to(self.device) for row in rows]
        pooled += len(rows)
        # One row per distinct message of a Byzantine sender (two senders' stay two rows: no client
        # holds a row twice): a tensor sent to all receivers (most attacks) is scored, summed once.
        row_of: dict[tuple[int, int], int] = {}
        for key, (vector, *_) in byz.items():
            same = (key[0], id(vector))
            if same not in row_of:
                row_of[same] = pooled
                pool.append(vector[None])
                pooled += 1
            byz_row[key] = row_of[same]
        believed = {j: self.plausible.train_loss(losses[j]) for j in self.honest}  # what a receiver takes of each declared loss
        honest_row, num_samples, shared = self.row, self.num_samples, self.network.shared
        clients = []
        for k in self.honest:
            offers = []
            for j in self.network.arrived(k, self.senders[k]):
                if j in honest_row:
                    if j in refused:
                        self._reject(k, refused[j])
                        continue
                    offers.append(Offer(j, link_row[(j, k)] if link_row else honest_row[j], num_samples[j], believed[j], reports=shared.get(j)))
                elif (j, k) in byz:
                    _, size, loss, reports = byz[(j, k)]
                    offers.append(Offer(j, byz_row[(j, k)], size, loss, reports=reports))
            # A timed network knows the models that were sent and did not come in time.
            timed = self.network.missing(k, (o.sender for o in offers))
            clients.append(assemble(Offer(k, honest_row[k], num_samples[k], losses[k]), offers, self.senders[k], timed, memory=self.memory.get(k)))
        # Rules get the candidates on the CPU, as a client does (they arrive there from the wire):
        # a rule may mix them with tensors of its own. Scoring moves them to the aux data's device.
        # On a GPU one copy to the CPU for the whole pool; on the CPU the pieces as they are.
        pieces = [torch.cat(pool).cpu()] if self.device.type != "cpu" and len(pool) > 1 else [piece.cpu() for piece in pool]
        # The intake has looked at every pooled row: an honest model is non-finite exactly when
        # it was refused as such, an accepted message is finite.
        finite = [refused.get(k) != "non_finite" for k in self.honest] + [True] * (pooled - len(self.honest))
        return Candidates(pieces=pieces, clients=clients, evaluate=[self.aux[k] for k in self.honest], reference=reference, finite=finite)

    def aggregated(self, k: int, agg: Aggregate) -> None:
        """What client ``k``'s aggregation leaves for its next: the scores its next message
        carries (network.share_scores) and its rule's memory."""
        self.network.aggregated(k, agg.scores)
        self.memory[k] = agg.memory

    def records(self, r: int, losses: dict[int, float], candidates: Candidates, results: list[Aggregate]) -> list[dict[str, Any]]:
        """The rules' results become the models; returns the round records in ``self.honest`` order
        (with a clock: simulated seconds at the round's end, bytes each put on its links)."""
        self.models = torch.stack([agg.model for agg in results]).to(self.device)
        records = []
        for c, (k, agg) in enumerate(zip(self.honest, results, strict=True)):
            self.aggregated(k, agg)
            record = honest_record(r, losses[k], agg.weights, candidates.clients[c].missing, scores=agg.scores, **self.network.record(k))
            records.append(with_round_graph(record, self.graphs, k, r, self.told.get(k)))
        return records

    @torch.no_grad()
    def accuracies(self, only: list[int] | None = None) -> dict[int, dict[str, float]]:
        """Each honest client's local and global test accuracy (percent), as a client measures it,
        and under a backdoor attack its attack success rate on the triggered test rows (``only``:
        of those clients). The global test set goes through the model once per block of clients
        (logits under ~64 M values); a client's local test set is rows of it: same predictions."""
        honest = self.honest if only is None else only
        models = self.models if only is None else self.models[[self.row[k] for k in only]]
        out: dict[int, dict[str, float]] = {k: {} for k in honest}
        test = self.test
        widest = max(self.scenario.train.hidden, test.num_classes)  # values per sample in the largest layer output
        block = max(1, (64 << 20) // max(1, len(test.y) * widest))
        for lo in range(0, len(honest), block):
            # Classes first [C, K, N]: the layout the product writes fastest and the class
            # maximum reads fastest (as the scoring); max(dim).indices is argmax.
            logits = self.model.class_first_logits(models[lo : lo + block], test.x)
            hits = logits.max(1).indices == test.y  # [C, N]
            probe = None
            if self.probe is not None:
                probe = self.model.class_first_logits(models[lo : lo + block], self.probe.x).max(1).indices == self.probe.y
            for i, k in enumerate(honest[lo : lo + block]):
                out[k] = measures(hits[i], self.data[k].local_test_index.to(self.device), None if probe is None else probe[i])
        return out

    # -- the run -----------------------------------------------------------------------------
    def begin(self) -> None:
        """Open the results folder: the scenario, one round log per client."""
        out = self.out_dir
        (out / "logs").mkdir(parents=True, exist_ok=True)
        dump_scenario(self.scenario, out / "scenario.toml")
        self.logs = {
            k: RoundLog(out, k, flush_seconds=1.0, tensorboard=self.tensorboard, byzantine=self.byzantine, digest=True)
            for k in range(self.topology.num_clients)
        }
        self.last: dict[int, dict[str, float]] = {k: {} for k in self.honest}

    def before_aggregation(self, r: int, losses: list[float]) -> tuple[dict[int, float], Candidates]:
        """After local training: the Byzantine messages, then each honest client's candidates."""
        reference = self._reference
        losses_by_id = dict(zip(self.honest, losses, strict=True))
        refused = self.refused_rows()
        if self.network.codec is not None:
            self.network.rebuild(r, {k: self.models[self.row[k]].cpu() for k in self.honest})
        self._silent_before = dict(self.silent)
        byz, self._heard = self.byzantine_messages(r, losses_by_id, refused)
        return losses_by_id, self.candidates(r, reference, losses_by_id, byz, refused)

    def end_round(self, r: int, losses: dict[int, float], candidates: Candidates, results: list[Aggregate]) -> None:
        """The new models, the evaluation when it is due, the round's records."""
        sc = self.scenario
        records = self.records(r, losses, candidates, results)
        if evaluation_due(r, sc.rounds, sc.eval.every):
            self.last = self.accuracies()
            for k, rec in zip(self.honest, records, strict=True):
                rec.update(self.last[k])
        for k, rec in zip(self.honest, records, strict=True):
            self.logs[k].write(rec)
        for b in self.byzantine:
            # Every colluder's pool arrives here: each used all of them.
            pooled = list(self.colluders) if self.colluders else None
            record = byzantine_record(
                r, self._heard[b], self.silent[b] - self._silent_before[b], self.notes[b], 0, 0, pooled_from=pooled, reported=self.attack_steps[b].reported(r),
            )
            self.logs[b].write(with_round_graph(record, self.graphs, b, r))

    def close(self) -> None:
        for f in getattr(self, "logs", {}).values():
            f.close()

    def finish(self, loop: dict[str, float], wall: float, *, interrupted: bool = False) -> dict[str, Any]:
        """Each client's final file and the run's summary (``interrupted``: stopped before its last round)."""
        for k in range(self.topology.num_clients):
            final = self._final(k, self.last.get(k, {}), loop, wall)
            final["completed"] = not interrupted
            write_json_atomic(self.out_dir / "peers" / f"{k}.json", final)
        n = self.topology.num_clients
        return collect_summary(
            self.out_dir, self.scenario, pids=dict.fromkeys(range(n), os.getpid()), exit_codes=dict.fromkeys(range(n), 130 if interrupted else 0),
            wall_seconds=wall, digests={k: log.digest for k, log in self.logs.items()},
            extra={
                "interrupted": interrupted, "launcher_pid": os.getpid(), "transport": "none", "tls": "n/a (batched engine)", "device": str(self.device),
                **self.layout, **device_memory(self.device),
            },
        )

    def _final(self, k: int, last: dict[str, float], loop: dict[str, float], wall: float) -> dict[str, Any]:
        sc = self.scenario
        if k in self.row:
            final: dict[str, Any] = {
                **last, **loop, "num_samples": self.num_samples[k], "aux_samples": len(self.data[k].aux.y),
                "local_test_samples": len(self.data[k].local_test_index),
                "aggregation": self.told_rules.summary(k),
            }
        else:
            final = {"attack": sc.attack.name, **loop}
        final.update(
            final_keys(
                k, "honest" if k in self.row else "byzantine", pid=os.getpid(), address="batched", device=str(self.device), wall_seconds=wall,
                rejected=self.rejected.get(k, {}), stale_messages=self.stale.get(k, 0), unsent_messages={"dropped": 0, "stale": 0},
                refused_calls_by_reason={}, tls="n/a (batched engine)",
            ),
            engine="batched", **self.layout,
        )
        if self.graphs.dynamic:
            final["schedule"] = sc.topology.schedule
        final.update(self.network.final(k))  # with a clock: what its links lost
        return final


