"""Norm bounding with weak differential privacy (Sun et al. 2019), run by each client around
its own model with the self-centred clipping step of :mod:`peer.aggregation.decentralized`
(conventions: :mod:`peer.aggregation.baselines`)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from dfedrw.peer.checked import Checked
from dfedrw.peer.registry import check_choice, check_int, check_real
from dfedrw.peer.aggregation.candidates import FiniteCandidates, combine_rows, package_for, pooled_finite
from dfedrw.peer.aggregation.decentralized import self_centred_coefficients
from dfedrw.peer.aggregation.rules import DFEDAVG_WEIGHTINGS, RULE_REGISTRY, Aggregate, DFedAvg, BatchOfOne, RoundBatch

__all__ = ["NormBound"]


def _noise_seed(seed: int, own_id: int, round_: int) -> int:
    # A digest, as Flame's, so the stream is the same on every platform and Python version and
    # each client and round draws its own, with no shared RNG state.
    digest = hashlib.blake2b(f"norm_bound/{seed}/{own_id}/{round_}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") & (2**63 - 1)


@RULE_REGISTRY.register("norm_bound")
@dataclass(frozen=True)
class NormBound(BatchOfOne, Checked):
    """Norm bounding: clip each neighbour's update to norm ``bound``, average, add small noise.

    ``w_k^{t+1} = w_k + sum_{j in N_k} v_j CLIP(w_j - w_k, M) + N(0, sigma^2 I)``,
    ``CLIP(d, M) = d * min(1, M / ||d||)``, with ``w_k`` the own half-step model (row 0),
    ``M = bound``, ``sigma = noise`` and ``v`` the weights :class:`~peer.aggregation.rules.DFedAvg`
    gives the finite candidates (own model included) under the same ``weighting``:
    ``v_i = n_i / sum n`` for ``"data_size"`` (uniform if no size is positive), ``1/C`` for
    ``"uniform"``. A bound above every distance leaves DFedAvg's average (up to float rounding).
    The noise is drawn in float32 from a ``torch.Generator`` seeded from ``(seed, own_id, round)``,
    ``seed`` the run's per-client seed: runs replay exactly, each client and round its own stream.

    This is the paper's server rule moved to a client: there the server clips each client's update
    from the global model and adds the noise to the new global model; here a client, with no global
    model, measures each neighbour from its own, as ClippedGossip's self-centred clipping does (the
    same step, with DFedAvg's weights and a fixed radius); its own local step is not clipped.

    Reported weights are the exact coefficients of the output as a combination of the candidates,
    before the noise: ``s_j v_j`` on neighbour ``j`` with ``s_j = min(1, M / ||w_j - w_k||)``, and
    ``1 - sum_j s_j v_j`` (at least ``v_k``) on the own id. A NaN/Inf row weighs 0 and is left out
    of ``v``; a non-finite own model is kept, without noise: there is no centre to clip around.

    THREAT MODEL: backdoor (targeted) poisoning. Senders are authenticated; attackers train on
    poisoned data and send boosted updates ("model replacement") so that their backdoor survives
    the averaging. Bounding the norm caps what any one neighbour moves the model by, ``v_j * M``,
    whatever it sends, and the noise masks what little of a backdoor the bounded updates carry;
    the paper finds this mitigates backdoors at a small cost in accuracy. An attacker whose update
    stays inside the bound is not stopped, and many attackers' bounded pulls add up: a bound on
    influence, not a filter. With ``weighting = "data_size"`` a sender can raise its ``v_j`` by
    declaring more data (``"uniform"`` removes that lever). ``M`` must be set against the norm of
    the honest neighbours' differences, which grows with the model's size and the learning rate.

    Source: Sun, Kairouz, Suresh and McMahan, "Can You Really Backdoor Federated Learning?",
    arXiv 1911.07963, 2019 (norm thresholding of updates; weak differential privacy).

    Written once, over a batch (:class:`BatchOfOne`): :meth:`batched` hands ``_aggregate`` each
    client's finite rows from the round's pool, checked once: 1.73x faster than a batch of one
    per client (``python bench/rules_batched.py``, this machine).
    """

    # The default fits the built-in scenario (softmax regression on digits, lr 0.05): there
    # honest neighbours' models lie at most 0.08 apart over 300 rounds, so none is clipped and
    # the rule is DFedAvg without an attack, while a Gaussian (std 30) message lies ~800 away. A
    # larger model needs its own bound (see the threat model above).
    bound: float = 1.0
    noise: float = 0.0
    weighting: str = "data_size"
    seed: int = 0

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        s.bound = check_real("NormBound", "bound", s.bound, positive=True)
        s.noise = check_real("NormBound", "noise", s.noise, nonnegative=True)
        check_choice("NormBound", "weighting", s.weighting, DFEDAVG_WEIGHTINGS)
        check_int("NormBound", "seed", s.seed)

    def batch_group(self) -> tuple:
        """What :meth:`batched` needs equal across its clients: every setting but the seed, which
        each client's noise draws from (``RoundBatch.rules``)."""
        return (self.bound, self.noise, self.weighting)

    def batched(self, batch: RoundBatch) -> list[Aggregate]:
        """Every client's round as its own rule takes it in a batch of one (``batch.rules``:
        rules of one :meth:`batch_group`, each with its seed), bit for bit: the same arithmetic
        on tensors of the same shapes, the pool checked for finite rows once."""
        finite = batch.finite().tolist()
        out = []
        for c, rows in enumerate(batch.rows):
            rule = self if batch.rules is None else batch.rules[c]
            candidates = pooled_finite(batch, c, finite)
            out.append(rule._aggregate(candidates, batch.ids[c], batch.num_samples[c], batch.vectors[rows[0]], batch.round))
        return out

    def _aggregate(
        self, finite: FiniteCandidates, ids: Sequence[int], num_samples: Sequence[int], own_row: torch.Tensor, round_: int
    ) -> Aggregate:
        if finite.own is None:
            return package_for(ids, own_row.to(torch.float64), {ids[0]: 1.0})
        # DFedAvg's own unnormalised weights, so that nothing clipped gives its average.
        flags = [False] * len(ids)
        for i in finite.positions:
            flags[i] = True
        sizes = DFedAvg(self.weighting).size_weights(flags, num_samples)
        coefficients = self_centred_coefficients(finite, lambda _: self.bound, [sizes[i] for i in finite.positions])
        model = combine_rows(finite, torch.tensor(coefficients, dtype=torch.float64))
        if self.noise > 0:
            generator = torch.Generator().manual_seed(_noise_seed(self.seed, ids[0], round_))
            # Drawn in float32 (as Flame: torch's float64 draw is slower), widened exactly.
            drawn = torch.randn(model.shape[0], generator=generator, dtype=torch.float32).to(torch.float64)
            model = model + self.noise * drawn.to(model.device)
        return package_for(ids, model, dict(zip(finite.ids, coefficients, strict=True)))
