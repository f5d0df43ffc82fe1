"""Helpers shared by the tests: waiting for a condition, a console that prints nowhere, a
network of clients run as threads of the test process, and IDX files made by the tests."""

from __future__ import annotations

import gzip
import os
import struct
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from rich.console import Console

from dfedrw.peer.datasets import IDX_FILES


def wait_for(predicate: Callable[[], object], timeout: float, what: str, step: float = 0.2, detail: Callable[[], str] | None = None) -> None:
    """Polls ``predicate`` every ``step`` seconds until it is true; fails naming ``what`` (and
    ``detail()``, if given) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}" + (f"\n{detail()}" if detail else ""))


def quiet_console() -> Console:
    """A rich Console that prints nowhere."""
    return Console(file=open(os.devnull, "w"))


def loopback_grpc(scenario, certs):
    """Client ``k``'s gRPC transport on 127.0.0.1 (any free port) with its certificate from
    ``certs`` (made by ``make_certificates``)."""
    from dfedrw.peer.identity import load_identity
    from dfedrw.peer.wiring import grpc_transport_for

    return lambda k: grpc_transport_for(scenario, "127.0.0.1", 0, identity=load_identity(certs, k))


class ClientThreads:
    """One Client per id (all of the scenario's by default), each on ``transport_for(k)``,
    started and listening; ``start()`` runs each in a thread of this process (connect, then
    run), ``join()`` waits for them and closes every client, ``check()`` fails on a client's
    exception or a client still running."""

    def __init__(self, scenario, out_dir, transport_for, ids=None):
        from dfedrw.peer.node import Client

        ids = range(scenario.num_clients) if ids is None else ids
        self.peers = {k: Client(scenario, k, out_dir, transport=transport_for(k)) for k in ids}
        self.addresses = {k: p.start() for k, p in self.peers.items()}
        self.finals: dict[int, dict] = {}
        self.errors: list[tuple[int, Exception]] = []
        self.threads: list[threading.Thread] = []

    def _client(self, k):
        try:
            self.peers[k].connect(self.addresses)
            self.finals[k] = self.peers[k].run()
        except Exception as exc:  # surfaced by check()
            self.errors.append((k, exc))

    def start(self) -> None:
        self.threads = [threading.Thread(target=self._client, args=(k,), daemon=True) for k in self.peers]
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout=timeout)
        for p in self.peers.values():
            p.close()

    def check(self) -> None:
        assert not self.errors, self.errors
        assert all(not t.is_alive() for t in self.threads), "a client hung"


def run_job(cmd: list, *, cwd, timeout: float, env: dict | None = None) -> tuple[int, str]:
    """Run ``cmd`` (e.g. a torchrun job) in its own session to completion, bounded by
    ``timeout`` seconds; the whole session is killed if it outlives it. Returns (exit status,
    stdout and stderr together)."""
    import signal
    import subprocess

    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return proc.returncode, output


def read_scalars(folder) -> dict[str, dict[int, float]]:
    """The scalars of the TensorBoard event files in ``folder``, read back with TensorBoard's
    own loader: tag -> step -> value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def check_tensorboard(out, log_dir, scenario) -> None:
    """The event files under ``log_dir`` hold what the round logs of the run in ``out`` say:
    per honest client every record's train loss, accuracies, Byzantine weight share and weight
    per candidate at step = round, and per round their mean over the honest clients; no folder
    for a Byzantine client."""
    import numpy as np
    import pytest

    from dfedrw.peer.plan import scenario_topology
    from dfedrw.peer.results import read_rounds

    topology = scenario_topology(scenario)
    honest = [k for k in range(topology.num_clients) if k not in topology.byzantine]
    assert sorted(p.name for p in log_dir.iterdir()) == sorted([*(f"client-{k}" for k in honest), "honest-mean"])
    per_round: dict[int, dict[str, list[float]]] = {}
    for k in honest:
        records = read_rounds(out, k)
        assert len(records) == scenario.rounds
        expected: dict[str, dict[int, float]] = {}
        for rec in records:
            r = rec["round"]
            values = {"train_loss": rec["train_loss"], **{f"weight/{s}": w for s, w in rec["weights"].items()}}
            if topology.byzantine:
                values["byzantine_weight_share"] = sum(w for s, w in rec["weights"].items() if int(s) in topology.byzantine)
            for key in ("accuracy", "global_accuracy"):
                if key in rec:
                    values[key] = rec[key]
            for tag, v in values.items():
                expected.setdefault(tag, {})[r] = v
                if not tag.startswith("weight/"):
                    per_round.setdefault(r, {}).setdefault(tag, []).append(v)
        got = read_scalars(log_dir / f"client-{k}")
        assert got.keys() == expected.keys(), k
        for tag in expected:
            assert got[tag] == pytest.approx(expected[tag], rel=1e-6, abs=1e-7), (k, tag)
    mean: dict[str, dict[int, float]] = {}
    for r, tags in per_round.items():
        for tag, vs in tags.items():
            mean.setdefault(tag, {})[r] = float(np.mean(vs))
    got = read_scalars(log_dir / "honest-mean")
    assert got.keys() == mean.keys()
    for tag in mean:
        assert got[tag] == pytest.approx(mean[tag], rel=1e-6, abs=1e-7), tag


_IDX_CODES = {np.dtype("u1"): 0x08, np.dtype("i1"): 0x09, np.dtype(">i2"): 0x0B,
              np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}


def idx_bytes(array: np.ndarray) -> bytes:
    """Encode ``array`` in the IDX format (independent of the reader under test)."""
    big = array.astype(array.dtype.newbyteorder(">")) if array.dtype.itemsize > 1 else array
    header = bytes([0, 0, _IDX_CODES[big.dtype], array.ndim])
    header += b"".join(struct.pack(">i", d) for d in array.shape)
    return header + big.tobytes()


def write_idx(path: Path, array: np.ndarray, compress: bool) -> Path:
    data = idx_bytes(array)
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def write_idx_dataset(directory: Path, compress: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {
        "train_images": rng.integers(0, 256, size=(12, 28, 28), dtype=np.uint8),
        "train_labels": np.arange(12, dtype=np.uint8) % 10,
        "test_images": rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8),
        "test_labels": np.array([9, 0, 1, 2, 3], dtype=np.uint8),
    }
    arrays["train_images"][0, 0, 0] = 255
    for role, stem in IDX_FILES.items():
        write_idx(directory / stem, arrays[role], compress)
    return arrays


def cifar_records(count: int, label_classes: tuple[int, ...], seed: int) -> np.ndarray:
    """``count`` random CIFAR binary records: a label byte per entry of ``label_classes`` (each
    below its class count), then 3,072 pixel bytes."""
    rng = np.random.default_rng(seed)
    records = rng.integers(0, 256, size=(count, len(label_classes) + 3072), dtype=np.uint8)
    for byte, classes in enumerate(label_classes):
        records[:, byte] = rng.integers(0, classes, size=count)
    return records


def write_cifar(folder: Path, files: tuple[str, ...], label_classes: tuple[int, ...], count: int = 3) -> dict[str, np.ndarray]:
    """Each of ``files`` in ``folder`` with ``count`` records of its own (see
    :func:`cifar_records`); returns the records by file name."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for i, name in enumerate(files):
        written[name] = cifar_records(count, label_classes, seed=i)
        (folder / name).write_bytes(written[name].tobytes())
    return written


def tar_gz(archive: Path, members: dict[str, bytes]) -> Path:
    """A gzipped tar ``archive`` holding ``members`` (member name -> bytes)."""
    import io
    import tarfile

    with tarfile.open(archive, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


def write_leaf(folder: Path, files: dict[str, dict[str, tuple[np.ndarray, list[int]]]]) -> None:
    """LEAF JSON files under ``folder``: ``files`` maps a path such as ``train/a.json`` to its
    writers, each ``(grey levels uint8 [n, 784], labels)``, written as LEAF does (level / 255)."""
    import json

    for relative, writers in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        user_data = {user: {"x": (levels / 255).tolist(), "y": list(labels)} for user, (levels, labels) in writers.items()}
        content = {"users": list(writers), "num_samples": [len(labels) for _, labels in writers.values()], "user_data": user_data}
        path.write_text(json.dumps(content))


def leaf_writer(count: int, seed: int) -> tuple[np.ndarray, list[int]]:
    """A writer's ``count`` random samples: grey levels and labels 0..61."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(count, 784), dtype=np.uint8), [int(v) for v in rng.integers(0, 62, size=count)]


def write_image_idx(directory: Path, *, train: int = 400, test: int = 100, seed: int = 0) -> Path:
    """A small MNIST-layout data set (28x28 grey images, 10 classes, random pixels) as the four
    IDX files in ``directory``, for runs of the image models on files the tests write."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_images": rng.integers(0, 256, size=(train, 28, 28), dtype=np.uint8),
        "train_labels": (np.arange(train) % 10).astype(np.uint8),
        "test_images": rng.integers(0, 256, size=(test, 28, 28), dtype=np.uint8),
        "test_labels": (np.arange(test) % 10).astype(np.uint8),
    }
    for role, stem in IDX_FILES.items():
        write_idx(directory / stem, arrays[role], compress=False)
    return directory
