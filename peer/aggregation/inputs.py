"""What a rule is given and returns, for one client (:class:`RoundInputs`, :class:`Aggregate`) or
many at once (:class:`RoundBatch`), and the weighted sums every rule ends with (non-finite rows
left out, float64, column blocks for big models). Conventions: :mod:`peer.aggregation.rules`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from dfedrw.peer.aggregation.columns import column_blocks, in_blocks, weighted_rows
from dfedrw.peer.registry import check_int


@dataclass(frozen=True)
class RoundInputs:
    """What a client hands its aggregation rule in round ``round``.

    ``vectors[i]`` is the flattened model sent by ``ids[i]``; ``ids[0] == own_id`` is the client's
    own model. ``num_samples[i]``: the training-set size ``ids[i]`` declared (0 if unknown).
    ``evaluate(candidates) -> {"accuracy": [C], "loss": [C]}`` scores candidates on the client's
    auxiliary data. Sequences are normalised to tuples; inconsistent inputs raise ``ValueError``.
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
    # Under asynchronous gossip: how many of the client's local steps ago each candidate arrived
    # (0 for its own model and one that came during this step), for :func:`staleness_factors`;
    # None: the round protocol, where every candidate is of this round.
    staleness: tuple[int, ...] | None = None
    # Per row, the scores its sender reported it measured (``network.share_scores``: id -> score),
    # or None where it sent none (the own model, a sender that shares none); None: no reports.
    reports: tuple[Mapping[int, float] | None, ...] | None = None
    # What the client's rule kept of its last aggregation (``Aggregate.memory``: id -> value),
    # handed back by the engine; None: nothing kept (its first round, or a rule that keeps none).
    memory: Mapping[int, float] | None = None

    def finite_list(self) -> list[bool]:
        """Per row of ``vectors``: whether every value is finite."""
        return finite_rows(self.vectors).tolist() if self.finite is None else list(self.finite)

    def __post_init__(self) -> None:
        own_id = check_int("RoundInputs", "own_id", self.own_id)
        check_int("RoundInputs", "round", self.round, minimum=0)
        ids = _ints("ids", self.ids)
        if not ids or ids[0] != own_id:
            raise ValueError(f"RoundInputs: ids[0] must be own_id {own_id} (own model first), got ids={ids}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"RoundInputs: ids must be distinct, got {ids}")
        vectors = self.vectors
        if not isinstance(vectors, torch.Tensor) or vectors.dim() != 2:
            shape = tuple(vectors.shape) if isinstance(vectors, torch.Tensor) else type(vectors)
            raise ValueError(f"RoundInputs: vectors must be a 2-D tensor [C, D], got {shape}")
        if not vectors.is_floating_point():
            raise ValueError(f"RoundInputs: vectors must be floating point, got {vectors.dtype}")
        if vectors.shape[0] != len(ids):
            raise ValueError(f"RoundInputs: vectors has {vectors.shape[0]} rows but there are {len(ids)} ids")
        if self.evaluate is not None and not callable(self.evaluate):
            raise ValueError(f"RoundInputs: evaluate must be callable or None, got {self.evaluate!r}")
        check_int("RoundInputs", "total_rounds", self.total_rounds, minimum=0)
        if self.reference is not None and (not isinstance(self.reference, torch.Tensor) or tuple(self.reference.shape) != (vectors.shape[1],)):
            raise ValueError(f"RoundInputs: reference must be a [D] tensor with D = {vectors.shape[1]}")
        # One entry per id in each of these (None: not given, where that is allowed).
        per_id = {
            "num_samples": _ints("num_samples", self.num_samples, minimum=0),
            "declared_losses": None if self.declared_losses is None else tuple(float(x) for x in self.declared_losses),
            "finite": None if self.finite is None else tuple(bool(x) for x in self.finite),
            "staleness": None if self.staleness is None else _ints("staleness", self.staleness, minimum=0),
            "reports": None if self.reports is None else tuple(self.reports),
        }
        for name, values in per_id.items():
            if values is not None and len(values) != len(ids):
                raise ValueError(f"RoundInputs: {name} has {len(values)} entries but there are {len(ids)} ids")
            object.__setattr__(self, name, values)
        if self.reports is not None and not all(r is None or isinstance(r, Mapping) for r in self.reports):
            raise ValueError(f"RoundInputs: reports must be a mapping or None per id ({len(ids)}), got {self.reports!r}")
        if self.memory is not None and not isinstance(self.memory, Mapping):
            raise ValueError(f"RoundInputs: memory must be a mapping or None, got {self.memory!r}")
        object.__setattr__(self, "ids", ids)


def _ints(name: str, values: Any, minimum: int | None = None) -> tuple[int, ...]:
    """``values`` (ints, each >= ``minimum``) as a tuple; else an error naming field ``name``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"RoundInputs: {name} must be a sequence of ints, got {values!r}")
    return tuple(check_int("RoundInputs", f"{name}[]", v, minimum=minimum) for v in values)


@dataclass(frozen=True)
class Aggregate:
    """A rule's result: the new model, the weight and TPM score per sender id, and what the rule
    keeps for the client's next aggregation (``memory``: id -> value, handed back as
    ``RoundInputs.memory`` by every engine, kept in the client's checkpoint; None: nothing)."""

    model: torch.Tensor
    weights: dict[int, float]
    scores: dict[int, float] | None = None
    memory: dict[int, float] | None = None


EvaluateMany = Callable[[torch.Tensor, Sequence[Callable[[torch.Tensor], Mapping[str, torch.Tensor]]], Sequence[Sequence[int]]], list[Mapping[str, torch.Tensor]]]
"""``evaluate_many(vectors [R, D], owners, rows) -> [metrics of owner i's candidates]``: each
owner given by its ``evaluate`` (an entry of :attr:`RoundBatch.evaluate`). One that takes a
keyword ``metrics`` (a tuple of keys) may be asked for those metrics only, and then returns
mappings of those keys."""


@runtime_checkable
class Rule(Protocol):
    """Anything mapping :class:`RoundInputs` to an :class:`Aggregate`.

    A rule may also offer ``batched(batch: RoundBatch) -> list[Aggregate]``, the same round of
    many clients at once (the batched engine calls it for the clients sharing the rule, else the
    rule per client), giving each client what ``rule(batch.one(c))`` gives, up to float rounding."""

    def __call__(self, inputs: RoundInputs) -> Aggregate: ...


@dataclass(frozen=True)
class RoundBatch:
    """Round ``round`` of several clients at once, their candidates pooled.

    ``vectors [R, D]`` holds every candidate model of the round once (each client's own model, each
    message a client received); client ``c``'s candidates are the rows ``rows[c]``, sent by
    ``ids[c]`` (own first), who declared ``num_samples[c]`` and ``declared_losses[c]``;
    ``evaluate[c]``, ``references[c]``: as in :class:`RoundInputs`, which :meth:`one` builds.

    ``evaluate_many`` (:data:`EvaluateMany`), when given, scores many clients' candidates at once
    (``owners[i]``'s pooled rows ``rows[i]`` on that client's auxiliary data, one mapping per
    owner); a rule's batched path may use it in place of one ``evaluate`` call per client.
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
    # Each client's own rule, when rules differing only in what ``batch_group`` leaves out
    # (Flame's per-client seed) share one ``batched`` call; None: the called rule is everyone's.
    rules: tuple[Any, ...] | None = None
    # These three: per client, RoundInputs' field of that name (staleness: asynchronous gossip).
    staleness: tuple[tuple[int, ...], ...] | None = None
    reports: tuple[tuple[Mapping[int, float] | None, ...], ...] | None = None
    memory: tuple[Mapping[int, float] | None, ...] | None = None

    @classmethod
    def of(cls, inputs: RoundInputs) -> RoundBatch:
        """One client's round (``inputs``) as a batch of one, its candidates the pool: what
        :class:`BatchOfOne` hands a rule's :meth:`batched` path."""

        def one(value):
            return None if value is None else (value,)

        return cls(
            round=inputs.round, vectors=inputs.vectors, rows=(tuple(range(len(inputs.ids))),), ids=(inputs.ids,), num_samples=(inputs.num_samples,),
            declared_losses=one(inputs.declared_losses), evaluate=(inputs.evaluate,), references=None if inputs.reference is None else inputs.reference[None],
            total_rounds=inputs.total_rounds, finite_pool=None if inputs.finite is None else torch.tensor(inputs.finite, dtype=torch.bool),
            staleness=one(inputs.staleness), reports=one(inputs.reports), memory=(inputs.memory,),
        )

    def finite(self) -> torch.Tensor:
        """Boolean CPU mask [R] of the finite pooled rows: the caller's (one check of the pool for
        all of a round's rules), or :func:`finite_rows` of ``vectors``."""
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
            staleness=None if self.staleness is None else self.staleness[c],
            reports=None if self.reports is None else self.reports[c],
            memory=None if self.memory is None else self.memory[c],
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
            staleness=pick(self.staleness), reports=pick(self.reports), memory=pick(self.memory),
        )

    def combine(self, weights: Sequence[torch.Tensor | Sequence[float]]) -> torch.Tensor:
        """Every client's ``sum_i v_i w_i`` at once: ``weights[c]`` (float64 [len(rows[c])], or
        Python floats) weighs client ``c``'s candidate rows. As :func:`weighted_sum`: in float64,
        rows with weight 0 left out (so a NaN row of one client cannot reach another's sum);
        float32 [C, D]. One product for all clients: dense while the weight matrix is small,
        sparse beyond (thousands of clients, each with a few candidates). In a batch of runs each
        run gets the product it has alone: a product's summation order depends on its shape, and
        a run's models must not depend on the runs beside it."""
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
        # Dense only without a NaN/Inf row: there a 0 weight would still give 0 * NaN = NaN. (The
        # intake's finite_pool where given: a finite float32 row stays finite in float64.)
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


