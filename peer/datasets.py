"""The data sets a scenario can name (``data.name``): one registry, one class each.

A data set is a class registered in :data:`DATASET_REGISTRY` (or named by import path
``"module:Class"``, or an installed plugin of the ``dfedrw.datasets`` entry-point group). Its
constructor's keyword parameters are its settings (``[data.NAME]`` in a scenario); ``data_dir``
is supplied from ``data.dir`` to a class that takes it. A built instance says, without loading
anything, what every client (a Byzantine one holds no data) must know:

* ``num_features``: features per sample (images are flattened);
* ``num_classes``: labels are ``0 .. num_classes - 1``;
* ``train_size``: rows of the training set, at most (bounds the size a message may declare);

and ``load()`` returns ``((train_x, train_y), (test_x, test_y))``: float features ``[n, ...]``
(flattened to ``num_features``) and integer labels ``[n]``, as tensors or numpy arrays. The
values are checked against what the instance declared (:func:`load_splits`).

Optional, for the built-in sets: ``check()`` raises :class:`~dfedrw.peer.data.DatasetUnavailable`
without loading (a launcher checks before it starts clients); ``pixels()`` and ``source()``
give uint8 arrays and a description of their origin, which lets the machine-wide cache
(:mod:`peer.datacache`) store the set once for every client process to map; ``folder()`` is a
folder of files the set reads (mounted into containers by ``dfedrw compose``). A set without
``pixels`` is loaded by each process that needs it.

Built in: scikit-learn's 8x8 ``digits`` (offline), and ``fashion-mnist`` and ``mnist`` read
from the standard IDX files in a folder (Debian's ``dataset-fashion-mnist`` for the first;
``dfedrw fetch`` downloads either on a machine online).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from dfedrw.peer.data import Dataset, DatasetUnavailable, read_idx
from dfedrw.peer.registry import Registry, settings_of

if TYPE_CHECKING:
    from dfedrw.peer.config import DataConfig

__all__ = [
    "DATASET_REGISTRY",
    "IDX_FILES",
    "Digits",
    "FashionMNIST",
    "IdxDataset",
    "MNIST",
    "build_dataset",
    "check_dataset",
    "download_idx",
    "idx_digest_error",
    "load_dataset",
    "load_splits",
    "scenario_dataset",
]

DATASET_REGISTRY = Registry("dataset", "dfedrw.datasets", required=("load",), supplied=("data_dir",), calls={"load": ()})
"""The data sets by name; settings in a scenario's ``[data.NAME]``, ``data_dir`` from ``data.dir``."""

# role -> file stem; the same names for MNIST and Fashion-MNIST.
IDX_FILES: dict[str, str] = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

# Digests are (hashlib algorithm, what is hashed: "gz" = the file as served, "idx" = its
# decompressed bytes, hex digest); a file is accepted when it matches any entry of its stem.
Digests = dict[str, tuple[tuple[str, str, str], ...]]


