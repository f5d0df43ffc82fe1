"""torch.distributed transport: model messages as point-to-point send/recv between the ranks
of one torchrun job (gloo on CPU, NCCL on GPU). Only valid under torchrun, where client id =
rank and every client is a rank of the one default process group.

Framing: a message is one ``ModelChunk``'s protobuf bytes (``serde.encode``'s chunks joined),
sent as two tensors: its length (int64, one element), then the bytes (uint8; on the GPU for
NCCL); a length of 0 is the end-of-stream sentinel a client sends each neighbour when it closes.
The receiver parses the bytes (``ModelChunk.FromString``) and hands the chunk to the client's
``deliver``: the same validation as over gRPC, and never pickle.

Threads: per neighbour one sender thread fed by a queue (messages to one peer stay in order) and
one receiver thread (recv length, recv payload, deliver). Each direction of each edge has its own
two-rank process group, carrying one ordered stream between one sending and one receiving
thread: NCCL runs all work of a communicator on one stream, and sends in both directions on one
communicator can wait on each other forever.

Against gRPC it gives up a per-round deadline that unblocks a recv from a silent peer (the round
loop keeps its deadline, as it waits on the inbox, but the receive thread stays blocked until that
peer sends or the group timeout passes); surviving a crashed peer (torchrun stops every rank when
one fails, and a timed-out NCCL operation aborts the process); late joiners and restarted clients
(all ranks are in one process group from the start); and ranks sharing GPUs under NCCL, which needs
one GPU per rank (the launcher then hands this transport a CPU device, gloo)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from google.protobuf.message import DecodeError

from dfedrw.peer.transport.base import Deliver, Reachability
from dfedrw.peer.transport.framing import FRAMING
from dfedrw.peer.transport.pb import peer_pb2 as pb

log = logging.getLogger(__name__)


class FrameError(ValueError):
    """The length a peer announced cannot be a message: the stream is out of step."""


def address_of(rank: int) -> str:
    """The address a client advertises on this transport (the rank is all a sender needs)."""
    return f"torch:{rank}"


def frame(chunks: Sequence[pb.ModelChunk]) -> bytes:
    """One message as bytes: ``serde.encode``'s chunks joined into one ``ModelChunk``."""
    if not chunks:
        raise ValueError("a message needs at least one chunk")
    if len(chunks) == 1:
        return chunks[0].SerializeToString()
    one = pb.ModelChunk()
    one.CopyFrom(chunks[0])
    one.data = b"".join(c.data for c in chunks)
    return one.SerializeToString()


def unframe(payload: bytes) -> pb.ModelChunk:
    """Parse a received message; raises ``DecodeError`` on bytes that are no ModelChunk."""
    return pb.ModelChunk.FromString(payload)


def length_tensor(size: int, device: torch.device) -> torch.Tensor:
    """The first tensor of a message: its byte count (0 = end of stream)."""
    return torch.tensor([size], dtype=torch.int64, device=device)


def payload_tensor(data: bytes, device: torch.device) -> torch.Tensor:
    """The second tensor of a message: its bytes as uint8."""
    # bytearray: torch.frombuffer wants a writable buffer.
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)


def payload_bytes(tensor: torch.Tensor) -> bytes:
    """The bytes a received uint8 tensor holds."""
    return tensor.cpu().numpy().tobytes()


def checked_length(size: int, limit: int) -> int:
    """The announced byte count, if a message of that size may be received."""
    if size < 0 or size > limit:
        raise FrameError(f"announced message of {size} bytes (limit {limit})")
    return size


