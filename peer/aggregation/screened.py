"""DFedReweighting behind a distance stage: the candidates Krum's score lets through are then
scored by the TPM and weighed by the CRS (conventions: :mod:`peer.aggregation.baselines`).

The two stages catch different attackers. A loss on the client's auxiliary data cannot tell a
model far from every honest one but good on those rows (the dissensus attack pushes each
receiver's own model away from the others) from an honest neighbour; the distance stage can.
Distances cannot tell a model inside the honest spread that does badly on the data (a
label-flipped one near the mean) from an honest one; the loss can.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

from dfedrw.peer.checked import Checked
from dfedrw.peer.registry import check_int
from dfedrw.peer.aggregation.candidates import FiniteCandidates, finite_by_id, keep_own
from dfedrw.peer.aggregation.distance import krum_scores
from dfedrw.peer.aggregation.rules import RULE_REGISTRY, Aggregate, DFedReweighting, RoundInputs


@RULE_REGISTRY.register("screened_reweighting")
@dataclass(frozen=True)
class ScreenedReweighting(Checked):
    """DFedReweighting behind Krum's screen: drop the ``f`` furthest neighbours, then score.

    ``f = num_byzantine``; ``C`` the finite candidates, ``d_ij`` their squared distances. Krum's
    score ``s_i = sum_j d_ij`` over the ``C - f - 2`` (at least 1) candidates nearest to ``w_i``;
    the ``f`` neighbours of highest score are dropped (never the own model; ties: the higher id
    goes); the TPM scores the rest and the CRS weighs them, as
    :class:`~dfedrw.peer.aggregation.rules.DFedReweighting` does; screened candidates weigh 0 and
    get no score (NaN). Told ``f = 0``, or with two finite candidates or fewer (each one's score
    would be their one distance), nothing is screened. Non-finite rows are never scored and take
    no part in the distances; for a non-finite own model the first finite candidate by id stands in.

    With the CRS ``loss_drop_highest`` (the setting docs/robustness.md measures) an attacker is
    kept only if it is neither among the ``f`` furthest nor among the ``f`` worst on the client's
    auxiliary data (why both: see the module).

    Sources: Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient
    Descent", NeurIPS 2017 (Krum's score; Multi-Krum keeps ``C - f``); El Mhamdi, Guerraoui and
    Rouault, "The Hidden Vulnerability of Distributed Learning in Byzantium", ICML 2018 (Bulyan: a
    distance selection, then a second robust step); the scoring stage is the paper's
    DFedReweighting. Measured against every attack of docs/robustness.md's table ("Two stages").
    """

    tpm: object
    crs: object
    num_byzantine: int = 0

    # A defence-aware attack plays this rule whole: its TPM and CRS alone do not decide.
    scores_decide: ClassVar[bool] = False

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        check_int("ScreenedReweighting", "num_byzantine", s.num_byzantine, minimum=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "_inner", DFedReweighting(tpm=self.tpm, crs=self.crs))

    def __call__(self, inputs: RoundInputs) -> Aggregate:
        finite = finite_by_id(inputs)
        count = len(finite.ids)
        if count == 0:
            return keep_own(inputs)
        kept = krum_kept(finite, self.num_byzantine)
        if len(kept) == len(inputs.ids):
            return self._inner(inputs)
        ids = tuple(finite.ids[i] for i in kept)
        screened = RoundInputs(
            own_id=ids[0], round=inputs.round, ids=ids, vectors=finite.rows[kept].to(inputs.vectors.dtype),
            num_samples=tuple(inputs.num_samples[finite.positions[i]] for i in kept), evaluate=inputs.evaluate,
            total_rounds=inputs.total_rounds, reference=inputs.reference, finite=(True,) * len(kept),
        )
        agg = self._inner(screened)
        return Aggregate(
            model=agg.model, weights=dict.fromkeys(inputs.ids, 0.0) | dict(agg.weights),
            scores=dict.fromkeys(inputs.ids, math.nan) | dict(agg.scores or {}),
        )


def krum_kept(finite: FiniteCandidates, f: int) -> list[int]:
    """The rows of ``finite`` Krum's screen lets through, told of ``f`` Byzantine neighbours
    (see :class:`ScreenedReweighting`), the own model (or its stand-in) first, the others in
    increasing id order."""
    count = len(finite.ids)
    own = 0 if finite.own is None else finite.own
    if f == 0 or count <= 2:
        dropped: set[int] = set()
    else:
        scores = krum_scores(finite, f)
        others = [i for i in range(count) if i != own]
        dropped = set(sorted(others, key=lambda i: (-scores[i], -finite.ids[i]))[:f])
    return [own] + [i for i in range(count) if i != own and i not in dropped]
