"""A client that comes back: checkpoints, and the way back into the network after a restart.

A client saves its state every ``checkpoint.every`` rounds. Restarted, it asks its neighbours
which round they are in, continues one past the furthest of them, takes their median in place of
a model too many rounds stale, and for a while skips ahead to neighbours found further on and
resends its model to those not yet able to take it. :class:`Resume` holds that state for one
client, which asks it at each round."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from dfedrw.peer.client.checkpoint import Checkpoint, save_checkpoint
from dfedrw.peer.transport.serde import message_out

log = logging.getLogger("dfedrw.peer.client.client")

# A resumed client that skips more rounds than this to catch up with its neighbours holds a
# stale model: it takes their models' coordinate-wise median instead (see Client._run_honest).
STALE_AFTER = 10
# Rounds after resuming in which a client skips ahead to neighbours their replies show ahead.
REJOIN_ROUNDS = 20


def upper_median(values) -> int:
    """The upper median of the rounds neighbours report: the furthest of two, and with more
    neighbours one that a minority (e.g. Byzantine ones reporting a far round) cannot set."""
    ordered = sorted(values)
    return int(ordered[len(ordered) // 2])


def coordinate_median(vectors: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise median of the rows (the mean of the two middle values when even)."""
    ordered = vectors.sort(dim=0).values
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