def directed_groups(edges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(sender, receiver) of every process group to create, in the order all ranks create them:
    ``new_group`` is collective over the whole job and must be called in the same order
    everywhere, so the order depends on the graph alone."""
    out: list[tuple[int, int]] = []
    for a, b in sorted({(min(u, v), max(u, v)) for u, v in edges}):
        out += [(a, b), (b, a)]
    return out


class TorchDistTransport:
    """A :class:`~peer.transport.base.Transport` over ``torch.distributed`` point-to-point.

    ``edges`` is the whole communication graph: the topology's edges and, when Byzantine clients
    collude, every pair of colluders (every rank creates the same process groups); ``timeout``
    bounds every send and receive; ``max_messages`` is the most a neighbour sends in a run (its
    rounds); ``linger`` bounds how long ``close`` waits for the neighbours' end of stream."""

    def __init__(
        self,
        rank: int,
        edges: Iterable[tuple[int, int]],
        *,
        device: torch.device | str = "cpu",
        timeout: float = 1800.0,
        max_message_bytes: int = 256 << 20,
        max_messages: int = 1 << 30,
        linger: float = 120.0,
        max_queued: int = 16,
    ) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "network.transport = 'torch' needs an initialised torch.distributed process group: "
                "start the clients with torchrun (torchrun --nproc-per-node N -m dfedrw.launch.torchrun --scenario FILE)"
            )
        self.rank = rank
        self.device = torch.device(device)
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        # Why the backend is not the one the device would take (set by the launcher), or None.
        self.backend_note: str | None = None
        self.edges = [(int(u), int(v)) for u, v in edges]
        self.timeout = timeout
        self.max_frame_bytes = max_message_bytes + FRAMING
        self.max_messages = max_messages
        self.linger = linger
        self.max_queued = max_queued
        self.bytes_sent = 0
        self.dropped = 0  # messages not sent because the neighbour's queue was full
        self.skipped_stale = 0  # no replies on this transport: it never learns a receiver's round
        self.malformed = 0  # received messages that were no ModelChunk
        self._deliver: Deliver | None = None
        self._on_reachability: Reachability = lambda peer, state: None
        self._lock = threading.Condition()
        self._queues: dict[int, deque] = {}
        self._unsent = 0
        self._dead: set[int] = set()
        self._closing = False
        self._senders: dict[int, threading.Thread] = {}
        self._receivers: dict[int, threading.Thread] = {}

    # -- Transport ---------------------------------------------------------------------
    def start(self, deliver: Deliver) -> str:
        self._deliver = deliver
        return address_of(self.rank)

    def connect(self, addresses: Mapping[int, str], on_reachability: Reachability) -> None:
        if self._deliver is None:
            raise RuntimeError("start() before connect()")
        for peer, address in addresses.items():
            if address != address_of(peer):
                raise ValueError(
                    f"neighbour {peer} advertised {address!r}, not {address_of(peer)!r}: "
                    "every client of a torchrun job must use network.transport = 'torch'"
                )
        neighbours = {k for u, v in self.edges for k in (u, v) if self.rank in (u, v) and k != self.rank}
        missing = sorted(neighbours - set(addresses))
        if missing:
            raise RuntimeError(f"the torch transport needs every neighbour up; no address from {missing}")
        self._on_reachability = on_reachability
        send_groups, recv_groups = {}, {}
        # Every rank takes part in every new_group call (non-members get a placeholder back).
        for src, dst in directed_groups(self.edges):
            group = dist.new_group([src, dst], backend=self.backend, timeout=timedelta(seconds=self.timeout))
            if src == self.rank:
                send_groups[dst] = group
            elif dst == self.rank:
                recv_groups[src] = group
        for peer in sorted(neighbours):
            self._queues[peer] = deque()
            self._senders[peer] = threading.Thread(
                target=self._send_loop, args=(peer, send_groups[peer]), name=f"torch-send-{peer}", daemon=True
            )
            self._receivers[peer] = threading.Thread(
                target=self._recv_loop, args=(peer, recv_groups[peer]), name=f"torch-recv-{peer}", daemon=True
            )
        for thread in (*self._senders.values(), *self._receivers.values()):
            thread.start()

    def wait_ready(self, timeout: float) -> list[int]:
        # connect() created a process group with each neighbour, which both ranks join.
        return []

    def send(self, to: int, chunks: list[pb.ModelChunk]) -> None:
        data = frame(chunks)
        with self._lock:
            queue = self._queues.get(to)
            if queue is None or to in self._dead or self._closing:
                return
            if len(queue) >= self.max_queued:
                # The neighbour stopped receiving; a message this late would be stale anyway.
                self.dropped += 1
                log.debug("queue to %d full; message dropped", to)
                return
            queue.append(data)
            self._unsent += 1
            self.bytes_sent += len(data)
            self._lock.notify_all()

    def flush(self, timeout: float) -> None:
        with self._lock:
            self._lock.wait_for(lambda: self._unsent == 0, timeout)

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        deadline = time.monotonic() + self.linger
        # Senders send what is queued, then the end-of-stream sentinel; receivers end on the
        # neighbours' sentinels, i.e. once every neighbour has finished too.
        stuck = []
        for peer, thread in (*self._senders.items(), *self._receivers.items()):
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                stuck.append(thread.name)
        if stuck:
            log.warning("client %d: transport threads still blocked after %.0f s: %s", self.rank, self.linger, ", ".join(stuck))

    # -- threads -----------------------------------------------------------------------
    def _bind_device(self) -> None:
        # The current CUDA device is per thread; NCCL work runs on the current device.
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def _send_loop(self, peer: int, group) -> None:
        self._bind_device()
        queue = self._queues[peer]
        while True:
            with self._lock:
                # Woken by send() or close(); the timeout only re-checks for a lost wake-up.
                while not queue and not self._closing:
                    self._lock.wait(1.0)
                data = queue.popleft() if queue else None
            try:
                if data is None:  # closing and nothing left: end of stream
                    dist.send(length_tensor(0, self.device), dst=peer, group=group)
                    if self.device.type == "cuda":
                        # NCCL sends return once queued; the group must outlive this one.
                        torch.cuda.current_stream(self.device).synchronize()
                    return
                dist.send(length_tensor(len(data), self.device), dst=peer, group=group)
                dist.send(payload_tensor(data, self.device), dst=peer, group=group)
            except RuntimeError as exc:  # DistError and backend errors derive from it
                log.warning("client %d: sending to %d failed, no longer sending to it: %s", self.rank, peer, exc)
                with self._lock:
                    self._dead.add(peer)
                    self._unsent -= len(queue) + (data is not None)
                    queue.clear()
                    self._lock.notify_all()
                self._on_reachability(peer, "unreachable")
                return
            with self._lock:
                self._unsent -= 1
                self._lock.notify_all()

    def _recv_loop(self, peer: int, group) -> None:
        self._bind_device()
        deliver = self._deliver
        try:
            # One more than the messages a neighbour sends in a run: its end-of-stream sentinel.
            for _ in range(self.max_messages + 1):
                length = length_tensor(0, self.device)
                dist.recv(length, src=peer, group=group)
                size = checked_length(int(length.item()), self.max_frame_bytes)
                if size == 0:
                    return  # the neighbour has closed
                payload = torch.empty(size, dtype=torch.uint8, device=self.device)
                dist.recv(payload, src=peer, group=group)
                try:
                    chunk = unframe(payload_bytes(payload))
                except DecodeError:
                    with self._lock:
                        self.malformed += 1
                    log.warning("client %d: %d sent %d bytes that are no ModelChunk", self.rank, peer, size)
                    continue
                deliver(iter((chunk,)), peer)  # the rank it came from, not the one it claims
            log.warning("client %d: %d sent more than %d messages; no longer receiving from it", self.rank, peer, self.max_messages)
        except FrameError as exc:
            log.warning("client %d: stream from %d out of step, no longer receiving from it: %s", self.rank, peer, exc)
        except RuntimeError as exc:
            log.warning("client %d: receiving from %d failed, no longer receiving from it: %s", self.rank, peer, exc)
        self._on_reachability(peer, "unreachable")
