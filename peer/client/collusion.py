"""Colluding Byzantine clients pool the honest models they received, over their own channel.

With ``attack.colluding = true`` all Byzantine clients of a run form one group, sorted by id
(:func:`~dfedrw.peer.wiring.plan.colluding_group`). In round r a colluder

1. waits for its honest neighbours' round-r models, as every Byzantine client does;
2. sends every other colluder not presumed gone one *pool message*: round r, the sorted ids of
   the honest senders it heard (``origins``) and their models in that order
   (:func:`~dfedrw.peer.transport.pools.pool_out`);
3. waits, until the round deadline, for the round-r pool of each other colluder not presumed gone;
4. takes the union by origin (:func:`pool_union`; an honest client sends every neighbour the same
   model), which its attack sees as ``pool_senders = sorted(union)`` and ``AttackView.pool``.

The batched engine (``engines/run.py``) computes the same union from the rows of the honest
models, so a seeded run gives the same records in both.

Pools travel over the clients' transport, authenticated like every message (gRPC: the id in the
sender's certificate; torch.distributed: the sending rank); only a Byzantine client takes one,
and only from a colluder (``serde.decode`` rejects it otherwise). :class:`PoolStore` keeps them
out of the honest-model inbox, by (round, colluder), stale rounds dropped, a bounded number.
Liveness as for neighbours: a colluder that misses ``max_missed`` pools in a row, or cannot be
reached, is no longer waited for and gets a pool only every ``probe_every`` rounds, until a pool
from it arrives in the window. A colluder that dies does not stop the others."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dfedrw.peer.client.rounds import Liveness
from dfedrw.peer.registry import check_int
from dfedrw.peer.transport.pb import peer_pb2 as pb
from dfedrw.peer.transport.inbox import RoundWaiting
from dfedrw.peer.transport.pools import PoolMessage, decode_pool, pool_bytes, pool_out
from dfedrw.peer.transport.serde import Plausible, TensorSpec, WireError

log = logging.getLogger(__name__)


class Counters(Protocol):
    """The client's inbox, where the pool store counts each message it receives in one counter."""

    def reject(self, reason: str, detail: str = "") -> tuple[bool, str]: ...

    def drop_stale(self, sender: int, round_: int) -> tuple[bool, str]: ...

    def count_received(self, nbytes: int) -> None: ...


@dataclass(frozen=True)
class Pooled:
    """A colluder's round after the exchange: ``senders`` (sorted) and their models
    ``vectors [len(senders), D]``, the union by origin of what it received and the other
    colluders' pools; ``used``: the colluders whose pool went in, itself included (sorted)."""

    senders: tuple[int, ...]
    vectors: torch.Tensor
    used: tuple[int, ...]


def pool_union(own_id: int, senders: Sequence[int], received: torch.Tensor, pools: Mapping[int, PoolMessage]) -> Pooled:
    """The union by origin of what ``own_id`` received (``senders``, rows of ``received``) and the
    colluders' ``pools`` (colluder -> pool). A model several hold is taken once: its own copy
    first, then the colluders' in id order (every copy is the one model that origin sent).

    >>> r = torch.tensor([[1.0, 2.0]])
    >>> other = PoolMessage(sender=6, round=0, origins=(0, 2), vectors=torch.tensor([[9.0, 9.0], [3.0, 4.0]]))
    >>> pool_union(5, (0,), r, {6: other}).senders
    (0, 2)
    """
    rows: dict[int, torch.Tensor] = {k: received[i] for i, k in enumerate(senders)}
    for colluder in sorted(pools):
        pool = pools[colluder]
        for i, k in enumerate(pool.origins):
            rows.setdefault(k, pool.vectors[i])
    union = tuple(sorted(rows))
    vectors = torch.stack([rows[k] for k in union]) if union else received.new_empty(0, received.shape[1])
    return Pooled(senders=union, vectors=vectors, used=tuple(sorted({own_id, *pools})))


