"""``engine.name = "batched"``: every client of a scenario at once, in this process.

The honest clients' models are the rows of one ``[clients, params]`` tensor on one device. A
round is, for all of them together: the local SGD step(s) (one ``vmap`` of the model's
per-sample-batch gradient over the clients), the Byzantine clients' messages (each attack
called on the rows its neighbours sent it, as a Byzantine process would), and each client's
aggregation rule on the rows its neighbours sent it. Nothing is serialised and nothing waits:
no deadlines, no message loss, no threads.

It is the same experiment as the other engines, not a re-implementation of it: the partition,
graph, Byzantine placement, initial models, minibatch order (:class:`~dfedrw.peer.training.BatchOrder`),
attack noise, the rule, TPM, CRS and attack classes and the plausibility checks a receiver
applies are the ones the clients use, drawn from the same seeds. Floats may differ in the last
bits (a batched matrix product sums in another order), see ``tests/integration/test_engine_parity.py``.

Its results folder has the layout and keys of every run (``scenario.toml``, ``peers/<id>.jsonl``,
``peers/<id>.json``, ``summary.json``); byte counts are 0 (nothing was sent) and
``summary.json`` says ``"engine": "batched"``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from torch.nn import functional as F

from dfedrw.launch.collect import collect_summary
from dfedrw.peer.config import Scenario, dump_scenario
from dfedrw.peer.aggregation import RoundBatch
from dfedrw.peer.models import build_model, get_vector
from dfedrw.peer.attacks import AttackView, craft_round
from dfedrw.peer.node import (
    attack_generator, byzantine_claims, byzantine_record, client_attack, client_rule, clients_data, finite_or_none, initial_model,
    known_mean, move, scenario_plausible,
)
from dfedrw.peer.plan import DATASET_SHAPES, derive_seed, scenario_topology, told_byzantine
from dfedrw.peer.plugins import _takes_tpm_and_crs
from dfedrw.peer.results import RoundLog, write_json_atomic
from dfedrw.peer.training import BatchOrder, FlatModel, ManyEvaluator


def engine_device(name: str) -> torch.device:
    """The device ``engine.device`` names, refused with one line when it is not here."""
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"engine.device={name!r}: this machine has no CUDA device (torch.cuda.is_available() is False)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"engine.device={name!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - a rule whose equality cannot be decided is its own group
        return False


def rule_groups(rules: list[Any]) -> list[tuple[Any, list[int]]]:
    """Positions of equal rules (same class, same settings), in first-seen order: a rule with a
    batched method is called once a round for its whole group.

    Hashable rules (the built-in ones are frozen dataclasses) are grouped through a dict, so
    10,000 clients each with its own rule (Flame's per-client seed) cost 10,000 lookups rather
    than 50 million comparisons; the others are compared with each group found so far.
    """
    groups: list[tuple[Any, list[int]]] = []
    by_key: dict[Any, list[int]] = {}
    for c, rule in enumerate(rules):
        key = (type(rule), rule)
        try:
            members, hashable = by_key.get(key), True
        except Exception:  # noqa: BLE001 - unhashable, or an equality that cannot be decided
            members, hashable = next((m for r, m in groups if _same(r, rule)), None), False
        if members is None:
            members = []
            groups.append((rule, members))
            if hashable:
                by_key[key] = members
        members.append(c)
    return groups


class BatchedRun:
    """One scenario, all clients at once. ``run()`` writes the results folder and returns the summary."""

    def __init__(self, scenario: Scenario, out_dir: Path) -> None:
        self.scenario = sc = scenario
        self.out_dir = Path(out_dir)
        self.device = engine_device(sc.engine.device)
        self.topology = topo = scenario_topology(sc)
        self.honest = sorted(topo.honest())
        self.byzantine = sorted(topo.byzantine)
        self.row = {k: i for i, k in enumerate(self.honest)}
        # On the CPU: each client's shard and aux set (copies, a partition of the training
        # set), the test set once. What the rounds use is moved to the device below, the test
        # set once for all clients (each client's local test set is rows of it).
        self.data = clients_data(sc, topo, self.honest)
        self.test = move(self.data[self.honest[0]].global_test, self.device)
        features, classes = DATASET_SHAPES[sc.data.name]
        t = sc.train
        template = build_model(t.model, features, classes, hidden=t.hidden, seed=0)
        self.model = FlatModel(template, self.device)
        self.models = torch.stack([get_vector(initial_model(sc, k)) for k in self.honest]).to(self.device)
        # Every shard in one tensor (a partition: one copy of the training set), each
        # client's rows from its offset on; minibatches are gathered from it.
        shards = [self.data[k].train for k in self.honest]
        self.train_x = torch.cat([s.x for s in shards]).to(self.device)
        self.train_y = torch.cat([s.y for s in shards]).to(self.device)
        sizes = [len(s.y) for s in shards]
        self.num_samples = dict(zip(self.honest, sizes, strict=True))
        self.offsets = torch.tensor(np.concatenate([[0], np.cumsum(sizes)[:-1]]), dtype=torch.long, device=self.device)
        self.batches = [BatchOrder(n, t.batch_size, derive_seed(sc.seed, "batches", k)) for k, n in zip(self.honest, sizes, strict=True)]
        self.rules = {k: client_rule(sc, topo, k) for k in self.honest}
        self.rule_groups = rule_groups([self.rules[k] for k in self.honest])
        # Scoring on the auxiliary sets: many clients at once, or each client's own evaluator.
        self.scorer = ManyEvaluator(template, {k: move(self.data[k].aux, self.device) for k in self.honest})
        self.aux = self.scorer.each
        self.attacks = {b: client_attack(sc, topo, b) for b in self.byzantine}
        self.attack_gen = {b: torch.Generator().manual_seed(derive_seed(sc.seed, "attack", b)) for b in self.byzantine}
        # Colluding Byzantine clients pool what they received: here the pool is rows of the models.
        self.colluders = tuple(self.byzantine) if sc.attack.colluding else ()
        self.reference: dict[int, torch.Tensor | None] = dict.fromkeys(self.byzantine)
        self.plausible = scenario_plausible(sc)
        self.neighbours = {k: tuple(topo.neighbours(k)) for k in range(topo.num_clients)}
        self.rejected: dict[int, dict[str, int]] = {}  # receiver -> reason -> messages refused
        self.stale: dict[int, int] = {}  # receiver -> messages dropped as stale
        self.silent = dict.fromkeys(self.byzantine, 0)

    # -- one round ---------------------------------------------------------------------------
    def local_steps(self) -> list[float]:
        """Every client's local SGD steps at once; returns each one's mean minibatch loss.

        The clients' losses are independent, so the gradient of their sum with respect to the
        ``[C, P]`` parameters is each client's own gradient in its own row."""
        t = self.scenario.train
        total = [0.0] * len(self.honest)
        for _ in range(t.local_steps):
            picks = [b.next() for b in self.batches]
            width = max(len(p) for p in picks)
            if all(len(p) == width for p in picks):
                index = torch.stack(picks).to(self.device) + self.offsets[:, None]
                weight = None
            else:  # a shard smaller than the batch size: its batch is padded, the padding weighs 0
                index = torch.zeros(len(picks), width, dtype=torch.long)
                weight = torch.zeros(len(picks), width)
                for i, p in enumerate(picks):
                    index[i, : len(p)] = p
                    weight[i, : len(p)] = 1.0 / len(p)
                index = index.to(self.device) + self.offsets[:, None]
                weight = weight.to(self.device)
            x, y = self.train_x[index], self.train_y[index]
            models = self.models.detach().requires_grad_()
            logits = self.model.batch_logits(models, x)
            count, batch, classes = logits.shape
            per = F.cross_entropy(logits.reshape(count * batch, classes), y.reshape(-1), reduction="none").view(count, batch)
            losses = per.mean(1) if weight is None else (per * weight).sum(1)
            (grads,) = torch.autograd.grad(losses.sum(), models)
            self.models = models.detach().add_(grads, alpha=-t.lr)
            total = [a + b for a, b in zip(total, losses.tolist(), strict=True)]
        return [x / t.local_steps for x in total]

    def refused_rows(self) -> dict[int, str]:
        """Honest clients whose model this round any receiver's intake would refuse (a
        diverged model: NaN, Inf or past ``network.max_abs_value``) -> the reason."""
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

    def _rows(self, senders) -> torch.Tensor:
        """The honest models of ``senders`` as a CPU tensor [len(senders), D]."""
        return self.models[[self.row[k] for k in senders]].cpu() if senders else torch.empty(0, self.models.shape[1])

    def byzantine_messages(
        self, r: int, losses: dict[int, float], refused: dict[int, str]
    ) -> tuple[dict[tuple[int, int], tuple[torch.Tensor, int, float]], dict[int, list[int]]]:
        """(Byzantine b, receiver k) -> (model, declared size, declared loss) of every message a
        receiver accepts; and who each Byzantine client heard from."""
        out: dict[tuple[int, int], tuple[torch.Tensor, int, float]] = {}
        heard: dict[int, list[int]] = {}
        self.notes: dict[int, Any] = {}
        for b in self.byzantine:
            for k in sorted(k for k in self.neighbours[b] if k in refused):
                self._reject(b, refused[k])
            heard[b] = sorted(k for k in self.neighbours[b] if k in self.row and k not in refused)
        pool_senders = tuple(sorted({k for b in self.colluders for k in heard[b]}))
        pool = self._rows(pool_senders) if self.colluders else None
        for b in self.byzantine:
            senders = heard[b]
            claimed_size, claimed_loss = byzantine_claims([self.num_samples[k] for k in senders], [losses[k] for k in senders])
            view = AttackView(
                round=r, attacker=b, receivers=tuple(k for k in self.neighbours[b] if k in self.row), senders=tuple(senders),
                received=self._rows(senders), colluders=self.colluders, pool_senders=pool_senders if self.colluders else (),
                pool=pool, reference=self.reference[b], total_rounds=self.scenario.rounds,
            )
            attack = self.attacks[b]
            crafted = craft_round(attack, view, attack_generator(self.scenario, view, attack, self.attack_gen[b]))
            self.reference[b] = known_mean(view)
            self.notes[b] = crafted
            for k in view.receivers:
                message = crafted.messages[k]
                if message is None:
                    self.silent[b] += 1
                    continue
                vector = message
                error = self.plausible.samples_error(claimed_size) or self.plausible.values_error(
                    *((float(vector.min()), float(vector.max())) if vector.numel() else (0.0, 0.0))
                )
                if error is not None:  # what the receiver's intake would refuse
                    self._reject(k, error.reason)
                    continue
                out[(b, k)] = (vector.to(self.device), claimed_size, self.plausible.train_loss(claimed_loss))
            for k, labelled in crafted.extra.items():
                for label, _ in labelled:
                    self._misrouted(k, label, r)
        return out, heard

    def _misrouted(self, receiver: int, label: int, r: int) -> None:
        """What a receiver's intake does with a message of round ``r``'s sender labelled
        ``label``: a receiver is then in round ``r`` or ``r + 1`` (it sent its round-``r``
        model, and waits for this sender's round ``r + 1`` before going on), so a label below
        ``r`` is stale whichever, one past ``r + 1 + round_window`` is refused as
        ``future_round``. Labels in between would be buffered and used, which depends on timing
        the batched engine has none of: refused with one line."""
        window = self.scenario.network.round_window
        if label < r:
            self.stale[receiver] = self.stale.get(receiver, 0) + 1
        elif label > r + 1 + window:
            self._reject(receiver, "future_round")
        else:
            raise ValueError(
                f"an attack sent client {receiver} a round-{label} message in round {r}: within the rounds a receiver "
                f"buffers ({r}..{r + 1 + window}), whose use the batched engine does not model; use the client engine"
            )

    def aggregate(self, r: int, reference: torch.Tensor, losses: dict[int, float], byz, refused: dict[int, str]) -> list[dict[str, Any]]:
        """Every honest client's rule on what it received; the models move to the results.
        Returns the clients' round records, in ``self.honest`` order.

        The round's candidates are pooled: the honest models (rows 0..C-1, in ``self.honest``
        order), then each accepted Byzantine message. Clients that share a rule with a
        ``batched`` method get it called once for all of them; other rules are called per client."""
        sc = self.scenario
        pool = [self.models]
        pooled = len(self.honest)
        byz_row = {}
        for key, (vector, _, _) in byz.items():
            byz_row[key] = pooled
            pool.append(vector[None])
            pooled += 1
        rows, ids, sizes, declared, missing = [], [], [], [], []
        for k in self.honest:
            neighbours = sorted(self.neighbours[k])
            for j in neighbours:
                if j in refused:
                    self._reject(k, refused[j])
            senders = [j for j in neighbours if (j in self.row and j not in refused) or (j, k) in byz]
            row, size, loss = [self.row[k]], [self.num_samples[k]], [losses[k]]
            for j in senders:
                if j in self.row:
                    row.append(self.row[j])
                    size.append(self.num_samples[j])
                    loss.append(self.plausible.train_loss(losses[j]))
                else:
                    row.append(byz_row[(j, k)])
                    size.append(byz[(j, k)][1])
                    loss.append(byz[(j, k)][2])
            rows.append(tuple(row))
            ids.append((k, *senders))
            sizes.append(tuple(size))
            declared.append(tuple(loss))
            missing.append(sorted(set(neighbours) - set(senders)))
        # Rules get the candidates on the CPU, as a client does (they arrive there from the wire):
        # a rule may mix them with tensors of its own. Scoring moves them to the aux data's device.
        vectors = torch.cat(pool) if len(pool) > 1 else self.models
        batch = RoundBatch(
            round=r, vectors=vectors.cpu(), rows=tuple(rows), ids=tuple(ids),
            num_samples=tuple(sizes), declared_losses=tuple(declared), evaluate=tuple(self.aux[k] for k in self.honest),
            evaluate_many=self.scorer,
            references=reference, total_rounds=sc.rounds,
        )
        results = [None] * len(self.honest)
        for rule, members in self.rule_groups:
            if hasattr(rule, "batched"):
                sub = batch.select(members) if len(members) < len(self.honest) else batch
                for c, agg in zip(members, rule.batched(sub), strict=True):
                    results[c] = agg
            else:
                for c in members:
                    results[c] = rule(batch.one(c))
        self.models = torch.stack([agg.model for agg in results]).to(self.device)
        records = []
        for c, (k, agg) in enumerate(zip(self.honest, results, strict=True)):
            record: dict[str, Any] = {
                "round": r,
                "train_loss": losses[k],
                "weights": {str(s): round(float(w), 6) for s, w in agg.weights.items()},
                "bytes_sent": 0,
                "bytes_received": 0,
                "missing": missing[c],
            }
            if agg.scores is not None:
                record["scores"] = {str(s): finite_or_none(v) for s, v in agg.scores.items()}
            records.append(record)
        return records

    @torch.no_grad()
    def accuracies(self) -> dict[int, dict[str, float]]:
        """Each honest client's local and global test accuracy (percent), as a client measures
        it. The global test set is the same for all: it goes through the model once for a
        block of clients (blocks bounded so the logits stay under ~64 M values)."""
        out: dict[int, dict[str, float]] = {k: {} for k in self.honest}
        test = self.test
        for k in self.honest:
            rows = self.data[k].local_test_index.to(self.device)
            logits = self.model.logits(self.models[self.row[k]], test.x[rows])
            out[k]["accuracy"] = 100.0 * float((logits.argmax(1) == test.y[rows]).float().mean())
        widest = max(self.scenario.train.hidden, test.num_classes)  # values per sample in the largest layer output
        block = max(1, (64 << 20) // max(1, len(test.y) * widest))
        for lo in range(0, len(self.honest), block):
            logits = self.model.batch_logits(self.models[lo : lo + block], test.x)
            correct = (logits.argmax(-1) == test.y).float().mean(1).tolist()
            for k, acc in zip(self.honest[lo : lo + block], correct, strict=True):
                out[k]["global_accuracy"] = 100.0 * acc
        return out

    # -- the run -----------------------------------------------------------------------------
    def run(self, on_round: Callable[[int], None] | None = None) -> dict[str, Any]:
        sc = self.scenario
        start = time.monotonic()
        out = self.out_dir
        (out / "logs").mkdir(parents=True, exist_ok=True)
        dump_scenario(sc, out / "scenario.toml")
        logs = {k: RoundLog(out, k, flush_seconds=1.0) for k in range(self.topology.num_clients)}
        threads = torch.get_num_threads()
        torch.set_num_threads(sc.engine.threads)
        loop_start, cpu_start = time.monotonic(), time.process_time()
        last: dict[int, dict[str, float]] = {k: {} for k in self.honest}
        try:
            for r in range(sc.rounds):
                reference = self.models.to("cpu", copy=True)  # the local steps update the models in place
                losses = dict(zip(self.honest, self.local_steps(), strict=True))
                refused = self.refused_rows()
                silent_before = dict(self.silent)
                byz, heard = self.byzantine_messages(r, losses, refused)
                records = self.aggregate(r, reference, losses, byz, refused)
                every = sc.eval.every
                if r == sc.rounds - 1 or (every and (r + 1) % every == 0):
                    last = self.accuracies()
                    for k, rec in zip(self.honest, records, strict=True):
                        rec.update(last[k])
                for k, rec in zip(self.honest, records, strict=True):
                    logs[k].write(rec)
                for b in self.byzantine:
                    # Every colluder's pool arrives here: each used all of them.
                    pooled = list(self.colluders) if self.colluders else None
                    logs[b].write(byzantine_record(r, heard[b], self.silent[b] - silent_before[b], self.notes[b], 0, 0, pooled_from=pooled))
                if on_round is not None:
                    on_round(r)
        finally:
            torch.set_num_threads(threads)
            for f in logs.values():
                f.close()
        loop = {"loop_seconds": round(time.monotonic() - loop_start, 3), "loop_cpu_seconds": round(time.process_time() - cpu_start, 3)}
        wall = round(time.monotonic() - start, 3)
        for k in range(self.topology.num_clients):
            write_json_atomic(out / "peers" / f"{k}.json", self._final(k, last.get(k, {}), loop, wall))
        return collect_summary(
            out, sc, pids=dict.fromkeys(range(self.topology.num_clients), os.getpid()), exit_codes=dict.fromkeys(range(self.topology.num_clients), 0),
            wall_seconds=time.monotonic() - start,
            extra={"interrupted": False, "launcher_pid": os.getpid(), "transport": "none", "tls": "n/a (batched engine)", "device": str(self.device)},
        )

    def _final(self, k: int, last: dict[str, float], loop: dict[str, float], wall: float) -> dict[str, Any]:
        sc = self.scenario
        if k in self.row:
            cfg = sc.aggregation_for(k)
            final: dict[str, Any] = {
                **last, **loop, "num_samples": self.num_samples[k], "aux_samples": len(self.data[k].aux.y),
                "local_test_samples": len(self.data[k].local_test_index),
                "aggregation": {"rule": cfg.rule, "told_byzantine": told_byzantine(cfg, self.topology, k)},
            }
            if _takes_tpm_and_crs(cfg.rule):
                final["aggregation"].update(tpm=cfg.tpm, crs=cfg.crs)
        else:
            final = {"attack": sc.attack.name, **loop}
        rejected = self.rejected.get(k, {})
        final.update(
            id=k, role="honest" if k in self.row else "byzantine", pid=os.getpid(), address="batched", device=str(self.device),
            completed=True, wall_seconds=wall, rejected_messages=sum(rejected.values()), rejected_by_reason=dict(rejected),
            stale_messages=self.stale.get(k, 0), unsent_messages={"dropped": 0, "stale": 0}, refused_calls_by_reason={}, tls="n/a (batched engine)",
            restarts=0, rounds_lost=0, resumed_from=[], engine="batched",
        )
        return final


def run_batched(scenario: Scenario, out_dir: Path, *, console: Console) -> dict[str, Any]:
    """Run ``scenario`` in the batched engine, with a progress bar; returns the summary."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from dfedrw.launch.preflight import preflight

    preflight(scenario)
    run = BatchedRun(scenario, out_dir)
    label = f"batched engine, {len(run.honest)} + {len(run.byzantine)} clients on {run.device}"
    if not console.is_terminal:
        every = max(1, scenario.rounds // 10)
        console.print(label)
        return run.run(lambda r: (r + 1) % every == 0 and console.print(f"round {r + 1}/{scenario.rounds}"))
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task("rounds", total=scenario.rounds)
        return run.run(lambda r: bar.update(task, completed=r + 1))