class Resume:
    """A client's checkpoints and its way back after a restart. ``resumed``: the checkpoint it
    started from (None: a fresh start); ``presence`` gives the model it sent last, ``results`` the
    last round logged; it saves to ``checkpoint_file`` under the scenario's ``fingerprint``."""

    def __init__(
        self, own_id: int, role: str, scenario, *, graphs, byzantine, transport, inbox, specs, presence, results,
        checkpoint_file: Path, fingerprint: str, resumed: Checkpoint | None,
    ) -> None:
        self.id, self.role, self.scenario = own_id, role, scenario
        self.graphs, self.byzantine, self.transport, self.inbox, self.specs = graphs, byzantine, transport, inbox, specs
        self.presence, self.results = presence, results
        self.checkpoint_file, self.fingerprint, self.resumed = checkpoint_file, fingerprint, resumed
        before = resumed.counters if resumed else {}
        self.restarts = int(before.get("restarts", 0)) + (1 if resumed else 0)
        # One entry per resume: checkpoint round, round resumed at, rounds skipped and redone.
        self.resumed_from: list[dict[str, Any]] = list(before.get("resumed_from", []))
        self.counters_before = {"rejected_by_reason": dict(before.get("rejected_by_reason", {})), "stale_messages": int(before.get("stale_messages", 0))}
        self.rejoining = 0  # rounds left in which to skip ahead to neighbours found further on
        self.stale_round: int | None = None  # the round whose aggregate replaces a stale model

    def rejected(self) -> dict[str, int]:
        """Messages refused by reason, before the restarts and since."""
        rejected = dict(self.counters_before["rejected_by_reason"])
        for reason, n in self.inbox.rejected.items():
            rejected[reason] = rejected.get(reason, 0) + n
        return rejected

    def stale_messages(self) -> int:
        return self.inbox.stale + self.counters_before["stale_messages"]

    def rounds_lost(self) -> int:
        return sum(e["skipped"] + e["redone"] for e in self.resumed_from)

    # -- checkpoints and resuming --------------------------------------------------------
    def save(self, r: int, *, generators: dict, arrays: dict | None = None, vector=None, **counters: Any) -> None:
        """The checkpoint of round ``r``: the client's ``vector``, generators and arrays, its
        ``counters`` and the counts kept here."""
        save_checkpoint(
            self.checkpoint_file,
            Checkpoint(
                client=self.id, round=r, scenario=self.fingerprint, vector=vector, generators=generators, arrays=arrays or {},
                counters={
                    **counters, "restarts": self.restarts, "resumed_from": self.resumed_from,
                    "rejected_by_reason": self.rejected(), "stale_messages": self.stale_messages(),
                },
            ),
        )

    def _neighbour_rounds(self, hello_round: int, vector: torch.Tensor, num_samples: int) -> dict[int, int]:
        """Ask the neighbours which round they are in. No RPC of its own: this client sends them
        its checkpointed model labelled with its checkpoint round, and each reply carries the
        receiver's round (gRPC transport only: others do not report it; then {})."""
        rounds = getattr(self.transport, "peer_replies", None)
        if rounds is None:
            return {}
        rounds.clear()
        chunks = message_out(self.id, hello_round, vector, self.specs, num_samples=num_samples, train_loss=float("nan"), chunk_bytes=self.scenario.network.chunk_bytes)
        # Those it sends to in that round (a fixed graph: its neighbours): a receiver checks the
        # sender against the round's graph.
        asked = [k for k in self.graphs.receivers_of(self.id, hello_round) if k not in self.byzantine or self.role == "honest"]
        for k in asked:
            self.transport.send(k, chunks)
        deadline = time.monotonic() + self.scenario.network.round_timeout
        while time.monotonic() < deadline:
            if all(k in rounds or k in self.inbox.gone() for k in asked):
                break
            time.sleep(0.005)
        found = {k: int(rounds[k][0]) for k in asked if k in rounds}
        rounds.clear()  # from now on, the replies to this client's round messages
        return found

    def rejoin(self, vector: torch.Tensor, num_samples: int) -> int:
        """The round a resumed client continues at: the one after its checkpoint, or, when its
        neighbours went further meanwhile, one past them (:func:`upper_median`): such a neighbour
        buffers this client's message of that round (it is in its window) and, before it starts
        the round, takes it back and sends it its model; one further behind takes it back once it
        is within its window (see :meth:`wait`)."""
        c = self.resumed.round
        start = c + 1
        asked = time.monotonic()
        found = self._neighbour_rounds(c, vector, num_samples)
        asked = time.monotonic() - asked
        # A neighbour in the round after the checkpoint waits for this client's message of it.
        further = found and upper_median(found.values()) > start
        target = self.continue_at(start, upper_median(found.values()) + 1 if further else start, found)
        skipped = target - start
        stale = skipped > STALE_AFTER and self.role == "honest"
        self.stale_round = target if stale else None
        self.rejoining = REJOIN_ROUNDS
        log.warning(
            "client %d: restart %d; checkpoint of round %d, neighbours in rounds %s (asked in %.2f s); continuing at round %d (%d rounds skipped%s)",
            self.id, self.restarts, c, found or "unknown", asked, target, skipped,
            f", model {skipped} rounds stale: taking its neighbours' median in round {target}" if stale else "",
        )
        return target

    def resume_steps(self, senders) -> tuple[int, torch.Tensor | None]:
        """Under asynchronous gossip: the step to continue at, and the model to continue with
        where its own is stale (else None). It waits, at most ``round_timeout``, for a first model
        of each reachable neighbour (``senders``; one that found it gone probes it every few
        steps) and continues one past the upper median of their steps, or of its checkpoint's
        where they are no further (or none came: a finished network). Past :data:`STALE_AFTER`
        skipped steps its checkpointed model is stale (one vote among its neighbours' would pull
        their aggregates back while it lagged): it takes the coordinate-wise median of theirs
        instead. Neighbours get nothing older than the newest model they hold of it (their
        replies name it, :class:`~dfedrw.peer.client.presence.Presence` ``newest_only``). Noted as
        a resume: the steps skipped here, and those done again as they come (:meth:`note_round`)."""
        c = self.resumed.round
        start = c + 1
        senders = tuple(senders)
        asked = time.monotonic()
        if senders:
            self.inbox.wait_for_step(senders, 0, self.scenario.network.round_timeout)
        asked = time.monotonic() - asked
        held = {k: m for k, (m, _) in self.inbox.held_models().items() if k in senders}
        found = {k: m.round for k, m in held.items()}
        # A neighbour's label is the step it sent last: one past it is where it goes on.
        target = self.continue_at(start, upper_median(found.values()) + 1 if found else start, found)
        skipped = target - start
        model = None
        if skipped > STALE_AFTER and self.role == "honest" and held:
            model = coordinate_median(torch.stack([held[k].vector for k in sorted(held)]))
            self.resumed_from[-1]["took_neighbours_model"] = True
        log.warning(
            "client %d: restart %d; checkpoint of step %d, neighbours at steps %s (heard in %.2f s); continuing at step %d (%d steps skipped%s)",
            self.id, self.restarts, c, found or "unknown", asked, target, skipped, ", taking its neighbours' median model" if model is not None else "",
        )
        return target, model

    def continue_at(self, start: int, furthest: int, found: dict[int, int]) -> int:
        """Where a resumed client goes on: ``furthest`` (where its neighbours are), never before
        ``start`` (the round after its checkpoint), nor past the last round unless ``start`` is;
        noted in ``resumed_from``."""
        rounds = self.scenario.rounds
        target = max(start, min(furthest, rounds - 1)) if start < rounds else start
        self.resumed_from.append({
            "checkpoint_round": self.resumed.round, "last_logged": self.results.last_logged, "resumed_at": target,
            "neighbour_rounds": {str(k): v for k, v in sorted(found.items())}, "skipped": target - start, "redone": 0, "took_neighbours_model": False,
        })
        return target

    def catch_up(self, r: int) -> int:
        """While rejoining: when its neighbours' replies say they are further on than the round
        window (they went on without this client and will not take it back from a late message),
        skip to their round. Not for one fewer rounds ahead: it takes this client back on its late
        message and waits for its next round, which this client reaches quickly, waiting for no
        round that neighbour passed (see :meth:`wait`); it would miss the rounds a skip passes."""
        if self.rejoining <= 0:
            return r
        self.rejoining -= 1
        replies = getattr(self.transport, "peer_replies", None) or {}
        ahead = upper_median([v[0] for v in list(replies.values())]) if replies else -1
        if ahead <= r + self.scenario.network.round_window:
            return r
        target = min(ahead, self.scenario.rounds - 1)
        entry = self.resumed_from[-1]
        entry["skipped"] += target - r
        if self.stale_round is not None or (self.role == "honest" and target - r > STALE_AFTER):
            self.stale_round = target
        log.warning("client %d: neighbours are in round %d; skipping from round %d", self.id, ahead, r)
        return target

    def wait(self, r: int, expected: frozenset[int]) -> tuple[dict[int, Any], frozenset[int]]:
        """The round's wait; returns (what arrived, neighbours that had passed this round). While
        rejoining, this client's model of the round goes again to a neighbour whose last reply
        refused it as too far ahead (further behind than the round window) until that neighbour
        can take it back; one whose reply says it passed this round sent nothing for it, and is
        neither waited for nor counted as missing."""
        timeout = self.scenario.network.round_timeout
        replies = getattr(self.transport, "peer_replies", None)
        last = self.presence.last_sent
        if replies is None or self.rejoining <= 0 or last is None or last[0] != r:
            return self.inbox.wait(r, expected, timeout), frozenset()
        outgoing = last[1]
        deadline = time.monotonic() + timeout
        passed: set[int] = set()
        resent: dict[int, int] = {}  # neighbour -> its round when it was last sent the model again
        for _ in range(int(timeout / 0.05) + 2):
            left = deadline - time.monotonic()
            got = self.inbox.wait(r, expected - passed, min(0.05, max(left, 0.0)))
            waiting = expected - got.keys() - self.inbox.gone() - passed
            if not waiting or left <= 0:
                break
            for k in waiting:
                v = replies.get(k)
                if v is not None and not v[1] and v[2] == "stale_round" and v[0] > r:
                    passed.add(k)
                elif v is not None and not v[1] and v[2] == "future_round" and resent.get(k) != v[0] and k in self.graphs.receivers_of(self.id, r):
                    # Again once it moved on: a copy it would refuse once more is no news to it.
                    resent[k] = v[0]
                    self.transport.send(k, outgoing.again(k))
        got = self.inbox.wait(r, expected - passed, 0.0)
        return got, frozenset(passed - got.keys())

    def note_round(self, r: int) -> None:
        """Count a round done again after a resume (it was logged before the crash)."""
        if self.resumed_from and self.resumed is not None and r <= self.resumed_from[-1]["last_logged"]:
            self.resumed_from[-1]["redone"] += 1
