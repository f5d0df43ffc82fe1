"""Data set files written by the tests in the formats the readers take (IDX, CIFAR binary
records, LEAF JSON, gzipped tar archives), encoded independently of the readers under test."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from dfedrw.peer.learning.datasets import IDX_FILES


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
