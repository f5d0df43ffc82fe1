"""Aggregation rules: one client's candidate models of round t -> its next model.

A rule is the whole of a client's aggregation step::

    aggregate = rule(inputs)     # RoundInputs -> Aggregate(model, weights, scores)

``inputs.vectors`` holds the client's own half-step model ``w_k^{t+1/2}`` in row 0 and each
received neighbour model in the following rows; the rule returns
``w_k^{t+1} = sum_i v_i w_i^{t+1/2}`` and the weight ``v_i`` it gave each sender, which the
client logs. Rules are pure tensor code: no transport, no model, no data; whatever needs the
client's data comes in through ``inputs.evaluate``.

Shared conventions (both rules here):

* A row containing NaN/Inf never gets weight and is left out of the weighted sum before the
  sum is taken (``0 * NaN`` is NaN, so zero weight alone would not protect the result).
* If no candidate can be weighted the client keeps its own model (weight 1 on ``ids[0]``).
  Should the own row itself be non-finite, it is still returned: replacing it would need a
  model this module does not have, and the client is the one to decide what to do.
* The sum is taken in float64 and cast to float32; weights sum to 1 and are reported for
  every candidate id; the output does not depend on the order of rows 1.. .
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from dfedrw.peer.aggregation.columns import column_blocks, in_blocks, weighted_rows
from dfedrw.peer.aggregation.crs import CRS, ReweightingStrategy, make_crs
from dfedrw.peer.registry import Registry, check_choice, check_int
from dfedrw.peer.aggregation.tpm import TPM, make_tpm

__all__ = [
    "RULE_REGISTRY",
    "Aggregate",
    "DFedAvg",
    "DFedReweighting",
    "RoundBatch",
    "RoundInputs",
    "Rule",
    "build_rule",
    "finite_rows",
    "weighted_sum",
]


# Every rule registers itself with its decorator in its module of this package (the baselines in
# coordinate.py, distance.py, flame.py, robust.py and qfdfl.py, the decentralized ones in
# gossip.py, which build on the types below); the registry imports every module of the package
# on first use, so it is complete whenever it is read. ``modules`` only orders the listing.
RULE_REGISTRY = Registry(
    "rule", "dfedrw.rules", package=__package__, calls={"__call__": ("inputs",)},
    modules=tuple(f"{__package__}.{m}" for m in ("rules", "coordinate", "distance", "flame", "robust", "qfdfl", "gossip")),
)
"""The aggregation rules by name; settings in a scenario's ``[aggregation.NAME]``."""


