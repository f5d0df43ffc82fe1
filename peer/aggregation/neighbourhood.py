"""DFedReweighting behind a check of what the neighbours measured: the ``f`` neighbours whose
absence, with the scores they reported, leaves the most consistent rest are left out, the others
are scored and weighed (conventions: :mod:`peer.aggregation.baselines`).

A client alone judges each neighbour on its own few classes: an attacker near the honest centre
can score better there than an honest neighbour whose classes differ. Its neighbours scored the
same senders on theirs (``network.share_scores`` sends each client's scores with its next
model): an attacker bad on any honest neighbour's classes is seen there, and a neighbour that
frames honest senders makes the rest inconsistent while it is kept.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

import torch

from dfedrw.peer.aggregation.candidates import finite_by_id, keep_own
from dfedrw.peer.aggregation.rules import RULE_REGISTRY, Aggregate, DFedReweighting, RoundInputs
from dfedrw.peer.aggregation.screened import krum_kept
from dfedrw.peer.checked import Checked, check_choice, check_real
from dfedrw.peer.registry import check_int

SCREENS = ("none", "krum")


def relative(values: Sequence[float]) -> list[float]:
    """Each value over the median of ``values`` (the upper one of an even count), so that clients
    whose data differ speak one scale; the values as they are where that median is not positive."""
    middle = sorted(values)[len(values) // 2]
    return [x / middle if middle > 0 else x for x in values]


def consistent(own: Mapping[int, float], reports: Mapping[int, Mapping[int, float]], f: int) -> set[int]:
    """The candidates of ``own`` (id -> the client's relative loss of it) to keep, given what the
    neighbours ``reports`` (reporter -> candidate -> its relative loss): of every way to leave
    ``f`` of them out, their reports with them, the one whose worst kept candidate (by the
    highest of its own value and the kept reporters' values of it) is best. Ties: the higher
    sum of what everyone says of those left out (a witness's report left out with it, or the
    candidate it accuses: the accused goes), then the lower sum of the values kept, then the
    lower ids left out. ``C(len(own), f)`` ways are tried."""
    best = None
    # What the client and every reporter say of each candidate: its highest value.
    accused = {j: max([own[j]] + [rep[j] for rep in reports.values() if j in rep]) for j in own}
    for out in itertools.combinations(sorted(own), min(f, len(own))):
        values = [max([own[j]] + [rep[j] for i, rep in reports.items() if i not in out and j in rep]) for j in own if j not in out]
        key = (max(values, default=0.0), -math.fsum(accused[j] for j in out), math.fsum(values), out)
        if best is None or key < best:
            best = key
    return set(own) - set(best[-1])


def remembered(past: Mapping[int, float] | None, kept: set[int], judged: Sequence[int], decay: float) -> tuple[set[int], dict[int, float]]:
    """Reputation kept over rounds: each neighbour's rate of being left out, decayed. ``past``:
    the rates of the last aggregation (id -> rate in [0, 1]; None: none yet); ``judged``: the
    neighbours judged this round, of which this round's decision keeps ``kept``. Each judged
    neighbour's rate becomes ``decay * past + (1 - decay) * [left out this round]`` (a
    neighbour not judged this round keeps its rate); as many neighbours as this round's
    decision leaves out are left out, those of the highest rate (ties: one this round's
    decision left out first, then the lower id). Returns the neighbours kept and the rates."""
    past = past or {}
    out_now = [j for j in judged if j not in kept]
    rates = dict(past)
    for j in judged:
        rates[j] = decay * float(past.get(j, 0.0)) + (1.0 - decay) * (1.0 if j in out_now else 0.0)
    out = sorted(judged, key=lambda j: (-rates[j], j in kept, j))[: len(out_now)]
    return set(judged) - set(out), rates


@RULE_REGISTRY.register("neighbourhood_reweighting")
@dataclass(frozen=True)
class NeighbourhoodReweighting(Checked):
    """DFedReweighting behind what the neighbours measured: leave out the ``f`` neighbours whose
    absence leaves the most consistent rest, then score and weigh the others.

    ``f = num_byzantine``. The client divides each finite candidate's loss on its auxiliary data by
    their median (:func:`relative`). Each neighbour ``i`` that sent scores with its model
    (``RoundInputs.reports``: its losses of its own candidates at its aggregation before, as this
    rule reports them) speaks on that scale once divided by their median; of those, the values it
    gave the client's other neighbours count (never its own, nor the client's own model's).
    :func:`consistent` leaves out the ``f`` neighbours, and their reports with them, that make the
    worst evidence of the rest lowest (a candidate's evidence: the highest of the client's value and
    the kept reporters'); the own model always stays. The kept candidates are scored by the TPM and
    weighed by the CRS as :class:`~dfedrw.peer.aggregation.rules.DFedReweighting` does, the CRS told
    of no Byzantine neighbour (a CRS that drops the ``b`` worst, as ``loss_drop_highest``, drops
    none: the ``f`` went here); those left out weigh 0. Told ``f = 0`` it leaves out no one; without
    reports, what the client's own values say. With ``memory = m > 0`` the decision is remembered
    (:func:`remembered`: each neighbour's left-out rate, decayed by ``m`` a round; as many left out,
    those of the highest rate): a neighbour the decision leaves out in most rounds is left out in
    all, unless another is left out more often. A defence-aware attack that plays the rule whole
    plays it without the client's rates. The rates go to the next round in ``Aggregate.memory``
    (every engine hands them back, a client's checkpoint keeps them). At ``m <= 0.5`` nothing
    changes. Measured at ``m = 0.9`` it does harm on Dirichlet(0.1) shards, most against on-off
    attackers: the neighbours a client leaves out most often are honest ones whose classes are not
    its own, and the highest rates name them (docs/robustness.md, "Reputation over rounds: what
    memory gave"); 0, the default, keeps nothing. With ``screen = "krum"`` Krum's screen first drops
    the ``f`` neighbours of highest Krum score, their reports with them
    (:func:`~dfedrw.peer.aggregation.screened.krum_kept`), and the consistency leaves out ``f`` of
    the rest: the screen catches models far from the others that do well on the data (IPM,
    dissensus), the witnesses what the client's classes miss.

    Its round's scores (what ``network.share_scores`` sends on) are the losses it measured, of
    every finite candidate (NaN for the others), not the TPM's: every honest client must run this
    rule for the reports to be losses. A neighbour that frames every honest sender makes the rest
    inconsistent and goes. One that reports nothing leaves the decision to the client and the
    honest witnesses: a model no honest client's data shows bad (the colluding twins, a model far
    from the others that does well on the data) is kept; Krum's screen (``screen``) catches some.
    One whose model passes and that frames one honest neighbour (``attack.scores = "frame_one"``)
    forces "that neighbour or me", and the tie goes to the one accused: the lie that pays most
    against this rule (docs/robustness.md, "Trust from the neighbourhood: the rule").

    Sources: the consistency of cross-evaluations as trust (TrustGraph-DFL, Murmura's evidential
    trust), and a choice of the ``f`` left out by the best subset of the rest as in Krum
    (Blanchard et al., NeurIPS 2017); the decision rule is this project's, measured by
    ``bench/neighbourhood_probe.py``.
    """

    tpm: object
    crs: object
    num_byzantine: int = 0
    # "krum": Krum's screen first, as screened_reweighting's (see above); "none": no screen.
    screen: str = "none"
    # The past's weight in each neighbour's left-out rate (:func:`remembered`), in [0, 1); 0: none.
    memory: float = 0.0

    # A defence-aware attack plays this rule whole: its TPM and CRS alone do not decide.
    scores_decide: ClassVar[bool] = False

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        check_int("NeighbourhoodReweighting", "num_byzantine", s.num_byzantine, minimum=0)
        check_choice("NeighbourhoodReweighting", "screen", s.screen, SCREENS)
        if not 0.0 <= check_real("NeighbourhoodReweighting", "memory", s.memory) < 1.0:
            raise ValueError(f"NeighbourhoodReweighting: memory must be in [0, 1), got {s.memory!r}")

    def __post_init__(self) -> None:
        super().__post_init__()
        # The f it is told of are left out here: the CRS weighs the rest told of none.
        crs = dataclasses.replace(self.crs, num_byzantine=0) if getattr(self.crs, "num_byzantine", 0) else self.crs
        object.__setattr__(self, "_inner", DFedReweighting(tpm=self.tpm, crs=crs))

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        if inputs.evaluate is None:
            raise ValueError("NeighbourhoodReweighting: inputs.evaluate is None; this rule measures candidates on the client's auxiliary data")
        # Krum's screen measures distances in float64; without it the rows stay as they came.
        finite = finite_by_id(inputs, torch.float64 if self.screen == "krum" else inputs.vectors.dtype)
        if not finite.ids:
            return keep_own(inputs)
        vectors = finite.rows.to(inputs.vectors.dtype)
        metrics = {key: torch.as_tensor(value, dtype=torch.float64).cpu() for key, value in inputs.evaluate(vectors).items()}
        loss = metrics["loss"].tolist()
        own = 0 if finite.own is None else finite.own
        mine = relative(loss)
        passed = set(krum_kept(finite, self.num_byzantine)) if self.screen == "krum" else set(range(len(finite.ids)))
        neighbours = {j: mine[p] for p, j in enumerate(finite.ids) if p != own and p in passed}
        kept = consistent(neighbours, self._reports(inputs, neighbours), self.num_byzantine)
        rates = None
        if self.memory:
            judged = [j for p, j in enumerate(finite.ids) if p != own]
            kept, rates = remembered(inputs.memory, kept, judged, self.memory)
        rows = [own] + [p for p, j in enumerate(finite.ids) if j in kept]
        chosen = RoundInputs(
            own_id=finite.ids[own], round=inputs.round, ids=tuple(finite.ids[p] for p in rows), vectors=vectors[rows],
            num_samples=tuple(inputs.num_samples[finite.positions[p]] for p in rows),
            evaluate=lambda _: {key: value[rows] for key, value in metrics.items()}, total_rounds=inputs.total_rounds,
            reference=inputs.reference, finite=(True,) * len(rows),
            staleness=None if inputs.staleness is None else tuple(inputs.staleness[finite.positions[p]] for p in rows),
        )
        agg = self._inner(chosen)
        return Aggregate(
            model=agg.model, weights=dict.fromkeys(inputs.ids, 0.0) | dict(agg.weights),
            scores=dict.fromkeys(inputs.ids, math.nan) | dict(zip(finite.ids, loss, strict=True)), memory=rates,
        )

    @staticmethod
    def _reports(inputs: RoundInputs, neighbours: Mapping[int, float]) -> dict[int, dict[int, float]]:
        """What each neighbour reported of the client's other neighbours, on the relative scale
        of its own report (its values that are not finite left out)."""
        out: dict[int, dict[int, float]] = {}
        for i, report in zip(inputs.ids, inputs.reports or (), strict=False):
            values = {j: v for j, v in (report or {}).items() if math.isfinite(v)}
            if i not in neighbours or not values:
                continue
            scaled = dict(zip(values, relative(list(values.values())), strict=True))
            out[i] = {j: v for j, v in scaled.items() if j in neighbours and j != i}
        return out
