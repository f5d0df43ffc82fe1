"""Target performance metrics (TPM): candidate models -> one score per candidate.

A TPM is step 2 of DFedReweighting (paper, section "DFedReweighting", Algorithm 1): client k
scores every candidate ``w_i`` in its candidate set on its auxiliary data ``A_k``::

    scores = tpm(candidates, evaluate)   # candidates: float32 [C, D] (row = flattened model)
                                         # scores: float64 [C] on the CPU

The TPM knows neither the model nor the data, so aggregation stays pure tensor code: the client's
``evaluate`` runs every candidate on the auxiliary set and returns
``{"accuracy": Tensor[C] (fraction in [0, 1]), "loss": Tensor[C] (mean cross-entropy)}``.

Scores are returned as computed, NaN/Inf included: what a non-finite score means (weight 0) is
the CRS contract's job (:mod:`peer.aggregation.crs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar, Protocol, runtime_checkable

import torch

from dfedrw.peer.checked import Checked
from dfedrw.peer.registry import Registry, check_real

__all__ = [
    "TPM",
    "TPM_REGISTRY",
    "Accuracy",
    "Evaluate",
    "Loss",
    "WeightedCombination",
    "make_tpm",
]

Evaluate = Callable[[torch.Tensor], Mapping[str, torch.Tensor]]
"""``evaluate(candidates [C, D]) -> {"accuracy": Tensor[C], "loss": Tensor[C]}``."""


TPM_REGISTRY = Registry("tpm", "dfedrw.tpms", calls={"__call__": ("candidates", "evaluate")})
"""The TPMs by name; settings in a scenario's ``[aggregation.tpm_params.NAME]``."""


@runtime_checkable
class TPM(Protocol):
    """Anything mapping candidates [C, D] and an evaluate callable to scores [C]."""

    def __call__(self, candidates: torch.Tensor, evaluate: Evaluate) -> torch.Tensor: ...


def _evaluate(
    candidates: torch.Tensor, evaluate: Evaluate, keys: tuple[str, ...], owner: str
) -> dict[str, torch.Tensor]:
    """Run ``evaluate`` once and return the requested metrics as float64 CPU vectors [C]."""
    if not isinstance(candidates, torch.Tensor) or candidates.dim() != 2:
        is_tensor = isinstance(candidates, torch.Tensor)
        shape = tuple(candidates.shape) if is_tensor else type(candidates)
        raise ValueError(f"{owner}: candidates must be a 2-D tensor [C, D], got {shape}")
    if not callable(evaluate):
        raise ValueError(f"{owner}: evaluate must be callable, got {evaluate!r}")
    result = evaluate(candidates)
    if not isinstance(result, Mapping):
        raise ValueError(
            f"{owner}: evaluate must return a mapping with keys {list(keys)}, "
            f"got {type(result).__name__}"
        )
    count = candidates.shape[0]
    metrics = {}
    for key in keys:
        if key not in result:
            raise ValueError(
                f"{owner}: evaluate result lacks {key!r}; it has {sorted(result)}, "
                f"needed {list(keys)}"
            )
        values = torch.as_tensor(result[key]).detach().to(device="cpu", dtype=torch.float64)
        if values.shape != (count,):
            raise ValueError(
                f"{owner}: evaluate()[{key!r}] must have shape ({count},) (one value per "
                f"candidate), got {tuple(values.shape)}"
            )
        metrics[key] = values
    return metrics


class _OneMetric(Checked):
    """A TPM that scores by the one metric in ``evaluates``, as computed (what it asks ``evaluate``
    for; of the candidates it reads only their count: see DFedReweighting.batched)."""

    evaluates: ClassVar[tuple[str, ...]] = ()

    def __call__(self, candidates: torch.Tensor, evaluate: Evaluate) -> torch.Tensor:
        (metric,) = self.evaluates
        return _evaluate(candidates, evaluate, self.evaluates, type(self).__name__)[metric]

    def score_values(self, metrics: Mapping[str, Sequence[float]]) -> list[float]:
        """The scores, as Python floats, from the metrics it asks for (one float per candidate)."""
        (metric,) = self.evaluates
        return list(metrics[metric])


@TPM_REGISTRY.register("accuracy")
@dataclass(frozen=True)
class Accuracy(_OneMetric):
    """Accuracy of each candidate on the auxiliary set.

    ``m_i = Acc(w_i, A_k)``, a fraction in [0, 1].

    Source: paper, eq. (combination-fairness-acc) and eq. (strategy2inbzt). Pair with
    ``Softmax(scale=100)`` to read the paper's temperature against percentages.
    """

    evaluates: ClassVar[tuple[str, ...]] = ("accuracy",)


@TPM_REGISTRY.register("loss")
@dataclass(frozen=True)
class Loss(_OneMetric):
    """Mean cross-entropy of each candidate on the auxiliary set.

    ``m_i = f(w_i, A_k)``

    Source: paper, eq. (combination-loss), the Byzantine-robustness pair with ``LossClippedAtMean``.
    """

    evaluates: ClassVar[tuple[str, ...]] = ("loss",)


@TPM_REGISTRY.register("combined")
@dataclass(frozen=True)
class WeightedCombination(Checked):
    """Weighted sum of accuracy and loss (multi-objective within each client).

    ``m_i = a * Acc(w_i, A_k) + b * f(w_i, A_k)``, defaults ``a = b = 1/2``.

    Source: paper, eq. (mult-within), paired with a monotonically increasing CRS ``f_e``. With the
    paper's ``b = +1/2`` a *higher* loss raises the score; a negative loss coefficient (e.g.
    ``a = 1, b = -1``) penalises loss instead. A term with coefficient 0 is left out of the score,
    so a NaN loss cannot hide a finite accuracy when ``b = 0`` (``0 * NaN`` would be NaN).
    """

    evaluates: ClassVar[tuple[str, ...]] = ("accuracy", "loss")  # as Accuracy.evaluates

    accuracy: float = 0.5
    loss: float = 0.5

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        accuracy = check_real("WeightedCombination", "accuracy", s.accuracy)
        loss = check_real("WeightedCombination", "loss", s.loss)
        if accuracy == 0.0 and loss == 0.0:
            raise ValueError(
                "WeightedCombination: accuracy and loss coefficients are both 0, "
                "so every score would be 0; set at least one nonzero"
            )
        s.accuracy = accuracy
        s.loss = loss

    def __call__(self, candidates: torch.Tensor, evaluate: Evaluate) -> torch.Tensor:
        metrics = _evaluate(candidates, evaluate, ("accuracy", "loss"), "WeightedCombination")
        score = torch.zeros(candidates.shape[0], dtype=torch.float64)
        if self.accuracy != 0.0:
            score = score + self.accuracy * metrics["accuracy"]
        if self.loss != 0.0:
            score = score + self.loss * metrics["loss"]
        return score

    def score_values(self, metrics: Mapping[str, Sequence[float]]) -> list[float]:
        """As :meth:`Accuracy.score_values`: ``__call__``'s operations in order, so its values."""
        accuracy, loss = metrics["accuracy"], metrics["loss"]
        scores = []
        for a, f in zip(accuracy, loss, strict=True):
            score = 0.0
            if self.accuracy != 0.0:
                score = score + self.accuracy * a
            if self.loss != 0.0:
                score = score + self.loss * f
            scores.append(score)
        return scores


def make_tpm(name: str, **params: object) -> TPM:
    """Build the TPM registered as ``name`` with keyword ``params`` (checked, see registry)."""
    return TPM_REGISTRY.create(name, **params)
