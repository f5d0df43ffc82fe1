"""TensorBoard event files of a run (``--tensorboard DIR``)::

    DIR/client-<k>/     honest client k, written by its round log as each round is logged
    DIR/honest-mean/    the mean over the honest clients, written when the run ends from the
                        round logs (``peers/<id>.jsonl``), the same for every engine

Each round record becomes scalars at step = round: ``train_loss``; ``accuracy`` and
``global_accuracy`` on evaluation rounds (and ``attack_success`` under a backdoor attack);
``byzantine_weight_share``, the total weight the client gave Byzantine senders that round (only in
scenarios with Byzantine clients; its mean over clients and rounds is the summary's
``byzantine_weight_share``); and, per client only, ``weight/<id>``: the weight it gave each
candidate, its own model included. Byzantine clients get no folder.

The files are written with the ``tensorboard`` package (the ``tensorboard`` extra), imported only
when a writer is made: without ``--tensorboard`` nothing imports it."""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

INSTALL = "pip install 'dfedrw[tensorboard]'"
MEAN_DIR = "honest-mean"
# What the honest mean averages; the weights are per neighbour, so they have no mean.
MEAN_TAGS = ("train_loss", "accuracy", "global_accuracy", "attack_success", "byzantine_weight_share")

# Tells apart event files one process opens in one folder within one second.
_file_numbers = itertools.count()


class TensorBoardUnavailable(RuntimeError):
    """``--tensorboard`` was given, but the tensorboard package is not installed."""


def require_tensorboard() -> None:
    """Raise :class:`TensorBoardUnavailable`, naming the extra, when tensorboard cannot be imported."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise TensorBoardUnavailable(f"--tensorboard needs the tensorboard package: {INSTALL}") from None


def client_dir(log_dir: Path, client_id: int) -> Path:
    return Path(log_dir) / f"client-{client_id}"


def check_fresh_event_dir(log_dir: Path, client_ids: Iterable[int], *, mean: bool = True) -> None:
    """Raise FileExistsError when the folders a run would write under ``log_dir`` (the clients' and,
    with ``mean``, the honest mean's) hold event files: TensorBoard would draw two runs as one."""
    if Path(log_dir).exists() and not Path(log_dir).is_dir():
        raise NotADirectoryError(f"--tensorboard {log_dir} is not a folder")
    folders = [client_dir(log_dir, k) for k in client_ids] + ([Path(log_dir) / MEAN_DIR] if mean else [])
    found = [f.name for f in folders if f.is_dir() and any(f.glob("events.out.tfevents.*"))]
    if found:
        raise FileExistsError(
            f"{log_dir} holds TensorBoard event files of an earlier run ({', '.join(found[:3])}{', ...' if len(found) > 3 else ''}); "
            "choose another --tensorboard (or delete the folder)"
        )


def record_scalars(record: Mapping[str, Any], byzantine: Collection[int]) -> dict[str, float]:
    """An honest client's round record as TensorBoard scalars, tag -> value."""
    scalars = {key: float(record[key]) for key in ("train_loss", "accuracy", "global_accuracy", "attack_success") if record.get(key) is not None}
    weights = record.get("weights") or {}
    if byzantine:
        scalars["byzantine_weight_share"] = float(sum(w for s, w in weights.items() if int(s) in byzantine))
    for sender in sorted(weights, key=int):
        scalars[f"weight/{sender}"] = float(weights[sender])
    return scalars


def honest_mean(records: Iterable[Iterable[Mapping[str, Any]]], byzantine: Collection[int]) -> dict[int, dict[str, float]]:
    """Per round, the mean of each of :data:`MEAN_TAGS` over the honest clients that report it."""
    values: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for client_records in records:
        for record in client_records:
            if not isinstance(record.get("round"), int):
                continue
            for tag, value in record_scalars(record, byzantine).items():
                if tag in MEAN_TAGS:
                    values[record["round"]][tag].append(value)
    return {r: {tag: float(np.mean(v)) for tag, v in tags.items()} for r, tags in sorted(values.items())}


class EventFile:
    """One TensorBoard event file in ``folder``, written as the caller goes (no writer thread:
    the batched engine keeps one per client). ``restart_at``: the run goes on from a checkpoint
    at that step, so TensorBoard drops what earlier files hold from that step on."""

    def __init__(self, folder: Path, *, restart_at: int | None = None) -> None:
        require_tensorboard()
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event, self._summary = event_pb2, summary_pb2
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_file_numbers)}"
        self._records = RecordWriter((folder / name).open("xb"))
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        if restart_at is not None:
            self._write(event_pb2.Event(wall_time=time.time(), step=restart_at, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
        self.flush()

    def _write(self, event) -> None:
        self._records.write(event.SerializeToString())

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """One event holding every value of ``values`` (tag -> value) at ``step``."""
        summary = self._summary.Summary(value=[self._summary.Summary.Value(tag=t, simple_value=v) for t, v in values.items()])
        self._write(self._event.Event(wall_time=time.time(), step=step, summary=summary))

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.close()


class ClientScalars:
    """Honest client ``client_id``'s round records as scalars in ``log_dir/client-<id>/``; owned and
    written by a :class:`~dfedrw.peer.results.records.RoundLog` given a TensorBoard folder."""

    def __init__(self, log_dir: Path, client_id: int, byzantine: Collection[int], *, restart_at: int | None = None) -> None:
        self.byzantine = frozenset(byzantine)
        self._file = EventFile(client_dir(log_dir, client_id), restart_at=restart_at)

    def write(self, record: Mapping[str, Any]) -> None:
        self._file.scalars(int(record["round"]), record_scalars(record, self.byzantine))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def write_honest_mean(log_dir: Path, records: Iterable[Iterable[Mapping[str, Any]]], byzantine: Collection[int]) -> Path:
    """Write :func:`honest_mean` of ``records`` to ``log_dir/honest-mean/``; returns that folder."""
    folder = Path(log_dir) / MEAN_DIR
    events = EventFile(folder)
    try:
        for r, values in honest_mean(records, byzantine).items():
            events.scalars(r, values)
    finally:
        events.close()
    return folder