@DATASET_REGISTRY.register("digits")
@dataclass(frozen=True)
class Digits:
    """scikit-learn's 8x8 handwritten digits: 1,797 images, a fixed stratified 80/20 split.

    Always available offline (it ships with scikit-learn). Pixels 0..16 scaled to [0, 1].
    """

    name: ClassVar[str] = "digits"
    num_features: ClassVar[int] = 64
    input_shape: ClassVar[tuple[int, ...]] = (1, 8, 8)
    num_classes: ClassVar[int] = 10
    train_size: ClassVar[int] = 1437
    _TEST_FRACTION: ClassVar[float] = 0.2

    def pixels(self) -> tuple[dict[str, np.ndarray], float]:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        bunch = load_digits()
        x, y = bunch.data.astype(np.uint8), bunch.target.astype(np.uint8)
        if not np.array_equal(x, bunch.data):
            raise ValueError("digits: pixel values are not whole numbers 0..16")
        # random_state is fixed on purpose: the train/test split is part of the data set, not
        # of the scenario, so it must not change with the scenario seed.
        train, test = train_test_split(np.arange(len(y)), test_size=self._TEST_FRACTION, stratify=y, random_state=0)
        train, test = np.sort(train), np.sort(test)
        return {"train_x": x[train], "train_y": y[train], "test_x": x[test], "test_y": y[test]}, 16.0

    def source(self) -> dict[str, Any]:
        from importlib.metadata import version

        return {"name": "digits", "scikit-learn": version("scikit-learn")}

    def load(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        return _scaled(*self.pixels())


@dataclass(frozen=True)
class IdxDataset:
    """A data set stored as the four standard IDX files (``IDX_FILES``, plain or ``.gz``) in a
    folder: ``data_dir``, else the class's ``default_dir``. Subclasses name the set and its
    digests and where it can be downloaded."""

    data_dir: str = ""

    name: ClassVar[str] = ""
    num_features: ClassVar[int] = 784
    input_shape: ClassVar[tuple[int, ...]] = (1, 28, 28)
    num_classes: ClassVar[int] = 10
    train_size: ClassVar[int] = 60_000
    default_dir: ClassVar[str | None] = None
    download_url: ClassVar[str] = ""
    digests: ClassVar[Digests] = {}

    def unavailable_hint(self) -> str:
        return f"set data.dir to a folder with the four IDX files, or run `dfedrw fetch {self.name} --dir DIR` on a machine online"

    def folder(self) -> Path:
        chosen = self.data_dir or self.default_dir
        if not chosen:
            raise DatasetUnavailable(f"{self.name}: no data directory given; {self.unavailable_hint()}")
        directory = Path(chosen)
        if not directory.is_dir():
            raise DatasetUnavailable(f"{self.name}: data directory {directory} does not exist; {self.unavailable_hint()}")
        return directory

    def file(self, role: str) -> Path:
        directory, stem = self.folder(), IDX_FILES[role]
        for candidate in (directory / stem, directory / f"{stem}.gz"):
            if candidate.is_file():
                return candidate
        raise DatasetUnavailable(f"{self.name}: {stem}[.gz] not found in {directory}; {self.unavailable_hint()}")

    def check(self) -> None:
        for role in IDX_FILES:
            self.file(role)

    def source(self) -> dict[str, Any]:
        files = {}
        for role in IDX_FILES:
            stat = self.file(role).stat()
            files[self.file(role).name] = [stat.st_size, stat.st_mtime_ns]
        return {"name": self.name, "folder": str(self.folder().resolve()), "files": files}

    def pixels(self) -> tuple[dict[str, np.ndarray], float]:
        arrays: dict[str, np.ndarray] = {}
        for split in ("train", "test"):
            images_path, labels_path = self.file(f"{split}_images"), self.file(f"{split}_labels")
            images, labels = read_idx(images_path), read_idx(labels_path)
            if images.ndim < 2:
                raise ValueError(f"{images_path}: expected an image array with >= 2 dimensions, got shape {images.shape}")
            if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
                raise ValueError(f"{labels_path}: expected {images.shape[0]} labels to match {images_path}, got shape {labels.shape}")
            if labels.size and (labels.min() < 0 or labels.max() >= self.num_classes):
                raise ValueError(
                    f"{labels_path}: labels must lie in 0..{self.num_classes - 1}, found {labels.min()}..{labels.max()}"
                )
            if images.dtype != np.uint8:
                raise ValueError(f"{images_path}: expected uint8 pixels (type code 0x08), got {images.dtype}")
            arrays[f"{split}_x"] = images.reshape(images.shape[0], -1)
            arrays[f"{split}_y"] = labels.astype(np.uint8)
        return arrays, 255.0

    def load(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        return _scaled(*self.pixels())


@DATASET_REGISTRY.register("fashion-mnist")
@dataclass(frozen=True)
class FashionMNIST(IdxDataset):
    """Fashion-MNIST (Xiao et al. 2017): 28x28 greyscale clothing images, 60,000 + 10,000.

    Read from IDX files: Debian's ``dataset-fashion-mnist`` package, or ``data.dir``.
    """

    name: ClassVar[str] = "fashion-mnist"
    default_dir: ClassVar[str | None] = "/usr/share/datasets/fashion-mnist"
    download_url: ClassVar[str] = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
    # Debian's package recompressed the .gz files (their bytes differ from the mirror's), so
    # the SHA-256 of the decompressed content (identical to the mirror's) is what can be
    # verified offline, next to the MD5 of the mirror's .gz that torchvision checks.
    digests: ClassVar[Digests] = {
        "train-images-idx3-ubyte": (("sha256", "idx", "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"), ("md5", "gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d")),
        "train-labels-idx1-ubyte": (("sha256", "idx", "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"), ("md5", "gz", "25c81989df183df01b3e8a0aad5dffbe")),
        "t10k-images-idx3-ubyte": (("sha256", "idx", "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"), ("md5", "gz", "bef4ecab320f06d8554ea6380940ec79")),
        "t10k-labels-idx1-ubyte": (("sha256", "idx", "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"), ("md5", "gz", "bb300cfdad3c16e7a12a480ee83cd310")),
    }

    def unavailable_hint(self) -> str:
        return "run `apt-get install dataset-fashion-mnist` or set data.dir to a folder with the four IDX files"


@DATASET_REGISTRY.register("mnist")
@dataclass(frozen=True)
class MNIST(IdxDataset):
    """MNIST (LeCun et al. 1998): 28x28 greyscale handwritten digits, 60,000 + 10,000.

    Read from IDX files in ``data.dir`` (no offline package; ``dfedrw fetch mnist --dir DIR``).
    """

    name: ClassVar[str] = "mnist"
    download_url: ClassVar[str] = "https://ossci-datasets.s3.amazonaws.com/mnist/"
    # No SHA-256 of the MNIST files is published: the MD5 sums torchvision checks.
    digests: ClassVar[Digests] = {
        "train-images-idx3-ubyte": (("md5", "gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),),
        "train-labels-idx1-ubyte": (("md5", "gz", "d53e105ee54ea40749a09fcbcd1e9432"),),
        "t10k-images-idx3-ubyte": (("md5", "gz", "9fb629c4189551a2d022fa330f9573f3"),),
        "t10k-labels-idx1-ubyte": (("md5", "gz", "ec29112dd5afa0611ce80d1b7f02629c"),),
    }


def _scaled(arrays: dict[str, np.ndarray], scale: float) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    def split(name: str) -> tuple[np.ndarray, np.ndarray]:
        # uint8 -> float32 is exact and "/ scale" one correctly rounded division: the same
        # values as the cache's rows (peer.datacache).
        return arrays[f"{name}_x"].astype(np.float32) / np.float32(scale), arrays[f"{name}_y"].astype(np.int64)

    return split("train"), split("test")


# ---------------------------------------------------------------------------------------------
# Building and loading


def build_dataset(name: str, params: dict[str, Any] | None = None, data_dir: str | os.PathLike | None = None) -> Any:
    """The data set ``name`` with its settings; ``data_dir`` goes to a class that takes it.
    Raises ``ValueError`` for an unknown name or a bad setting; loads nothing."""
    return DATASET_REGISTRY.build(name, params, {"data_dir": str(data_dir or "")})


def scenario_dataset(data: DataConfig) -> Any:
    """The data set a scenario's ``[data]`` section names, built (nothing loaded)."""
    return _scenario_dataset(data.name, data.params, data.dir)


@functools.lru_cache(maxsize=16)
def _scenario_dataset(name: str, params: tuple, data_dir: str) -> Any:
    return build_dataset(name, settings_of(params, name), data_dir)


def check_dataset(name: str, data_dir: str | os.PathLike | None = None, params: dict[str, Any] | None = None) -> None:
    """Raise :class:`DatasetUnavailable` if ``name`` cannot be loaded, without loading it."""
    check_available(build_dataset(name, params, data_dir))


def check_available(source: Any) -> None:
    """The set's own ``check()`` when it has one (built-in sets: their files are there)."""
    check = getattr(source, "check", None)
    if callable(check):
        check()


def describe(source: Any) -> str:
    """A data set's name for messages: its registered name, else its class."""
    return getattr(source, "name", "") or type(source).__qualname__


def load_splits(source: Any) -> tuple[Dataset, Dataset]:
    """``source.load()`` checked against what the set declares and made :class:`Dataset`\\ s:
    features flattened to ``num_features`` float32, labels int64 in ``0 .. num_classes - 1``,
    at most ``train_size`` training rows. Raises ``ValueError`` naming the set and what is wrong."""
    import torch

    what = describe(source)
    try:
        (train_x, train_y), (test_x, test_y) = source.load()
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValueError) and "not enough values" not in str(exc) and "too many values" not in str(exc):
            raise
        raise ValueError(f"data set {what}: load() must return ((train_x, train_y), (test_x, test_y))") from None
    features, classes = int(source.num_features), int(source.num_classes)

    def dataset(split: str, x: Any, y: Any) -> Dataset:
        x = torch.as_tensor(np.asarray(x))
        y = torch.as_tensor(np.asarray(y))
        if x.ndim < 1 or x.shape[0] != (y.shape[0] if y.ndim == 1 else -1):
            raise ValueError(f"data set {what}: {split} features {tuple(x.shape)} and labels {tuple(y.shape)} do not pair up (one label per row)")
        x = x.reshape(x.shape[0], -1)
        if x.shape[1] != features:
            raise ValueError(f"data set {what}: {split} rows have {x.shape[1]} features, the set declares num_features = {features}")
        if not (x.is_floating_point() or x.dtype == torch.uint8):
            raise ValueError(f"data set {what}: {split} features must be floating point, got {x.dtype}")
        if y.is_floating_point() or y.dtype == torch.bool:
            raise ValueError(f"data set {what}: {split} labels must be integers, got {y.dtype}")
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= classes):
            raise ValueError(f"data set {what}: {split} labels must lie in 0..{classes - 1}, found {int(y.min())}..{int(y.max())}")
        x = x.to(torch.float32)
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"data set {what}: {split} features hold NaN or infinite values")
        return Dataset(x=x.contiguous(), y=y.to(torch.int64), num_classes=classes)

    train, test = dataset("train", train_x, train_y), dataset("test", test_x, test_y)
    if len(train) > int(source.train_size):
        raise ValueError(f"data set {what}: load() gave {len(train)} training rows, more than the set declares (train_size = {int(source.train_size)})")
    if len(test) == 0:
        raise ValueError(f"data set {what}: the test set is empty")
    return train, test


@functools.lru_cache(maxsize=4)
def load_dataset(name: str, data_dir: str | os.PathLike | None = None) -> tuple[Dataset, Dataset]:
    """``(train, test)`` of the data set ``name`` with its default settings.

    Cached per process: clients that share a process share one read-only copy. ``digits``
    ignores ``data_dir``; ``fashion-mnist`` and ``mnist`` read the four IDX files (plain or
    ``.gz``) from ``data_dir``, falling back to their default folder; a missing folder or file
    raises :class:`DatasetUnavailable`. Nothing is downloaded here: see :func:`download_idx`.
    """
    source = build_dataset(name, None, data_dir)
    check_available(source)
    return load_splits(source)


# ---------------------------------------------------------------------------------------------
# The online path for IDX sets


def _idx_class(name: str) -> type[IdxDataset]:
    downloadable = {n: DATASET_REGISTRY.resolve(n) for n in DATASET_REGISTRY.builtin_names()}
    downloadable = {n: c for n, c in downloadable.items() if isinstance(c, type) and issubclass(c, IdxDataset) and c.download_url}
    if name not in downloadable:
        raise ValueError(f"dataset {name!r} cannot be downloaded; valid choices: {', '.join(downloadable)}")
    return downloadable[name]


def _digest(path: Path, algorithm: str, of: str) -> str:
    h = hashlib.new(algorithm)
    opener = gzip.open if of == "idx" else open
    with opener(path, "rb") as handle:
        while block := handle.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def idx_digest_error(name: str, stem: str, path: str | os.PathLike) -> str | None:
    """None if the gzipped file ``path`` matches a known digest of ``name``'s ``stem`` (the
    class's ``digests``), else a one-line description of the mismatch."""
    path = Path(path)
    seen = []
    for algorithm, of, expected in _idx_class(name).digests[stem]:
        try:
            got = _digest(path, algorithm, of)
        except (OSError, EOFError, gzip.BadGzipFile):  # "idx" of a file that is not gzip
            got = "unreadable"
        if got == expected:
            return None
        seen.append(f"{algorithm} of the {'decompressed ' if of == 'idx' else ''}file {got}, expected {expected}")
    return "; ".join(seen)


def download_idx(name: str, data_dir: str | os.PathLike, base_url: str | None = None, timeout: float = 60.0) -> None:
    """Download the four gzipped IDX files of ``name`` into ``data_dir`` (the online path).

    ``base_url`` defaults to the class's ``download_url``. Files already present (plain or
    ``.gz``) are kept. Each file is written under a temporary name, checked against the
    class's digests and with :func:`read_idx`, then renamed, so an interrupted, corrupt or
    substituted download leaves nothing that :func:`load_dataset` would pick up; a checksum
    mismatch raises ValueError naming the file.
    """
    base = base_url if base_url is not None else _idx_class(name).download_url
    if not base.endswith("/"):
        base += "/"
    directory = Path(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    for stem in IDX_FILES.values():
        if (directory / stem).is_file() or (directory / f"{stem}.gz").is_file():
            continue
        target = directory / f"{stem}.gz"
        fd, tmp_name = tempfile.mkstemp(prefix=f".{stem}.", suffix=".part", dir=directory)
        try:
            url = base + target.name
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
            mismatch = idx_digest_error(name, stem, tmp_name)
            if mismatch is not None:
                raise ValueError(f"{name}: {url} failed its checksum and was deleted ({mismatch})")
            read_idx(tmp_name)
            os.replace(tmp_name, target)
        finally:
            if os.path.exists(tmp_name):
                os.remove(tmp_name)


def input_shape_of(source: Any) -> tuple[int, ...]:
    """The shape of one sample of a built data set: its ``input_shape`` (``(channels, height,
    width)`` for images), checked against ``num_features``, or ``(num_features,)`` when it
    declares none. Raises ``ValueError`` naming the set when the two disagree."""
    features = int(source.num_features)
    declared = getattr(source, "input_shape", None)
    if declared is None:
        return (features,)
    try:
        shape = tuple(int(n) for n in declared)
    except (TypeError, ValueError):
        raise ValueError(f"data set {describe(source)}: input_shape must be a tuple of positive integers, got {declared!r}") from None
    if not shape or any(n < 1 for n in shape) or int(np.prod(shape)) != features:
        raise ValueError(f"data set {describe(source)}: input_shape {shape} does not hold its num_features = {features} values")
    return shape


def source_key(source: Any) -> tuple[str, dict[str, Any]]:
    """(key, description) of where a cacheable set's values come from (see :mod:`peer.datacache`)."""
    description = source.source()
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]
    return key, description
