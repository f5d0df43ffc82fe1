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

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from torch.func import functional_call, grad_and_value, vmap
from torch.nn import functional as F

from dfedrw.launch.collect import collect_summary
from dfedrw.peer.config import Scenario, dump_scenario
from dfedrw.peer.data import TRAIN_SIZES
from dfedrw.peer.models import build_model
from dfedrw.peer.aggregation import RoundInputs
from dfedrw.peer.node import client_rule, clients_data, finite_or_none
from dfedrw.peer.plan import DATASET_SHAPES, derive_seed, scenario_topology, told_byzantine
from dfedrw.peer.plugins import _takes_tpm_and_crs, build_attack
from dfedrw.peer.results import RoundLog, write_json_atomic
from dfedrw.peer.training import BatchOrder, VectorEvaluator
from dfedrw.peer.transport.serde import Plausible

log = logging.getLogger(__name__)


def engine_device(name: str) -> torch.device:
    """The device ``engine.device`` names, refused with one line when it is not here."""
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"engine.device={name!r}: this machine has no CUDA device (torch.cuda.is_available() is False)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"engine.device={name!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


class _Model:
    """The scenario's model as a function of a flat parameter vector (``torch.func``)."""

    def __init__(self, template: torch.nn.Module, device: torch.device) -> None:
        self.module = template.to(device)
        named = list(self.module.named_parameters())
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.sizes = [p.numel() for _, p in named]

    def logits(self, vector: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(vector, self.sizes)
        params = {n: p.view(s) for n, p, s in zip(self.names, parts, self.shapes, strict=True)}
        return functional_call(self.module, params, (x,))


class BatchedRun:
    """One scenario, all clients at once. ``run()`` writes the results folder and returns the summary."""

    def __init__(self, scenario: Scenario, out_dir: Path, *, console: Console | None = None) -> None:
        self.scenario = sc = scenario
        self.out_dir = Path(out_dir)
        self.console = console or Console(stderr=True)
        self.device = engine_device(sc.engine.device)
        self.topology = topo = scenario_topology(sc)
        self.honest = sorted(topo.honest())
        self.byzantine = sorted(topo.byzantine)
        self.row = {k: i for i, k in enumerate(self.honest)}
        self.data = clients_data(sc, topo, self.honest)
        if self.device.type != "cpu":
            self.data = {k: d.to(self.device) for k, d in self.data.items()}
        features, classes = DATASET_SHAPES[sc.data.name]
        t = sc.train
        template = build_model(t.model, features, classes, hidden=t.hidden, seed=0)
        self.model = _Model(template, self.device)
        self.models = torch.stack([self._initial(k, features, classes) for k in self.honest]).to(self.device)
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
        self.aux = {k: VectorEvaluator(template, self.data[k].aux) for k in self.honest}
        self.attack = build_attack(sc, topo.num_clients, len(self.byzantine)) if self.byzantine else None
        self.attack_gen = {b: torch.Generator().manual_seed(derive_seed(sc.seed, "attack", b)) for b in self.byzantine}
        self.plausible = Plausible(max_abs_value=sc.network.max_abs_value, max_num_samples=TRAIN_SIZES[sc.data.name])
        self.neighbours = {k: tuple(topo.neighbours(k)) for k in range(topo.num_clients)}
        self.rejected: dict[int, dict[str, int]] = {}  # receiver -> reason -> messages refused
        self.silent = dict.fromkeys(self.byzantine, 0)
        self._step = vmap(grad_and_value(self._loss))
        self._step_masked = vmap(grad_and_value(self._loss_masked))

    def _initial(self, k: int, features: int, classes: int) -> torch.Tensor:
        t = self.scenario.train
        seed = derive_seed(self.scenario.seed, "init") if t.init == "shared" else derive_seed(self.scenario.seed, "init", k)
        model = build_model(t.model, features, classes, hidden=t.hidden, seed=seed)
        vector = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        return torch.zeros_like(vector) if t.init == "zeros" else vector

    # -- one round ---------------------------------------------------------------------------
    def _loss(self, vector: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.model.logits(vector, x), y)

    def _loss_masked(self, vector: torch.Tensor, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        per = F.cross_entropy(self.model.logits(vector, x), y, reduction="none")
        return (per * weight).sum()

    def local_steps(self) -> list[float]:
        """Every client's local SGD steps at once; returns each one's mean minibatch loss."""
        t = self.scenario.train
        total = [0.0] * len(self.honest)
        for _ in range(t.local_steps):
            picks = [b.next() for b in self.batches]
            width = max(len(p) for p in picks)
            if all(len(p) == width for p in picks):
                index = torch.stack(picks).to(self.device) + self.offsets[:, None]
                grads, losses = self._step(self.models, self.train_x[index], self.train_y[index])
            else:  # a shard smaller than the batch size: its batch is padded, the padding weighs 0
                index = torch.zeros(len(picks), width, dtype=torch.long)
                weight = torch.zeros(len(picks), width)
                for i, p in enumerate(picks):
                    index[i, : len(p)] = p
                    weight[i, : len(p)] = 1.0 / len(p)
                index = index.to(self.device) + self.offsets[:, None]
                grads, losses = self._step_masked(self.models, self.train_x[index], self.train_y[index], weight.to(self.device))
            self.models.add_(grads, alpha=-t.lr)
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

    def byzantine_messages(
        self, losses: dict[int, float], refused: dict[int, str]
    ) -> tuple[dict[tuple[int, int], tuple[torch.Tensor, int, float]], dict[int, list[int]]]:
        """(Byzantine b, receiver k) -> (model, declared size, declared loss) of every message a
        receiver accepts; and who each Byzantine client heard from."""
        out: dict[tuple[int, int], tuple[torch.Tensor, int, float]] = {}
        heard: dict[int, list[int]] = {}
        for b in self.byzantine:
            for k in sorted(k for k in self.neighbours[b] if k in refused):
                self._reject(b, refused[k])
            senders = sorted(k for k in self.neighbours[b] if k in self.row and k not in refused)
            heard[b] = senders
            received = self.models[[self.row[k] for k in senders]].cpu() if senders else torch.empty(0, self.models.shape[1])
            # What a Byzantine process claims: its honest neighbours' mean size and loss.
            claimed_size = round(float(np.mean([self.num_samples[k] for k in senders]))) if senders else 1
            finite = [losses[k] for k in senders if np.isfinite(losses[k])]
            claimed_loss = float(np.mean(finite)) if finite else float("nan")
            for k in self.neighbours[b]:
                if k not in self.row:
                    continue
                crafted = self.attack(received, k, self.attack_gen[b])
                if crafted is None:
                    self.silent[b] += 1
                    continue
                vector = crafted.detach().to(torch.float32).reshape(-1)
                error = self.plausible.samples_error(claimed_size) or self.plausible.values_error(
                    *((float(vector.min()), float(vector.max())) if vector.numel() else (0.0, 0.0))
                )
                if error is not None:  # what the receiver's intake would refuse
                    self._reject(k, error.reason)
                    continue
                out[(b, k)] = (vector.to(self.device), claimed_size, self.plausible.train_loss(claimed_loss))
        return out, heard

    def aggregate(self, r: int, reference: torch.Tensor, losses: dict[int, float], byz, refused: dict[int, str]) -> list[dict[str, Any]]:
        """Every honest client's rule on what it received; the models move to the results.
        Returns the clients' round records, in ``self.honest`` order."""
        sc = self.scenario
        new = torch.empty_like(self.models)
        records = []
        for k in self.honest:
            i = self.row[k]
            neighbours = sorted(self.neighbours[k])
            for j in neighbours:
                if j in refused:
                    self._reject(k, refused[j])
            senders = [j for j in neighbours if (j in self.row and j not in refused) or (j, k) in byz]
            rows, sizes, declared = [self.models[i]], [self.num_samples[k]], [losses[k]]
            for j in senders:
                if j in self.row:
                    rows.append(self.models[self.row[j]])
                    sizes.append(self.num_samples[j])
                    declared.append(self.plausible.train_loss(losses[j]))
                else:
                    vector, size, loss = byz[(j, k)]
                    rows.append(vector)
                    sizes.append(size)
                    declared.append(loss)
            agg = self.rules[k](
                RoundInputs(
                    own_id=k, round=r, ids=(k, *senders), vectors=torch.stack(rows), num_samples=tuple(sizes),
                    evaluate=self.aux[k], total_rounds=sc.rounds, declared_losses=tuple(declared), reference=reference[i],
                )
            )
            new[i] = agg.model.to(self.device)
            record: dict[str, Any] = {
                "round": r,
                "train_loss": losses[k],
                "weights": {str(s): round(float(w), 6) for s, w in agg.weights.items()},
                "bytes_sent": 0,
                "bytes_received": 0,
                "missing": sorted(set(neighbours) - set(senders)),
            }
            if agg.scores is not None:
                record["scores"] = {str(s): finite_or_none(v) for s, v in agg.scores.items()}
            records.append(record)
        self.models = new
        return records

    @torch.no_grad()
    def accuracies(self) -> dict[int, dict[str, float]]:
        """Each honest client's local and global test accuracy (percent), as a client measures it."""
        out = {}
        for k in self.honest:
            w = self.models[self.row[k]]
            result = {}
            for key, data in (("accuracy", self.data[k].local_test), ("global_accuracy", self.data[k].global_test)):
                logits = self.model.logits(w, data.x)
                result[key] = 100.0 * float((logits.argmax(1) == data.y).float().mean())
            out[k] = result
        return out

    # -- the run -----------------------------------------------------------------------------
    def run(self, on_round: Callable[[int], None] | None = None) -> dict[str, Any]:
        sc = self.scenario
        start = time.monotonic()
        out = self.out_dir
        (out / "logs").mkdir(parents=True, exist_ok=True)
        dump_scenario(sc, out / "scenario.toml")
        logs = {k: RoundLog(out, k) for k in range(self.topology.num_clients)}
        loop_start, cpu_start = time.monotonic(), time.process_time()
        last: dict[int, dict[str, float]] = {k: {} for k in self.honest}
        try:
            for r in range(sc.rounds):
                reference = self.models.cpu().clone() if self.device.type != "cpu" else self.models.clone()
                losses = dict(zip(self.honest, self.local_steps(), strict=True))
                refused = self.refused_rows()
                silent_before = dict(self.silent)
                byz, heard = self.byzantine_messages(losses, refused)
                records = self.aggregate(r, reference, losses, byz, refused)
                every = sc.eval.every
                if r == sc.rounds - 1 or (every and (r + 1) % every == 0):
                    last = self.accuracies()
                    for k, rec in zip(self.honest, records, strict=True):
                        rec.update(last[k])
                for k, rec in zip(self.honest, records, strict=True):
                    logs[k].write(rec)
                for b in self.byzantine:
                    logs[b].write({
                        "round": r, "train_loss": None, "weights": {}, "bytes_sent": 0, "bytes_received": 0,
                        "received_from": heard[b], "silent_to": self.silent[b] - silent_before[b],
                    })
                if on_round is not None:
                    on_round(r)
        finally:
            for f in logs.values():
                f.close()
        loop = {"loop_seconds": round(time.monotonic() - loop_start, 3), "loop_cpu_seconds": round(time.process_time() - cpu_start, 3)}
        wall = round(time.monotonic() - start, 3)
        for k in range(self.topology.num_clients):
            write_json_atomic(out / "peers" / f"{k}.json", self._final(k, last.get(k, {}), loop, wall))
        return collect_summary(
            out, sc, pids=dict.fromkeys(range(self.topology.num_clients), os.getpid()), exit_codes=dict.fromkeys(range(self.topology.num_clients), 0),
            wall_seconds=time.monotonic() - start,
            extra={"interrupted": False, "launcher_pid": os.getpid(), "transport": "none", "engine": "batched", "device": str(self.device)},
        )

    def _final(self, k: int, last: dict[str, float], loop: dict[str, float], wall: float) -> dict[str, Any]:
        sc = self.scenario
        if k in self.row:
            cfg = sc.aggregation_for(k)
            final: dict[str, Any] = {
                **last, **loop, "num_samples": self.num_samples[k], "aux_samples": len(self.data[k].aux.y),
                "local_test_samples": len(self.data[k].local_test.y),
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
            stale_messages=0, unsent_messages={"dropped": 0, "stale": 0}, refused_calls_by_reason={}, tls="n/a (batched engine)",
            restarts=0, rounds_lost=0, resumed_from=[], engine="batched",
        )
        return final


def run_batched(scenario: Scenario, out_dir: Path, *, console: Console) -> dict[str, Any]:
    """Run ``scenario`` in the batched engine, with a progress bar; returns the summary."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from dfedrw.launch.preflight import preflight

    preflight(scenario)
    run = BatchedRun(scenario, out_dir, console=console)
    label = f"batched engine, {len(run.honest)} + {len(run.byzantine)} clients on {run.device}"
    if not console.is_terminal:
        every = max(1, scenario.rounds // 10)
        console.print(label)
        return run.run(lambda r: (r + 1) % every == 0 and console.print(f"round {r + 1}/{scenario.rounds}"))
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task("rounds", total=scenario.rounds)
        return run.run(lambda r: bar.update(task, completed=r + 1))