class PoolStore(RoundWaiting):
    """The pools a colluder received, by (round, colluder), beside its inbox (a pool is not a
    neighbour's model). One for the current round or up to ``window`` rounds ahead is kept, an
    older one dropped as stale; a later one, a second for a round, one from outside ``peers`` or
    one past ``max_entries`` is rejected; all counted in ``counters``. :meth:`wait` blocks until
    every expected colluder's pool of a round is in, or a deadline."""

    def __init__(self, own_id: int, peers: Iterable[int], window: int, counters: Counters, *, max_entries: int | None = None) -> None:
        self.own_id = own_id
        self.peers = frozenset(peers)
        self.window = check_int("PoolStore", "window", window, minimum=0)
        # One pool per colluder and round of the window: an honest exchange never needs more.
        bound = (self.window + 1) * max(1, len(self.peers))
        self.max_entries = check_int("PoolStore", "max_entries", bound if max_entries is None else max_entries, minimum=1)
        self.counters = counters
        self._round = 0
        self._pools: dict[tuple[int, int], PoolMessage] = {}
        self._gone: set[int] = set()
        self._cond = threading.Condition()
        self._waiting: tuple[int, frozenset[int]] | None = None

    @property
    def round(self) -> int:
        return self._round

    def __len__(self) -> int:
        with self._cond:
            return len(self._pools)

    def offer(self, msg: PoolMessage) -> tuple[bool, str]:
        """Keep ``msg`` if it is acceptable; returns (accepted, reason)."""
        if msg.sender not in self.peers:
            return self.counters.reject("not_colluder", f"a pool from {msg.sender}")
        verdict = ""
        with self._cond:
            key = (msg.round, msg.sender)
            if msg.round < self._round:
                verdict = "stale_round"
            elif msg.round > self._round + self.window:
                verdict = "future_round"
            elif key in self._pools:
                verdict = "duplicate"
            elif len(self._pools) >= self.max_entries:
                verdict = "pool_full"
            else:
                self._pools[key] = msg
                self._gone.discard(msg.sender)
                self._wake_if_complete()
        if verdict == "stale_round":
            return self.counters.drop_stale(msg.sender, msg.round)
        if verdict:
            return self.counters.reject(verdict, f"round-{msg.round} pool from {msg.sender}")
        self.counters.count_received(msg.nbytes)
        return True, ""

    def advance(self, round_: int) -> None:
        """Move to ``round_``: pools of earlier rounds are dropped (stale now)."""
        with self._cond:
            self._round = round_
            for key in [key for key in self._pools if key[0] < round_]:
                del self._pools[key]

    def _arrived(self, round_: int) -> dict[int, PoolMessage]:
        # What wait() returns: the round's pools (colluder -> pool).
        return {k: m for (r, k), m in self._pools.items() if r == round_}