@dataclass(frozen=True)
class RoundInputs:
    """What a client hands its aggregation rule in round ``round``.

    ``vectors[i]`` is the flattened model sent by ``ids[i]``; ``ids[0] == own_id`` is the
    client's own model. ``num_samples[i]`` is the training-set size sender ``ids[i]``
    declared (0 if unknown). ``evaluate(candidates) -> {"accuracy": [C], "loss": [C]}`` runs
    candidates on the client's auxiliary data (needed by DFedReweighting only).
    Sequences are normalised to tuples; inconsistent inputs raise ``ValueError``.
    """

    own_id: int
    round: int
    ids: tuple[int, ...]
    vectors: torch.Tensor
    num_samples: tuple[int, ...]
    evaluate: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None = None
    # Scheduled number of rounds T (BALANCE's acceptance radius decays with t/T); 0 if unknown.
    total_rounds: int = 0
    # Training loss each sender declared for its model (q-FFL weights by it); NaN if unknown.
    declared_losses: tuple[float, ...] | None = None
    # The client's model at the start of the round, w_k^t (before its local step): rules that
    # work on updates (Flame, q-FFL) measure them against it. None if unknown.
    reference: torch.Tensor | None = None
    # Which rows of ``vectors`` are finite, when the caller has checked (the batched engine
    # checks a round's pool once); None: a rule that needs it checks (:meth:`finite_list`).
    finite: tuple[bool, ...] | None = None

    def finite_list(self) -> list[bool]:
        """Per row of ``vectors``: whether every value is finite."""
        return finite_rows(self.vectors).tolist() if self.finite is None else list(self.finite)

    def __post_init__(self) -> None:
        own_id = check_int("RoundInputs", "own_id", self.own_id)
        check_int("RoundInputs", "round", self.round, minimum=0)
        if isinstance(self.ids, (str, bytes)) or not isinstance(self.ids, Sequence):
            raise ValueError(f"RoundInputs: ids must be a sequence of ints, got {self.ids!r}")
        ids = tuple(check_int("RoundInputs", "ids[]", i) for i in self.ids)
        if not ids or ids[0] != own_id:
            raise ValueError(
                f"RoundInputs: ids[0] must be own_id {own_id} (own model first), got ids={ids}"
            )
        if len(set(ids)) != len(ids):
            raise ValueError(f"RoundInputs: ids must be distinct, got {ids}")
        vectors = self.vectors
        if not isinstance(vectors, torch.Tensor) or vectors.dim() != 2:
            shape = tuple(vectors.shape) if isinstance(vectors, torch.Tensor) else type(vectors)
            raise ValueError(f"RoundInputs: vectors must be a 2-D tensor [C, D], got {shape}")
        if not vectors.is_floating_point():
            raise ValueError(f"RoundInputs: vectors must be floating point, got {vectors.dtype}")
        if vectors.shape[0] != len(ids):
            raise ValueError(
                f"RoundInputs: vectors has {vectors.shape[0]} rows but there are {len(ids)} ids"
            )
        if isinstance(self.num_samples, (str, bytes)) or not isinstance(
            self.num_samples, Sequence
        ):
            raise ValueError(
                f"RoundInputs: num_samples must be a sequence of ints, got {self.num_samples!r}"
            )
        num_samples = tuple(
            check_int("RoundInputs", "num_samples[]", n, minimum=0) for n in self.num_samples
        )
        if len(num_samples) != len(ids):
            raise ValueError(
                f"RoundInputs: num_samples has {len(num_samples)} entries but there are "
                f"{len(ids)} ids"
            )
        if self.evaluate is not None and not callable(self.evaluate):
            raise ValueError(
                f"RoundInputs: evaluate must be callable or None, got {self.evaluate!r}"
            )
        check_int("RoundInputs", "total_rounds", self.total_rounds, minimum=0)
        if self.reference is not None and (
            not isinstance(self.reference, torch.Tensor) or tuple(self.reference.shape) != (vectors.shape[1],)
        ):
            raise ValueError(f"RoundInputs: reference must be a [D] tensor with D = {vectors.shape[1]}")
        if self.declared_losses is not None:
            losses = tuple(float(x) for x in self.declared_losses)
            if len(losses) != len(ids):
                raise ValueError(
                    f"RoundInputs: declared_losses has {len(losses)} entries but there are {len(ids)} ids"
                )
            object.__setattr__(self, "declared_losses", losses)
        if self.finite is not None:
            finite = tuple(bool(x) for x in self.finite)
            if len(finite) != len(ids):
                raise ValueError(f"RoundInputs: finite has {len(finite)} entries but there are {len(ids)} ids")
            object.__setattr__(self, "finite", finite)
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "num_samples", num_samples)


@dataclass(frozen=True)
class Aggregate:
    """A rule's result: the new model, the weight per sender id, the TPM score per sender id."""

    model: torch.Tensor
    weights: dict[int, float]
    scores: dict[int, float] | None = None


EvaluateMany = Callable[[torch.Tensor, Sequence[Callable[[torch.Tensor], Mapping[str, torch.Tensor]]], Sequence[Sequence[int]]], list[Mapping[str, torch.Tensor]]]
"""``evaluate_many(vectors [R, D], owners, rows) -> [metrics of owner i's candidates]``: each
owner given by its ``evaluate`` (an entry of :attr:`RoundBatch.evaluate`). One that takes a
keyword ``metrics`` (a tuple of keys) may be asked for those metrics only, and then returns
mappings of those keys."""


@runtime_checkable
class Rule(Protocol):
    """Anything mapping :class:`RoundInputs` to an :class:`Aggregate`.

    A rule may also offer ``batched(batch: RoundBatch) -> list[Aggregate]``: the same round
    of many clients at once (the batched engine calls it for the clients that share the rule,
    and calls the rule once per client when it has none). It must give each client what
    ``rule(batch.one(c))`` gives, up to float rounding."""

    def __call__(self, inputs: RoundInputs) -> Aggregate: ...


