"""What one sender may ask of a receiver's gRPC server (:class:`CallLimits`), and its account there
(:class:`Caller`): its open calls and its message bucket."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CallLimits:
    """What one sender may ask of a receiver's server.

    Calls: one open ``Exchange`` call (a newer one replaces it) and ``calls_per_sender`` open
    ``Push``/``PushOne`` calls; a call beyond is refused at once with RESOURCE_EXHAUSTED. A
    call that carries no chunk for ``idle_call_timeout`` seconds is ended.

    Messages: a token bucket per sender, ``burst`` deep, refilled by ``per_round`` tokens each
    round the receiver advances and ``per_second`` tokens a second (so a receiver whose round is
    stuck still hears from everyone). A message takes a token when it begins and gives it back at
    its end if it brought news: the receiver took it (a model of a round in its window, or under
    asynchronous gossip newer than the one held), or it is of a round the receiver passed and
    newer than any the sender sent before (a neighbour that fell behind, whose every model
    arrives late). So an honest sender, which sends each label once, never runs dry however fast
    or slow either side's rounds go; what costs is what it does not send: copies, old or
    far-future labels, bad messages, headers without a model. A message without a token is
    answered ``rate_limited`` unread; a sender ``2 * burst`` tokens past empty has its calls
    ended and every new one refused for ``block_seconds``. A refused call costs a token too.

    ``shared_host``: without TLS a caller is known only by its IP address, which every client on
    one host shares: such a caller gets this many times every bound."""

    calls_per_sender: int = 2
    idle_call_timeout: float = 60.0
    burst: int = 16
    per_round: float = 4.0
    per_second: float = 0.4
    block_seconds: float = 50.0
    shared_host: int = 1


class Caller:
    """A sender's open calls and message bucket, on the receiver's side."""

    __slots__ = ("key", "scale", "tokens", "round", "newest", "stamp", "blocked_until", "exchanges", "pushes", "tasks", "held")

    def __init__(self, key: Any, scale: int, tokens: float, round_: int) -> None:
        self.key = key  # the client id, or ("ip", address) without TLS
        self.scale = scale
        self.tokens = tokens
        self.round = round_
        self.newest = -1  # the highest label of a model of this sender's that the receiver judged
        self.stamp = time.monotonic()
        self.blocked_until = 0.0
        self.exchanges: set[asyncio.Task] = set()
        self.pushes = 0
        self.tasks: set[asyncio.Task] = set()
        self.held = False  # a call of this (shut out) sender is being held before its refusal

    def idle(self) -> bool:
        return not self.tasks and self.pushes == 0 and not self.held and self.blocked_until <= time.monotonic()

    def spend(self, limits: CallLimits, receiver_round: int) -> bool:
        """Refill the bucket for the time and the receiver's rounds since the last message, then
        take a token; False when there was none (the bucket is below zero then)."""
        now = time.monotonic()
        depth = limits.burst * self.scale
        if now > self.stamp:  # after a block, refilling starts when it ends
            rounds = max(0, receiver_round - self.round)
            gain = (rounds * limits.per_round + (now - self.stamp) * limits.per_second) * self.scale
            self.tokens = min(depth, self.tokens + gain)
            self.stamp, self.round = now, receiver_round
        self.tokens -= 1
        return self.tokens >= 0

    def settle(self, limits: CallLimits, label: int | None, verdict: tuple[bool, str, int]) -> None:
        """A message of this sender's labelled ``label`` got ``verdict``: its token comes back
        when it brought news (see :class:`CallLimits`)."""
        accepted, reason = verdict[0], verdict[1]
        if label is None or not (accepted or reason == "stale_round"):
            return
        if accepted or label > self.newest:
            self.tokens = min(limits.burst * self.scale, self.tokens + 1)
        self.newest = max(self.newest, label)