class Collusion:
    """A colluding Byzantine client's side of the pool exchange (see the module).

    ``transport`` carries the pools (``send(to, chunks)``; ``reconnect(peer)`` if it has one);
    ``counters`` is the client's inbox. :meth:`accept` takes a pool from an authenticated
    colluder (transport's thread), :meth:`exchange` runs a round's exchange (round loop's)::

        collusion = Collusion(5, (5, 6), specs=specs, num_clients=7, transport=t, counters=inbox, window=2, max_missed=2)
        pooled = collusion.exchange(r, senders, received, timeout=30.0)
        view = AttackView(..., colluders=collusion.colluders, pool_senders=pooled.senders, pool=pooled.vectors)
    """

    def __init__(
        self,
        own_id: int,
        colluders: Iterable[int],
        *,
        specs: Sequence[TensorSpec],
        num_clients: int,
        transport: Any,
        counters: Counters,
        window: int,
        max_missed: int,
        plausible: Plausible = Plausible(),
        chunk_bytes: int = 1 << 20,
        probe_every: int = 5,
    ) -> None:
        self.own_id = own_id
        self.colluders = tuple(sorted(set(colluders)))
        if own_id not in self.colluders:
            raise ValueError(f"Collusion: colluders {self.colluders} must include client {own_id}")
        self.num_clients = check_int("Collusion", "num_clients", num_clients, minimum=len(self.colluders))
        self.max_missed = check_int("Collusion", "max_missed", max_missed, minimum=1)
        self.probe_every = check_int("Collusion", "probe_every", probe_every, minimum=1)
        self.chunk_bytes = check_int("Collusion", "chunk_bytes", chunk_bytes, minimum=1)
        self.peers = tuple(k for k in self.colluders if k != own_id)
        self.specs = tuple(specs)
        self.plausible = plausible
        self.transport = transport
        self.store = PoolStore(own_id, self.peers, window, counters)
        # The most a pool can hold: one model of each client.
        self.max_bytes = pool_bytes(self.specs, self.num_clients)
        self._liveness = Liveness(self.max_missed, own_id, "colluder", "pools in a row")
        self._last: tuple[int, list[pb.ModelChunk]] | None = None  # (round, chunks) of its last pool

    # -- receiving (the transport's thread) ------------------------------------------------
    def accept(self, header: pb.ModelHeader, payload: bytes, wire_bytes: int) -> tuple[bool, str]:
        """Check and keep one pool from a colluder; raises :class:`WireError` for a malformed one
        (the client counts it as for any message)."""
        return self.keep(decode_pool(header, payload, self.specs, wire_bytes, self.plausible, num_clients=self.num_clients))

    def keep(self, msg: PoolMessage) -> tuple[bool, str]:
        """Keep a pool that passed its wire checks (:func:`decode_pool`, or the client's intake
        decoding it chunk by chunk); raises :class:`WireError` for one naming a colluder."""
        if any(k in self.colluders for k in msg.origins):
            # A pool holds honest models only: a colluder's id there is no model anyone sent.
            raise WireError("colluder_origin", f"a pool from {msg.sender} names a colluder as an origin")
        was_gone = msg.sender in self.store.gone()
        accepted, reason = self.store.offer(msg)
        if accepted and was_gone:
            self._on_back(msg.sender, msg.round)
        return accepted, reason

    def _on_back(self, peer: int, round_: int) -> None:
        """A colluder presumed gone sent a pool: it is waited for again (the store took it off the
        gone list), a channel still backing off is opened anew, and its pool of that round, if
        sent already (to it only as a probe), goes again."""
        log.warning("client %d: colluder %d is back (round %d); waiting for its pools again", self.own_id, peer, round_)
        reconnect = getattr(self.transport, "reconnect", None)
        if reconnect is not None:
            reconnect(peer)
        last = self._last
        if last is not None and last[0] == round_:
            self.transport.send(peer, last[1])

    def on_reachability(self, peer: int, state: str) -> None:
        """The transport's word on a colluder: one that cannot be reached (or that this client's
        server shut out) is not waited for until its next pool arrives."""
        if peer in self.peers and state in ("unreachable", "shut_out") and peer not in self.store.gone():
            log.warning("client %d: colluder %d %s, no longer waiting for its pools", self.own_id, peer, state.replace("_", " "))
            self.store.set_gone(peer)

    def set_gone(self, peer: int) -> None:
        """Not waited for (e.g. no address at start)."""
        self.store.set_gone(peer)

    # -- a round (the round loop's thread) ---------------------------------------------------
    def exchange(self, round_: int, senders: Sequence[int], received: torch.Tensor, timeout: float) -> Pooled:
        """Send this round's pool (``senders`` and their models ``received``) to every other
        colluder not presumed gone (to one presumed gone every ``probe_every`` rounds), wait
        until ``timeout`` for theirs, and return the union."""
        self.store.advance(round_)
        self._last = None  # the last round's pool: nobody waits for it any more
        chunks = pool_out(self.own_id, round_, senders, received, self.specs, chunk_bytes=self.chunk_bytes)
        self._last = (round_, chunks)
        gone = self.store.gone()
        for k in self.peers:
            if k in gone and round_ % self.probe_every:
                continue
            self.transport.send(k, chunks)
        expected = frozenset(self.peers) - gone
        got = self.store.wait(round_, expected, timeout)
        self._liveness.update(self.store, expected, got)
        return pool_union(self.own_id, senders, received, got)
