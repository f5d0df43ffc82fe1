"""What the batched engine's network does in a round (:class:`SimulatedNetwork`): its simulated
clock says which models reach each receiver in time (``engines/clock.py``), and
``network.compression`` what each receiver rebuilds of each honest model and what each link's
message costs on the wire (:class:`LinkCodec`).

The same :class:`~dfedrw.peer.transport.compression.Compression` a client's encoder uses, on the
rows of the batched engine's models: ``int8`` encodes each honest model once a round with the
generator a client would draw its rounding from (seeded by the run's seed, the sender and the
round), every receiver rebuilding the same model; ``topk`` keeps per link the model its receiver
holds of the sender, as a client's encoder and its neighbour's decoder do (a whole model first
and every ``refresh`` messages, a difference of the largest coordinates between). A link's state
moves on only when it carries a message (the clock says which). Byzantine clients send raw
models, as theirs do. With no replies, a lossy link under ``topk`` is refused
(:func:`check_supported`): no receiver's copy falls out of step."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import torch

from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.transport.chunks import wire_size
from dfedrw.engines.clock import RoundTiming
from dfedrw.peer.transport.compression import Compression, encoded_out, rounding_generator
from dfedrw.peer.transport.serde import TensorSpec, message_out, shareable
from dfedrw.engines.clock import scenario_clock
from dfedrw.peer.wiring.build import scenario_compression, scenario_model_specs


def message_bytes(specs: Sequence[TensorSpec], chunk_bytes: int, scores: int = 0) -> int:
    """A raw model message's bytes on the wire, header and all (as a sender's links count it),
    carrying ``scores`` scores."""
    zeros = torch.zeros(sum(s.numel for s in specs))
    return wire_size(message_out(0, 0, zeros, specs, num_samples=1, train_loss=1.0, scores=_scores(scores), chunk_bytes=chunk_bytes))


def _scores(n: int) -> dict[int, float]:
    """``n`` scores as a header holds them (fixed width: their values do not change the size)."""
    return dict.fromkeys(range(n), 1.0)


def pooled(rebuilt: Mapping[tuple[int, int], torch.Tensor], receivers: Collection[int], first: int) -> tuple[list[torch.Tensor], dict[tuple[int, int], int]]:
    """The rebuilt models the ``receivers`` aggregate, each once, as rows to pool after row
    ``first - 1``; and each link's row."""
    rows: list[torch.Tensor] = []
    seen: dict[int, int] = {}
    link_row: dict[tuple[int, int], int] = {}
    for link, vector in rebuilt.items():
        if link[1] not in receivers:
            continue
        if id(vector) not in seen:
            seen[id(vector)] = first + len(rows)
            rows.append(vector[None])
        link_row[link] = seen[id(vector)]
    return rows, link_row


def check_supported(compression: Compression, lossy: bool) -> None:
    """Raise ``ValueError`` for what the batched engine does not model: differences over lossy
    links (a receiver's copy falls behind and is resynced by the sender's replies; it has none)."""
    if compression.stateful and lossy:
        raise ValueError(
            "network.compression = 'topk' over [links] that lose messages: the batched engine does not model the receivers' "
            "refusals and the senders' resync; use the client engine (engine.name = \"clients\"), or links without loss"
        )