class BatchOfOne:
    """A rule written once, over a batch (its ``batched``): one client's round is a batch of
    one (:meth:`RoundBatch.of`), so a client process and the batched engine run one arithmetic."""

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        return self.batched(RoundBatch.of(inputs))[0]


_DENSE_COMBINE = 1 << 16  # entries of the [clients, rows] weight matrix below which it is dense


def staleness_factors(staleness: Sequence[int] | None, exponent: float) -> list[float] | None:
    """``(1 + s)^-exponent`` per candidate, ``s`` its staleness in the receiver's local steps: the
    polynomial staleness weighting of asynchronous training (Xie et al. 2019, FedAsync's
    ``s(t - tau)``); None with no staleness known or exponent 0."""
    if staleness is None or not exponent:
        return None
    return [(1.0 + s) ** -exponent for s in staleness]


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

    Zero-weight rows are dropped *before* multiplying, so a NaN row cannot poison the sum; a big
    model's float64 rows are made a block of coordinates at a time (:mod:`.columns`)."""
    weights = weights.to(dtype=torch.float64, device="cpu")
    used = weights > 0
    if in_blocks(vectors.shape[1]):
        index = None if bool(used.all()) else used.nonzero().squeeze(1).to(vectors.device)
        return weighted_rows(weights[used].to(vectors.device), vectors, index)
    rows = vectors[used.to(vectors.device)].to(torch.float64)
    return (weights[used].to(vectors.device) @ rows).to(torch.float32)