@dataclass(frozen=True)
class RoundBatch:
    """Round ``round`` of several clients at once, their candidates pooled.

    ``vectors [R, D]`` holds every candidate model of the round once (each client's own model,
    each message a client received); client ``c``'s candidates are the rows ``rows[c]``
    (its own first), sent by ``ids[c]`` (its own id first), who declared ``num_samples[c]``
    and ``declared_losses[c]``. ``evaluate[c]``, ``references[c]``: as in
    :class:`RoundInputs`. :meth:`one` is client ``c``'s :class:`RoundInputs`.

    ``evaluate_many(vectors, owners, rows)``, when given, scores many clients' candidates at
    once: for each ``owners[i]`` (a client's ``evaluate``) the pooled rows ``rows[i]`` on that
    client's auxiliary data, returning what that ``evaluate`` returns for
    ``vectors[list(rows[i])]``, one mapping per owner. A rule's batched path may use it in
    place of one ``evaluate`` call per client.
    """

    round: int
    vectors: torch.Tensor
    rows: tuple[tuple[int, ...], ...]
    ids: tuple[tuple[int, ...], ...]
    num_samples: tuple[tuple[int, ...], ...]
    declared_losses: tuple[tuple[float, ...], ...] | None = None
    evaluate: tuple[Callable[[torch.Tensor], dict[str, torch.Tensor]] | None, ...] | None = None
    references: torch.Tensor | None = None
    total_rounds: int = 0
    evaluate_many: EvaluateMany | None = None
    # In a batch of runs (several scenarios' clients at once), the run of each client: each
    # run's models are summed by a product of their own (see :meth:`combine`).
    runs: tuple[int, ...] | None = None
    # Which pooled rows are finite (bool CPU [R]), when the caller knows it: see :meth:`finite`.
    finite_pool: torch.Tensor | None = None
    # Each client's own rule, when rules that differ only in what their ``batch_group`` leaves
    # out (Flame's per-client seed) share one ``batched`` call; None: the called rule is every
    # client's.
    rules: tuple[Any, ...] | None = None

    def finite(self) -> torch.Tensor:
        """Boolean CPU mask [R] of the pooled rows that are finite (:func:`finite_rows` of
        ``vectors``): given by the caller, which checks the pool once for all the rules of a
        round, or computed here."""
        return finite_rows(self.vectors) if self.finite_pool is None else self.finite_pool

    def __len__(self) -> int:
        return len(self.rows)

    def one(self, c: int) -> RoundInputs:
        return RoundInputs(
            own_id=self.ids[c][0], round=self.round, ids=self.ids[c], vectors=self.vectors[list(self.rows[c])],
            num_samples=self.num_samples[c], evaluate=None if self.evaluate is None else self.evaluate[c],
            total_rounds=self.total_rounds, declared_losses=None if self.declared_losses is None else self.declared_losses[c],
            reference=None if self.references is None else self.references[c],
            finite=None if self.finite_pool is None else tuple(self.finite_pool[list(self.rows[c])].tolist()),
        )

    def select(self, clients: Sequence[int]) -> RoundBatch:
        """The same round for the clients at positions ``clients`` only (the pool is shared)."""

        def pick(values):
            return None if values is None else tuple(values[c] for c in clients)

        return RoundBatch(
            round=self.round, vectors=self.vectors, rows=pick(self.rows), ids=pick(self.ids), num_samples=pick(self.num_samples),
            declared_losses=pick(self.declared_losses), evaluate=pick(self.evaluate),
            references=None if self.references is None else self.references[list(clients)], total_rounds=self.total_rounds,
            evaluate_many=self.evaluate_many, runs=pick(self.runs), finite_pool=self.finite_pool, rules=pick(self.rules),
        )

    def combine(self, weights: Sequence[torch.Tensor | Sequence[float]]) -> torch.Tensor:
        """Every client's ``sum_i v_i w_i`` at once: ``weights[c]`` (float64 [len(rows[c])], or
        Python floats) weighs client ``c``'s candidate rows. As :func:`weighted_sum`: in float64,
        rows with weight 0 left out (so a NaN row of one client cannot reach another's sum);
        float32 [C, D]. One product for all clients: dense while the weight matrix is small,
        sparse beyond (thousands of clients, each with a few candidates).

        In a batch of runs, each run's clients get a product of their own, the one the run has
        alone: a product's summation order depends on its shape, and a run's models must not
        depend on the runs beside it."""
        if self.runs is None or len(set(self.runs)) <= 1:
            return self._combine(range(len(self.rows)), weights)
        out = torch.empty(len(self.rows), self.vectors.shape[1], dtype=torch.float32)
        by_run: dict[Any, list[int]] = {}
        for c, of in enumerate(self.runs):
            by_run.setdefault(of, []).append(c)
        for members in by_run.values():
            combined = self._combine(members, [weights[c] for c in members])
            if members[-1] - members[0] + 1 == len(members):  # a run's clients are consecutive: a slice
                out[members[0] : members[-1] + 1] = combined
            else:
                out[members] = combined
        return out

    def _combine(self, clients: Sequence[int], weights: Sequence[torch.Tensor | Sequence[float]]) -> torch.Tensor:
        """:meth:`combine` of the clients at positions ``clients`` (``weights`` in their order)."""
        rows, cols, values = [], [], []
        for c, (client, w) in enumerate(zip(clients, weights, strict=True)):
            for row, v in zip(self.rows[client], w.tolist() if isinstance(w, torch.Tensor) else w, strict=True):
                if v > 0:
                    rows.append(c)
                    cols.append(row)
                    values.append(v)
        used = sorted(set(cols))
        position = {row: i for i, row in enumerate(used)}
        places = [position[r] for r in cols]
        shape = (len(clients), len(used))
        if used and used[-1] - used[0] + 1 == len(used):  # consecutive rows (the usual case): a view, no gather
            pooled = self.vectors[used[0] : used[-1] + 1].to(device="cpu", dtype=torch.float64)
        else:
            pooled = self.vectors.index_select(0, torch.tensor(used, dtype=torch.long, device=self.vectors.device)).to(device="cpu", dtype=torch.float64)
        # Dense only without a NaN/Inf row: there a 0 weight would still give 0 * NaN = NaN.
        # (The pool's rows as the intake found them, where it says; a float32 row that is
        # finite stays so in float64.)
        finite = bool(self.finite_pool[used].all()) if self.finite_pool is not None else bool(torch.isfinite(pooled).all())
        if shape[0] * shape[1] <= _DENSE_COMBINE and finite:
            dense = [0.0] * (shape[0] * shape[1])
            for row, place, value in zip(rows, places, values, strict=True):
                dense[row * shape[1] + place] = value
            matrix = torch.tensor(dense, dtype=torch.float64).view(shape)
            return (matrix @ pooled).to(torch.float32)
        index = torch.tensor([rows, places], dtype=torch.long)
        matrix = torch.sparse_coo_tensor(index, torch.tensor(values, dtype=torch.float64), shape, check_invariants=True).coalesce()
        return torch.sparse.mm(matrix, pooled).to(torch.float32)