class LinkCodec:
    """Per honest sender and link: the message's size on the wire (:meth:`sizes`, before a
    round's links are timed) and the model its receiver rebuilds (:meth:`rebuilt`)."""

    def __init__(
        self, compression: Compression, specs: Sequence[TensorSpec], *, seed: int, chunk_bytes: int, honest: Iterable[int], raw: MessageSizes | None = None,
    ) -> None:
        self.compression = compression
        self.seed = seed
        self.honest = frozenset(honest)
        self.specs, self.chunk_bytes = tuple(specs), chunk_bytes
        self.raw = MessageSizes(specs, chunk_bytes) if raw is None else raw
        self._encoded_bytes: dict[int, int] = {}
        # Per link (sender, receiver) under topk: (the round of the model the receiver holds, it).
        self.bases: dict[tuple[int, int], tuple[int, torch.Tensor]] = {}
        self.since_dense: dict[tuple[int, int], int] = {}

    def _dense_next(self, link: tuple[int, int], r: int) -> bool:
        held = self.bases.get(link)
        return self.compression.whole_next(None if held is None else held[0], self.since_dense.get(link, 0), r)

    def encoded_bytes(self, scores: int = 0) -> int:
        """An encoded model message's bytes on the wire, carrying ``scores`` scores."""
        if scores not in self._encoded_bytes:
            c = self.compression
            payload = memoryview(bytes(c.payload_bytes(sum(s.numel for s in self.specs))))
            message = encoded_out(
                0, 0, payload, self.specs, encoding=c.encoding, base_round=0 if c.stateful else None, num_samples=1, train_loss=1.0,
                scores=_scores(scores), chunk_bytes=self.chunk_bytes, **c.header_fields(),
            )
            self._encoded_bytes[scores] = wire_size(message)
        return self._encoded_bytes[scores]

    def sizes(self, r: int, links: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
        """The bytes of round ``r``'s message on each link (Byzantine senders': a raw model)."""
        out = {}
        for link in links:
            if link[0] in self.honest and self.compression.encoding and not (self.compression.stateful and self._dense_next(link, r)):
                out[link] = self.encoded_bytes(self.raw.scored.get(link[0], 0))
            else:
                out[link] = self.raw.of(link[0])
        return out

    def rebuilt(self, r: int, models: Mapping[int, torch.Tensor], links: Iterable[tuple[int, int]]) -> dict[tuple[int, int], torch.Tensor]:
        """Round ``r``: the model each link that carried a message rebuilds of its honest sender
        (``models``: sender -> its model, flat float32 on the CPU); the links' state moves on."""
        compression = self.compression
        out: dict[tuple[int, int], torch.Tensor] = {}
        shared: dict[int, torch.Tensor] = {}
        for link in sorted(links):
            sender = link[0]
            if sender not in self.honest:
                continue
            vector = models[sender]
            if not compression.stateful:
                if sender not in shared:
                    _, rebuilt = compression.encode(vector, None, rounding_generator(self.seed, sender, r))
                    shared[sender] = vector if rebuilt is None else rebuilt
                out[link] = shared[sender]
            elif self._dense_next(link, r):
                self.bases[link] = (r, vector.detach().reshape(-1).to(torch.float32).clone())
                self.since_dense[link] = 0
                out[link] = self.bases[link][1]
            else:
                _, base = self.bases[link]
                compression.encode(vector, base, rounding_generator(self.seed, sender, r))
                self.bases[link] = (r, base)
                self.since_dense[link] = self.since_dense.get(link, 0) + 1
                out[link] = base
        return out


class MessageSizes:
    """A raw model message's bytes on the wire by sender: with ``network.share_scores`` an
    honest sender's message carries the scores of its last aggregation (``scored``: sender ->
    how many, as :func:`~dfedrw.peer.transport.serde.shareable` keeps them), the others none."""

    def __init__(self, specs: Sequence[TensorSpec], chunk_bytes: int) -> None:
        self.specs, self.chunk_bytes = tuple(specs), chunk_bytes
        self.scored: dict[int, int] = {}
        self._bytes: dict[int, int] = {}

    def of(self, sender: int) -> int:
        n = self.scored.get(sender, 0)
        if n not in self._bytes:
            self._bytes[n] = message_bytes(self.specs, self.chunk_bytes, n)
        return self._bytes[n]

    def links(self, links: Iterable[tuple[int, int]], codec: LinkCodec | None, r: int) -> dict[tuple[int, int], int]:
        """The bytes of round (or step) ``r``'s message on each link."""
        if codec is not None:
            return codec.sizes(r, links)
        return {link: self.of(link[0]) for link in links}


class SimulatedNetwork:
    """The batched engine's network: with a clock (``scenario.clocked``), the models that reach
    each receiver by its deadline and each round's simulated seconds and bytes; with a compression,
    the models as their receivers rebuild them; with neither, every model arrives as sent."""

    def __init__(self, scenario: Scenario, honest: Sequence[int], byzantine: Sequence[int]) -> None:
        sc = scenario
        specs = scenario_model_specs(sc)
        self.clock = scenario_clock(sc, frozenset(byzantine)) if sc.clocked else None
        self.codec: LinkCodec | None = None
        self.sizes = MessageSizes(specs, sc.network.chunk_bytes)
        if sc.network.compression != "none":
            compression = scenario_compression(sc)
            check_supported(compression, sc.links.lossy)
            self.codec = LinkCodec(compression, specs, seed=sc.seed, chunk_bytes=sc.network.chunk_bytes, honest=honest, raw=self.sizes)
        self.share_scores = sc.network.share_scores
        self.shared: dict[int, dict[int, float] | None] = {}  # sender -> the scores its next message carries
        self.timing: RoundTiming | None = None
        self.link_bytes: dict[tuple[int, int], int] = {}
        self.rebuilt: dict[tuple[int, int], torch.Tensor] = {}
        self.links: list[tuple[int, int]] = []
        self.bytes_to: dict[tuple[int, int], int] = {}  # with a clock: bytes each link carried
        self.asynchronous = sc.network.asynchronous
        self.gossip: dict[int, dict] = {}  # under asynchronous gossip, what each client's final record says of it
        self.skipped_busy: dict[int, int] = {}  # and per sender, the models its busy links turned away

    def begin_round(self, r: int, senders: Mapping[int, Sequence[int]]) -> None:
        """Round ``r``'s graph (receiver -> its senders): its links timed on the clock."""
        self.links = [(j, k) for k in sorted(senders) for j in senders[k]]
        if self.clock is not None and not self.asynchronous:  # asynchronous gossip times each step itself (engines/gossip.py)
            self.link_bytes = self.sizes.links(self.links, self.codec, r)
            self.timing = self.clock.round(r, [senders[k] for k in sorted(senders)], self.link_bytes)
            for link in self.timing.planned:
                self.bytes_to[link] = self.bytes_to.get(link, 0) + self.link_bytes[link]

    def aggregated(self, k: int, scores: Mapping[int, float] | None) -> None:
        """Client ``k``'s rule scored ``scores``: with ``network.share_scores`` its next message
        carries them."""
        if self.share_scores:
            self.shared[k] = shareable(scores) or None
            self.sizes.scored[k] = len(self.shared[k] or ())

    def arrived(self, k: int, senders: Sequence[int]) -> list[int]:
        """Of the round's ``senders`` to ``k``, those whose model reached it in time."""
        return sorted(senders) if self.timing is None else list(self.timing.used[k])

    def missing(self, k: int, kept: Iterable[int]) -> list[int] | None:
        """With a clock: whom ``k`` waited for in vain, and what arrived but was not ``kept``
        (refused; ``kept`` is read only here); None without one."""
        if self.timing is None:
            return None
        return sorted({*self.timing.missing[k], *(set(self.timing.used[k]) - set(kept))})

    def rebuild(self, r: int, models: Mapping[int, torch.Tensor]) -> None:
        """Under a compression: the round's honest models (sender -> flat CPU model) as each
        link's receiver rebuilds them."""
        if self.codec is not None:
            carried = self.timing.planned if self.timing is not None else self.links
            self.rebuilt = self.codec.rebuilt(r, models, carried)

    def rows(self, senders: Sequence[int], at: int | Mapping[int, int]) -> torch.Tensor | None:
        """Under a compression, the models of ``senders`` as receiver ``at`` (or, per sender,
        ``at[sender]``) rebuilt them, ``[len(senders), D]``; else None."""
        if self.codec is None or not senders:
            return None
        return torch.stack([self.rebuilt[(j, at[j] if isinstance(at, Mapping) else at)] for j in senders])

    def record(self, k: int) -> dict[str, float | int]:
        """What client ``k``'s round record gains with a clock: the simulated seconds at the
        round's end, the bytes it put on its links."""
        if self.timing is None:
            return {}
        return {"seconds": round(self.clock.now[k], 6), "bytes_sent": sum(self.link_bytes[link] for link in self.timing.planned if link[0] == k)}

    def final(self, k: int) -> dict[str, dict[str, int]]:
        """What client ``k``'s final record gains with a clock: the messages its links lost and
        the bytes each carried (``bytes_to``: receiver -> bytes)."""
        if self.clock is None:
            return {}
        carried = {str(j): size for (i, j), size in sorted(self.bytes_to.items()) if i == k}
        links = {"lost": self.clock.lost_from(k)}
        if self.asynchronous:  # models a busy link turned away (engines/gossip.py)
            links["skipped_busy"] = self.skipped_busy.get(k, 0)
        return {"links": links, "bytes_to": carried, **({"gossip": self.gossip[k]} if k in self.gossip else {})}
