"""A Byzantine client's step of a round, the same in every engine: what it declares of its data
(:func:`byzantine_claims`), the view its attack is given, the messages the attack crafts in and
out of its window (:func:`craft_attack_round`, drawing from :func:`attack_generator`), the
reference it carries to its next round (:func:`next_reference`), the scores it reports as
measured (:func:`reported_scores`), and with ``attack.strike = "trusted"`` its standing in the
scores its neighbours report (:class:`Standing`). :class:`ByzantineStep` is one client's step
over its rounds; a client process holds one, the batched engine one per Byzantine client."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dfedrw.peer.aggregation.columns import mean_rows
from dfedrw.peer.attacks import AttackView, Crafted, craft_round
from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.wiring.plan import derive_seed

__all__ = [
    "ByzantineStep", "Standing", "attack_generator", "byzantine_claims", "craft_attack_round", "known_mean", "next_reference", "reported_scores",
]

# What a lying report says: a plain score, one a hundred times worse, one a hundred times better.
PLAIN, FRAMED, PRAISED = 1.0, 100.0, 0.01


class ByzantineStep:
    """Byzantine client ``attacker``'s step of each round: ``attack`` crafting from what it
    received, drawing from ``generator`` (its own, seeded by its id), the reference it knew the
    round before carried from call to call (``reference``: None at first and after a restart);
    ``lie``: the scores it reports in the rounds it attacks (:meth:`reported`); ``byzantine``: the
    run's Byzantine clients, for its :class:`Standing`, kept from step to step with
    ``attack.strike = "trusted"`` and in a client process's checkpoint (:meth:`state`)."""

    def __init__(
        self, scenario: Scenario, attacker: int, attack: Any, generator: torch.Generator, lie: Mapping[int, float] | None = None,
        byzantine: Collection[int] = (),
    ) -> None:
        self.scenario, self.attacker, self.attack, self.generator = scenario, attacker, attack, generator
        self.reference: torch.Tensor | None = None
        self.lie = lie
        cfg = scenario.attack
        self.standing = Standing(attacker, cfg.trusted_rounds, byzantine) if cfg.strike == "trusted" else None
        self._decided: tuple[int, bool] | None = None  # (label, whether it attacks in it)

    def attacking(self, label: int) -> bool:
        """Whether it attacks in the round (step) labelled ``label``: in the window's rounds
        that attack (:meth:`AttackConfig.attacks_in`), and with ``attack.strike = "trusted"``
        only when its standing says so, as it stood before that round's step (decided once per
        label: what it learns in the step moves the next label's decision, not this one's)."""
        if not self.scenario.attack.attacks_in(label):
            return False
        if self.standing is None:
            return True
        if self._decided is None or self._decided[0] != label:
            self._decided = (label, self.standing.trusted())
        return self._decided[1]

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of it beyond its generator: its standing ({} for none)."""
        return {} if self.standing is None else {"standing": self.standing.state()}

    def restore(self, kept: Mapping[str, Any]) -> None:
        """Its standing as a checkpoint kept it (:meth:`state`); ValueError if it is not one."""
        if self.standing is not None and "standing" in kept:
            self.standing.restore(kept["standing"])

    def reported(self, label: int) -> Mapping[int, float] | None:
        """The scores its messages of round ``label`` carry: its lie in the rounds it attacks, none
        in the others (it sends the mean of what it knows, as a free rider measuring nothing)."""
        return self.lie if self.lie and self.attacking(label) else None

    def __call__(
        self, label: int, *, receivers: tuple[int, ...], senders: tuple[int, ...], received: torch.Tensor, sizes: list[int],
        losses: list[float], reports: Mapping[int, Mapping[int, float] | None] | None = None, **pool: Any,
    ) -> tuple[Crafted, int, float]:
        """The step of the round labelled ``label``: the honest models ``received`` from
        ``senders`` (rows in that order) with the sizes and losses they declared, the scores that
        came with those new to it (``reports``: sender -> report, with ``network.share_scores``;
        a round's models, or under asynchronous gossip those it answers), the honest ``receivers``
        to craft for, and with colluders their ``pool`` (``colluders``, ``pool_senders``, ``pool``
        of :class:`AttackView`). Returns what the attack crafted and the size and loss declared."""
        size, loss = byzantine_claims(sizes, losses)
        view = AttackView(
            round=label, attacker=self.attacker, receivers=receivers, senders=senders, received=received, reference=self.reference,
            total_rounds=self.scenario.rounds, **pool,
        )
        crafted = craft_attack_round(self.scenario, self.attack, view, self.generator, attacking=self.attacking(label))
        if self.standing is not None:
            # In its record: the trusted steps in a row it decided on.
            crafted = dataclasses.replace(crafted, note={**crafted.note, "trusted_for": self.standing.streak})
            self.standing.observe(label, reports or {})
        self.reference = next_reference(self.attack, view)
        return crafted, size, loss


class Standing:
    """What a Byzantine client that strikes when trusted (``attack.strike = "trusted"``) makes
    of the scores its honest neighbours report (``network.share_scores``: each one's losses of
    its candidates of its last aggregation, the attacker's model among them). A report ranks it
    trusted when it is not among the report's ``f`` worst, ``f`` the Byzantine clients the
    report names (it knows the placement; a rule told its Byzantine neighbours leaves out as
    many, the worst): at least ``f`` entries have a higher loss than its own, compared in float32
    as the wire carries them, so that every engine reads the same ranks. It keeps each neighbour's
    latest report (one that sent none, as in the first round, has no say) and is trusted while
    more than half of those that name it rank it so. ``streak``: the steps (round labels) in a row
    it was trusted, reset by any step that finds it otherwise; :meth:`trusted`: whether it reached
    ``rounds``. Reports arrive a round after the aggregation that measured them, so a client that
    strikes learns it is distrusted two rounds later: it strikes in runs, and behaves (sends the
    mean of the models it knows) until it earned ``rounds`` trusted steps again. Under
    asynchronous gossip each answer to a neighbour's new model judges anew, a step counted once."""

    def __init__(self, attacker: int, rounds: int, byzantine: Collection[int]) -> None:
        self.attacker, self.rounds, self.byzantine = attacker, rounds, frozenset(byzantine) | {attacker}
        self.streak = 0
        self.latest: dict[int, bool] = {}  # neighbour -> whether its latest report ranks it trusted
        self._counted = -1  # the last label counted in the streak

    def trusted(self) -> bool:
        return self.streak >= self.rounds

    def state(self) -> dict[str, Any]:
        """Its streak, the last label it counted and each neighbour's latest rank, as JSON holds them."""
        return {"streak": self.streak, "counted": self._counted, "latest": {str(k): v for k, v in sorted(self.latest.items())}}

    def restore(self, state: Any) -> None:
        """Go on from :meth:`state`; ValueError (nothing changed) if ``state`` is not one."""
        try:
            streak, counted, latest = state["streak"], state["counted"], {int(k): v for k, v in state["latest"].items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ValueError(f"not a standing: {state!r}") from None
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (streak, counted)) or streak < 0 or not all(isinstance(v, bool) for v in latest.values()):
            raise ValueError(f"not a standing: {state!r}")
        self.streak, self._counted, self.latest = streak, counted, latest

    def observe(self, label: int, reports: Mapping[int, Mapping[int, float] | None]) -> None:
        """The step labelled ``label``: the ``reports`` that came with its new models (sender ->
        its report; None or empty: none)."""
        for sender, report in reports.items():
            if not report or self.attacker not in report:
                self.latest.pop(sender, None)
                continue
            losses = dict(zip(report, np.asarray(list(report.values()), dtype=np.float32).tolist(), strict=True))
            worse = sum(1 for v in losses.values() if v > losses[self.attacker])
            self.latest[sender] = worse >= len(self.byzantine.intersection(report))
        ranks = list(self.latest.values())
        if not (ranks and 2 * sum(ranks) > len(ranks)):
            self.streak = 0
        elif label > self._counted:
            self.streak += 1
        self._counted = max(self._counted, label)


def reported_scores(
    how: str, attacker: int, neighbours: Sequence[int], byzantine: Collection[int], clients: int, most: int,
) -> dict[int, float] | None:
    """What Byzantine client ``attacker`` reports as the scores it measured (``attack.scores``),
    the same in every round it attacks and in every engine. ``neighbours``: every client it may
    exchange models with; ``byzantine``: the run's Byzantine clients (a Byzantine client knows
    the placement); ``clients``: how many there are; ``most``: the most scores a receiver takes.
    A receiver reads a report over its median (:func:`~dfedrw.peer.aggregation.neighbourhood.relative`):

    * ``none``: no report (None).
    * ``praise``: itself and its Byzantine neighbours at ``PRAISED``, its honest neighbours at
      ``PLAIN``: while the honest ones are most of its neighbours, the attackers look a hundred
      times better than them on the receiver's scale.
    * ``frame``: its honest neighbours at ``FRAMED``, itself, its Byzantine neighbours and enough
      other clients at ``PLAIN`` to keep more than half the report plain (its median ``PLAIN``);
      if ``most`` entries cannot hold that, the honest neighbours of the highest ids stay plain.
    * ``frame_one``: one honest neighbour at ``FRAMED``, the one of lowest id (colluders that
      share it frame the same client), everyone else it names at ``PLAIN``, padded as ``frame``.
    * ``invert``: the ranking upside down: its honest neighbours at ``FRAMED``, itself and its
      Byzantine neighbours at ``PRAISED``, padded as ``frame`` (more than half the report plain, so
      that the receiver's scale keeps ``PLAIN`` at 1 and both lies show on it).
    """
    if how == "none":
        return None
    honest = sorted(k for k in neighbours if k not in byzantine and k != attacker)
    ours = [attacker, *sorted(k for k in neighbours if k in byzantine and k != attacker)]
    if how == "praise":
        return dict.fromkeys(ours, PRAISED) | dict.fromkeys(honest, PLAIN)
    low = ours if how == "invert" else []
    accused = honest[:1] if how == "frame_one" else honest
    plain = [k for k in ours + honest if k not in low and k not in accused]
    named = {attacker, *neighbours}
    room = max(0, min(most - len(ours) - len(honest), clients - len(named)))  # other clients it can name
    framed = padding = 0
    for framed in range(len(accused), -1, -1):
        # More than half the report plain: the entries off PLAIN, and one more.
        padding = max(0, len(low) + framed + 1 - (len(plain) + len(accused) - framed))
        if padding <= room:
            break
    pad = list(itertools.islice((k for k in range(clients) if k not in named), padding))
    kept = [k for k in ours + honest if k not in accused[:framed]]
    return {k: PRAISED if k in low else PLAIN for k in kept + pad} | dict.fromkeys(accused[:framed], FRAMED)


def scenario_lie(scenario: Scenario, graphs: Any, byzantine: Collection[int], attacker: int, most: int) -> dict[int, float] | None:
    """:func:`reported_scores` of ``attacker`` under ``scenario``'s ``attack.scores``, over the
    round graphs ``graphs``."""
    return reported_scores(scenario.attack.scores, attacker, graphs.possible(attacker), byzantine, graphs.num_clients, most)


def byzantine_claims(sizes: list[int], losses: list[float]) -> tuple[int, float]:
    """The data size and training loss a Byzantine client declares: the mean of its honest
    neighbours', so that weighting by size or loss cannot single it out. With nothing heard, the
    smallest plausible size (0 would be refused). The mean loss is ``math.fsum`` over the count:
    the same bits in any order, in every engine."""
    size = round(sum(sizes) / len(sizes)) if sizes else 1
    finite = [x for x in losses if math.isfinite(x)]
    return size, math.fsum(finite) / len(finite) if finite else float("nan")


def attack_generator(scenario: Scenario, view: AttackView, attack: Any, own: torch.Generator) -> torch.Generator:
    """The generator an attack draws from in ``view``'s round: its own (seeded by its id, drawn
    on round after round), or, for a per-round attack of colluding clients, the group's for this
    round (seeded by the round alone), so that every colluder computes the same plan."""
    if view.colluders and hasattr(attack, "plan"):
        return torch.Generator().manual_seed(derive_seed(scenario.seed, "collusion", view.round))
    return own


def craft_attack_round(scenario: Scenario, attack: Any, view: AttackView, own: torch.Generator, attacking: bool | None = None) -> Crafted:
    """A Byzantine client's messages of ``view``'s round, in every engine: in the attack window
    (``attack.start`` .. ``attack.stop``) what ``attack`` crafts (:func:`craft_round`, drawing
    from :func:`attack_generator`); outside it the mean of the honest models it knows, to every
    receiver (nothing known: silent), noted ``{"attacking": False}``. ``attacking``: the caller's
    decision (:meth:`ByzantineStep.attacking`); None: the window decides."""
    if not (scenario.attack.attacks_in(view.round) if attacking is None else attacking):
        mean = known_mean(view)
        return Crafted(dict.fromkeys(view.receivers, None if mean is None else mean.to(torch.float32)), {"attacking": False})
    return craft_round(attack, view, attack_generator(scenario, view, attack, own))


def known_mean(view: AttackView) -> torch.Tensor | None:
    """The mean of the honest models ``view`` knew (the next round's ``reference``), float64."""
    _, known = view.known()
    return mean_rows(known) if len(known) else None


def next_reference(attack: Any, view: AttackView) -> torch.Tensor | None:
    """The ``reference`` of ``attack``'s next view: :func:`known_mean` of this one for a
    per-round attack (its ``plan`` reads the view); None for a per-receiver attack, which is
    only ever handed the models it knows, so the mean would be computed for nobody."""
    return known_mean(view) if hasattr(attack, "plan") else None