_DENSE_COMBINE = 1 << 16  # entries of the [clients, rows] weight matrix below which it is dense


def finite_rows(vectors: torch.Tensor) -> torch.Tensor:
    """Boolean CPU mask [C]: True where the whole row is finite (a big model's a block of
    coordinates at a time: no mask as large as the candidates)."""
    if vectors.dim() != 2 or not in_blocks(vectors.shape[1]):
        return torch.isfinite(vectors).all(dim=1).cpu()
    finite = torch.ones(len(vectors), dtype=torch.bool, device=vectors.device)
    for block in column_blocks(vectors.shape[1]):
        finite &= torch.isfinite(vectors[:, block]).all(dim=1)
    return finite.cpu()


def weighted_sum(vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum_i v_i w_i`` over the rows with ``v_i > 0``, in float64, returned as float32 [D].

    Rows with zero weight are dropped *before* multiplying so a NaN row cannot poison the sum.
    A big model's float64 rows are made a block of coordinates at a time (:mod:`.columns`).
    """
    weights = weights.to(dtype=torch.float64, device="cpu")
    used = weights > 0
    if in_blocks(vectors.shape[1]):
        index = None if bool(used.all()) else used.nonzero().squeeze(1).to(vectors.device)
        return weighted_rows(weights[used].to(vectors.device), vectors, index)
    rows = vectors[used.to(vectors.device)].to(torch.float64)
    return (weights[used].to(vectors.device) @ rows).to(torch.float32)


def _own_only(count: int) -> torch.Tensor:
    weights = torch.zeros(count, dtype=torch.float64)
    weights[0] = 1.0
    return weights


def _normalised(weights: torch.Tensor) -> torch.Tensor:
    """Weights summing to 1; all on the own model (row 0) when none is positive."""
    total = weights.sum()
    if not bool(total > 0):
        weights = _own_only(len(weights))
        total = weights.sum()
    return weights / total


def _finish(
    inputs: RoundInputs, weights: torch.Tensor, scores: torch.Tensor | None
) -> Aggregate:
    weights = _normalised(weights)
    return Aggregate(
        model=weighted_sum(inputs.vectors, weights),
        weights={sender: float(w) for sender, w in zip(inputs.ids, weights.tolist())},
        scores=None
        if scores is None
        else {sender: float(s) for sender, s in zip(inputs.ids, scores.tolist())},
    )


@RULE_REGISTRY.register("dfedreweighting")
@dataclass(frozen=True)
class DFedReweighting:
    """DFedReweighting: score every candidate with a TPM, weight the scores with a CRS.

    ``m_i = TPM(w_i, A_k)``;  ``v = CRS(m)``;  ``w_k^{t+1} = sum_i v_i w_i^{t+1/2}``

    Source: paper, Algorithm 1 and eq. (agg). Rows with NaN/Inf are never evaluated: their
    score is reported as NaN and their weight is 0, so a finite-looking score for a broken
    model cannot slip in, nor can it shift a CRS threshold such as the mean loss. If the CRS
    finds no finite score (all-zero weights) the client keeps its own model.
    """

    tpm: TPM
    crs: CRS

    def __post_init__(self) -> None:
        for name in ("tpm", "crs"):
            if not callable(getattr(self, name)):
                raise ValueError(
                    f"DFedReweighting: {name} must be callable, got {getattr(self, name)!r}"
                )

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        self._needs_evaluate(inputs.evaluate is None)
        finite = finite_rows(inputs.vectors)
        every = bool(finite.all())
        usable = inputs.vectors if every else inputs.vectors[finite.to(inputs.vectors.device)]
        scores = self._scores(finite, usable, inputs.evaluate).tolist()
        weights = self._weights(scores, None if every else finite.tolist())
        return Aggregate(
            model=weighted_sum(inputs.vectors, torch.tensor(weights, dtype=torch.float64)),
            weights=dict(zip(inputs.ids, weights, strict=True)), scores=dict(zip(inputs.ids, scores, strict=True)),
        )

    def batched(self, batch: RoundBatch) -> list[Aggregate]:
        """Every client's round at once: each one's TPM and CRS as :meth:`__call__` runs them,
        the candidates scored in one ``batch.evaluate_many`` call when the batch offers it
        (each TPM then gets those metrics from its ``evaluate``), the models summed at once."""
        self._needs_evaluate(batch.evaluate is None or any(e is None for e in batch.evaluate))
        finite = batch.finite()
        ok = finite.tolist()
        usable_rows = [tuple(i for i in rows if ok[i]) for rows in batch.rows]
        # A TPM that declares what it asks evaluate for (``evaluates``, as the built-in ones: it
        # reads nothing else of the candidates but their count) is handed a stand-in of the
        # candidates' shape, not their rows, and a scorer that can is asked for those metrics only.
        evaluates = getattr(self.tpm, "evaluates", None)
        metrics: list[Mapping[str, torch.Tensor] | None] = [None] * len(batch)
        if batch.evaluate_many is not None:
            wanted = [c for c, rows in enumerate(usable_rows) if rows]
            only = {"metrics": tuple(evaluates)} if evaluates is not None and _takes_metrics(batch.evaluate_many) else {}
            answers = batch.evaluate_many(batch.vectors, [batch.evaluate[c] for c in wanted], [usable_rows[c] for c in wanted], **only)
            for c, answer in zip(wanted, answers, strict=True):
                metrics[c] = answer
        stand_in = evaluates is not None
        # A TPM that gives its scores from the metrics as Python floats (the built-in ones) is
        # asked for them so: a client's handful of scores is not a tensor.
        score_values = getattr(self.tpm, "score_values", None) if stand_in else None
        weights, scores = [], []
        for c, rows in enumerate(batch.rows):
            kept = usable_rows[c]
            answered = metrics[c] is not None
            # Every candidate finite (the usual case): no mask to apply.
            mask = None if len(kept) == len(rows) else [ok[i] for i in rows]
            if answered and score_values is not None:
                s = score_values({key: metrics[c][key].tolist() for key in evaluates})  # the finite candidates'
                if len(s) != len(kept):
                    raise ValueError(f"DFedReweighting: TPM {self.tpm!r} gave {len(s)} scores for {len(kept)} candidates")
                if mask is not None:
                    found = iter(s)
                    s = [next(found) if m else math.nan for m in mask]
            else:
                usable = batch.vectors.new_empty(len(kept), 0) if stand_in and answered else batch.vectors[list(kept)]
                evaluate = _Answered(usable, metrics[c], batch.evaluate[c]) if answered else batch.evaluate[c]
                s = self._scores(None if mask is None else torch.tensor(mask), usable, evaluate).tolist()
            scores.append(s)
            weights.append(self._weights(s, mask))
        models = batch.combine(weights)
        return [
            Aggregate(model=models[c], weights=dict(zip(batch.ids[c], w, strict=True)), scores=dict(zip(batch.ids[c], s, strict=True)))
            for c, (w, s) in enumerate(zip(weights, scores, strict=True))
        ]

    @staticmethod
    def _needs_evaluate(missing: bool) -> None:
        if missing:
            raise ValueError(
                "DFedReweighting: inputs.evaluate is None; this rule scores candidates on the "
                "client's auxiliary data and needs an evaluate callable"
            )

    def _scores(self, finite: torch.Tensor | None, usable: torch.Tensor, evaluate: Callable) -> torch.Tensor:
        """The TPM's score of every candidate; NaN for the non-finite ones (never evaluated).
        ``usable``: the finite candidates, in order; ``finite`` None: all of them are."""
        if finite is None:
            return self._tpm_scores(usable, evaluate)
        scores = torch.full((len(finite),), float("nan"), dtype=torch.float64)
        if bool(finite.any()):
            scores[finite] = self._tpm_scores(usable, evaluate)
        return scores

    def _tpm_scores(self, usable: torch.Tensor, evaluate: Callable) -> torch.Tensor:
        """The TPM's scores of the finite candidates ``usable``: float64 CPU [len(usable)]."""
        computed = torch.as_tensor(self.tpm(usable, evaluate))
        computed = computed.detach().to(device="cpu", dtype=torch.float64)
        if computed.shape != (usable.shape[0],):
            raise ValueError(
                f"DFedReweighting: TPM {self.tpm!r} returned shape {tuple(computed.shape)}, "
                f"expected ({usable.shape[0]},)"
            )
        return computed

    def _weights(self, scores: list[float], finite: list[bool] | None) -> list[float]:
        """The CRS's weights, checked, 0 for every non-finite candidate (``finite`` None: all
        are finite), normalised (all on the own model when none is positive): Python floats.
        A CRS that gives its weights as floats (``values``, the built-in ones) is asked so."""
        count = len(scores)
        if isinstance(self.crs, ReweightingStrategy):
            weights = self.crs.values(scores)
        else:
            computed = torch.as_tensor(self.crs(torch.tensor(scores, dtype=torch.float64))).detach().to(device="cpu", dtype=torch.float64)
            if computed.shape != (count,):
                raise ValueError(
                    f"DFedReweighting: CRS {self.crs!r} returned shape {tuple(computed.shape)}, "
                    f"expected ({count},)"
                )
            weights = computed.tolist()
        if not all(math.isfinite(w) and w >= 0 for w in weights):
            raise ValueError(
                f"DFedReweighting: CRS {self.crs!r} returned invalid weights {weights}; "
                "weights must be finite and >= 0"
            )
        # The CRS contract already zeroes NaN scores; enforcing it here keeps a custom CRS
        # from ever weighting a non-finite model.
        if finite is not None:
            weights = [w if ok else 0.0 for w, ok in zip(weights, finite, strict=True)]
        total = math.fsum(weights)
        if not total > 0:
            return [1.0] + [0.0] * (count - 1)
        return [w / total for w in weights]


def _takes_metrics(evaluate_many: Callable) -> bool:
    """Whether ``evaluate_many`` takes ``metrics=`` (the keys wanted): see :data:`EvaluateMany`."""
    try:
        return "metrics" in inspect.signature(evaluate_many).parameters
    except (TypeError, ValueError):  # no signature to read
        return False


class _Answered:
    """A client's ``evaluate`` whose answer for ``candidates`` (that very tensor) is known
    already; any other tensor goes to the client's own ``evaluate``."""

    def __init__(self, candidates: torch.Tensor, metrics: Mapping[str, torch.Tensor], evaluate: Callable) -> None:
        self.candidates, self.metrics, self.evaluate = candidates, metrics, evaluate

    def __call__(self, vectors: torch.Tensor) -> Mapping[str, torch.Tensor]:
        return dict(self.metrics) if vectors is self.candidates else self.evaluate(vectors)


_DFEDAVG_WEIGHTINGS = ("data_size", "uniform")


@RULE_REGISTRY.register("dfedavg")
@dataclass(frozen=True)
class DFedAvg:
    """Decentralized FedAvg: average the candidates by declared data size, or uniformly.

    ``"data_size"``: ``v_i = n_i / sum_j n_j`` (uniform if every ``n_i`` is 0);
    ``"uniform"``: ``v_i = 1 / C``.

    Source: McMahan et al. 2017 (FedAvg) applied per client over its neighbourhood, the
    paper's DFedAvg baseline. Rows with NaN/Inf are excluded (weight 0) before normalising.
    The sizes are whatever senders declared: a Byzantine sender can inflate its own.
    """

    weighting: str = "data_size"

    def __post_init__(self) -> None:
        check_choice("DFedAvg", "weighting", self.weighting, _DFEDAVG_WEIGHTINGS)

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        weights = self._weights(inputs.finite_list(), inputs.num_samples)
        return _finish(inputs, torch.tensor(weights, dtype=torch.float64), None)

    def _weights(self, finite: Sequence[bool], num_samples: Sequence[int]) -> list[float]:
        """Unnormalised weights, 0 on non-finite rows (uniform when no size is positive).
        Python floats: sums of whole numbers are exact either way, so normalising them here
        or in float64 tensors gives the very same weights."""
        uniform = [1.0 if ok else 0.0 for ok in finite]
        if self.weighting == "uniform":
            return uniform
        sized = [float(n) if ok else 0.0 for ok, n in zip(finite, num_samples, strict=True)]
        return sized if sum(sized) > 0 else uniform

    def batched(self, batch: RoundBatch) -> list[Aggregate]:
        ok = batch.finite().tolist()
        weights = []
        for c, rows in enumerate(batch.rows):
            w = self._weights([ok[i] for i in rows], batch.num_samples[c])
            if not sum(w) > 0:  # as _normalised: all on the own model
                w = [1.0] + [0.0] * (len(rows) - 1)
            total = sum(w)
            weights.append([x / total for x in w])
        models = batch.combine(weights)
        return [Aggregate(model=models[c], weights=dict(zip(batch.ids[c], w, strict=True))) for c, w in enumerate(weights)]


def takes_tpm_and_crs(rule: str) -> bool:
    """Whether rule ``rule`` scores candidates with a TPM and a CRS (DFedReweighting): decided
    from its constructor, so a registered variant of it gets its TPM and CRS built the same way."""
    return RULE_REGISTRY.takes(rule, "tpm", "crs")


def build_rule(
    rule: str,
    tpm: str = "accuracy",
    crs: str = "softmax",
    tpm_params: Mapping[str, Any] | None = None,
    crs_params: Mapping[str, Any] | None = None,
    rule_params: Mapping[str, Any] | None = None,
) -> Rule:
    """Build a rule from names, e.g. ``build_rule("dfedreweighting", "loss", "loss_clip_mean")``.

    The TPM and CRS are built only for rules whose constructor takes ``tpm`` and ``crs``
    (DFedReweighting); giving
    ``tpm_params``/``crs_params`` to a rule that does not use them is an error rather than
    being silently ignored. ``softmax`` needs ``crs_params={"temperature": ...}``.
    """
    if takes_tpm_and_crs(rule):
        built = {"tpm": make_tpm(tpm, **dict(tpm_params or {})), "crs": make_crs(crs, **dict(crs_params or {}))}
        for key in built:
            if key in (rule_params or {}):
                raise ValueError(f"rule {rule!r}: {key!r} is set by the running system and cannot be configured")
        return RULE_REGISTRY.create(rule, **dict(rule_params or {}), **built)
    for label, params in (("tpm_params", tpm_params), ("crs_params", crs_params)):
        if params:
            raise ValueError(
                f"rule {rule!r} uses no TPM/CRS, but {label}={dict(params)!r} was given; "
                "only rules built from a TPM and a CRS (e.g. 'dfedreweighting') take them"
            )
    return RULE_REGISTRY.create(rule, **dict(rule_params or {}))
