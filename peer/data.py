"""Datasets, client partitions, local test sets and auxiliary subsets.

Three datasets are known: scikit-learn's 8x8 ``digits`` (always available offline),
``fashion-mnist`` and ``mnist`` (standard IDX files in a directory). Partitions follow the
paper's "Experimental Settings": IID, Dirichlet(alpha) and LabelSkew(h). Every randomised
function takes an explicit seed; nothing here touches global RNG state or writes to disk
(except :func:`download_idx`, the one online path, which is never called implicitly).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import math
import numbers
import os
import re
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

__all__ = [
    "DATASETS",
    "DEFAULT_DIRS",
    "DOWNLOAD_BASE_URLS",
    "IDX_DIGESTS",
    "IDX_FILES",
    "PARTITION_FORMS",
    "Dataset",
    "DatasetUnavailable",
    "aux_indices",
    "download_idx",
    "load_dataset",
    "local_test_indices",
    "parse_partition",
    "partition",
    "read_idx",
]

DATASETS = ("digits", "fashion-mnist", "mnist")

# Debian's ``dataset-fashion-mnist`` package installs here; MNIST has no offline package.
DEFAULT_DIRS: dict[str, str | None] = {
    "fashion-mnist": "/usr/share/datasets/fashion-mnist",
    "mnist": None,
}

# The usual public mirrors; only download_idx reads these.
DOWNLOAD_BASE_URLS: dict[str, str] = {
    "fashion-mnist": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "mnist": "https://ossci-datasets.s3.amazonaws.com/mnist/",
}

# role -> file stem; the same names for MNIST and Fashion-MNIST.
IDX_FILES: dict[str, str] = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

# The known digests of the standard files; download_idx accepts a file that matches any of its
# entries and deletes one that matches none. An entry is (hashlib algorithm, what is hashed:
# "gz" = the file as served, "idx" = its decompressed bytes, hex digest). No SHA-256 of the
# MNIST files is published, so MNIST has the MD5 sums torchvision checks against the same
# files. Debian's dataset-fashion-mnist recompressed the .gz files (their bytes differ from the
# mirror's), so for Fashion-MNIST the SHA-256 of the decompressed content (computed from the
# Debian files, identical to the mirror's) is what can be verified offline, next to the MD5 of
# the mirror's .gz that torchvision checks.
IDX_DIGESTS: dict[str, dict[str, tuple[tuple[str, str, str], ...]]] = {
    "mnist": {
        "train-images-idx3-ubyte": (("md5", "gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),),
        "train-labels-idx1-ubyte": (("md5", "gz", "d53e105ee54ea40749a09fcbcd1e9432"),),
        "t10k-images-idx3-ubyte": (("md5", "gz", "9fb629c4189551a2d022fa330f9573f3"),),
        "t10k-labels-idx1-ubyte": (("md5", "gz", "ec29112dd5afa0611ce80d1b7f02629c"),),
    },
    "fashion-mnist": {
        "train-images-idx3-ubyte": (
            ("sha256", "idx", "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"),
            ("md5", "gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
        ),
        "train-labels-idx1-ubyte": (
            ("sha256", "idx", "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"),
            ("md5", "gz", "25c81989df183df01b3e8a0aad5dffbe"),
        ),
        "t10k-images-idx3-ubyte": (
            ("sha256", "idx", "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"),
            ("md5", "gz", "bef4ecab320f06d8554ea6380940ec79"),
        ),
        "t10k-labels-idx1-ubyte": (
            ("sha256", "idx", "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"),
            ("md5", "gz", "bb300cfdad3c16e7a12a480ee83cd310"),
        ),
    },
}

PARTITION_FORMS = ("iid", "dirichlet:ALPHA (ALPHA > 0)", "labelskew:H (1 <= H <= num_classes)")

# IDX type code -> big-endian numpy dtype (format by LeCun et al., the MNIST page).
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_IDX_NUM_CLASSES = 10
_DIGITS_TEST_FRACTION = 0.2
# Training-set size of each dataset (digits: 1797 images less the 20% test split; the MNIST
# files: 60,000 training images). Every client knows these without loading any data: they bound
# the training-set size a message may declare.
TRAIN_SIZES = {"digits": 1437, "fashion-mnist": 60_000, "mnist": 60_000}
# Bounded so that an impossible request (e.g. more clients than samples allow) fails fast.
DIRICHLET_MAX_TRIES = 1000


@dataclass(frozen=True)
class Dataset:
    """Features and labels held as tensors.

    ``x`` is float32 ``[n, features]`` with pixel values scaled to [0, 1] and images
    flattened; ``y`` is int64 ``[n]`` with values in ``0 .. num_classes - 1``.
    """

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int

    def __post_init__(self) -> None:
        if self.x.ndim != 2:
            raise ValueError(f"Dataset.x must be 2-D [n, features], got shape {tuple(self.x.shape)}")
        if self.y.ndim != 1 or self.y.shape[0] != self.x.shape[0]:
            raise ValueError(
                f"Dataset.y must be 1-D with {self.x.shape[0]} entries, got shape {tuple(self.y.shape)}"
            )
        if self.num_classes < 1:
            raise ValueError(f"Dataset.num_classes must be >= 1, got {self.num_classes}")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, idx: Sequence[int] | np.ndarray | torch.Tensor) -> "Dataset":
        """Return the rows ``idx`` (any integer index sequence) as a new Dataset."""
        index = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        return Dataset(x=self.x[index], y=self.y[index], num_classes=self.num_classes)


class DatasetUnavailable(RuntimeError):
    """The dataset's files are not on this machine; the message says how to get them."""


def _check_dataset_name(name: str) -> None:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid choices: {', '.join(DATASETS)}")


# ---------------------------------------------------------------------------------------------
# IDX files


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (plain or gzip-compressed) into a numpy array.

    Header: two zero bytes, a type code (0x08 ubyte, 0x09 byte, 0x0B int16, 0x0C int32,
    0x0D float32, 0x0E float64), the number of dimensions, then each dimension as a
    big-endian int32; the data follow in C order, big-endian. The returned array has native
    byte order. A bad magic number, unknown type code or truncated/overlong body raises
    ValueError naming the file.
    """
    path = Path(path)
    with open(path, "rb") as handle:
        raw = handle.read()
    # Detect gzip by content rather than by name so a renamed file still loads.
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ValueError(f"{path}: corrupt or truncated gzip data ({exc})") from exc
    if len(raw) < 4:
        raise ValueError(f"{path}: too short for an IDX header ({len(raw)} bytes, need at least 4)")
    if raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path}: not an IDX file (magic number must start with two zero bytes)")
    code, ndims = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        valid = ", ".join(f"0x{c:02X}" for c in _IDX_DTYPES)
        raise ValueError(f"{path}: unknown IDX type code 0x{code:02X}; valid codes: {valid}")
    header_len = 4 + 4 * ndims
    if len(raw) < header_len:
        raise ValueError(f"{path}: truncated IDX header ({ndims} dimensions need {header_len} bytes)")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndims, offset=4))
    if any(d < 0 for d in dims):
        raise ValueError(f"{path}: negative dimension in IDX header {dims}")
    dtype = _IDX_DTYPES[code]
    expected = math.prod(dims) * dtype.itemsize
    actual = len(raw) - header_len
    if actual != expected:
        kind = "truncated" if actual < expected else "has trailing bytes"
        raise ValueError(
            f"{path}: IDX file {kind}: dimensions {dims} need {expected} data bytes, found {actual}"
        )
    data = np.frombuffer(raw, dtype=dtype, count=math.prod(dims), offset=header_len)
    return data.reshape(dims).astype(dtype.newbyteorder("="))


def _unavailable_hint(name: str) -> str:
    if name == "fashion-mnist":
        return "run `apt-get install dataset-fashion-mnist` or set data.dir to a folder with the four IDX files"
    return (
        "set data.dir to a folder with the four IDX files, "
        f"or run `dfedrw fetch {name} --dir DIR` on a machine online"
    )


def _find_idx_file(directory: Path, stem: str, name: str) -> Path:
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise DatasetUnavailable(
        f"{name}: {stem}[.gz] not found in {directory}; {_unavailable_hint(name)}"
    )


def _load_idx_split(directory: Path, name: str, split: str) -> Dataset:
    images_path = _find_idx_file(directory, IDX_FILES[f"{split}_images"], name)
    labels_path = _find_idx_file(directory, IDX_FILES[f"{split}_labels"], name)
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim < 2:
        raise ValueError(f"{images_path}: expected an image array with >= 2 dimensions, got shape {images.shape}")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{labels_path}: expected {images.shape[0]} labels to match {images_path}, got shape {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= _IDX_NUM_CLASSES):
        raise ValueError(
            f"{labels_path}: labels must lie in 0..{_IDX_NUM_CLASSES - 1}, found {labels.min()}..{labels.max()}"
        )
    # Pixels are ubyte in the standard files; scale by the dtype's range so [0, 1] holds.
    scale = 255.0 if images.dtype == np.uint8 else 1.0
    x = images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(scale)
    return Dataset(
        x=torch.from_numpy(x),
        y=torch.from_numpy(labels.astype(np.int64)),
        num_classes=_IDX_NUM_CLASSES,
    )


def _load_digits() -> tuple[Dataset, Dataset]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    # random_state is fixed on purpose: the train/test split is part of the dataset,
    # not of the scenario, so it must not change with the scenario seed.
    train_idx, test_idx = train_test_split(
        np.arange(len(y)), test_size=_DIGITS_TEST_FRACTION, stratify=y, random_state=0
    )
    train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
    num_classes = int(y.max()) + 1

    def take(idx: np.ndarray) -> Dataset:
        return Dataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]), num_classes)

    return take(train_idx), take(test_idx)


def _data_directory(name: str, data_dir: str | os.PathLike | None) -> Path:
    chosen = data_dir if data_dir is not None else DEFAULT_DIRS[name]
    if chosen is None:
        raise DatasetUnavailable(f"{name}: no data directory given; {_unavailable_hint(name)}")
    directory = Path(chosen)
    if not directory.is_dir():
        raise DatasetUnavailable(f"{name}: data directory {directory} does not exist; {_unavailable_hint(name)}")
    return directory


def check_dataset(name: str, data_dir: str | os.PathLike | None = None) -> None:
    """Raise :class:`DatasetUnavailable` if ``name`` cannot be loaded, without loading it."""
    _check_dataset_name(name)
    if name == "digits":
        return
    directory = _data_directory(name, data_dir)
    for stem in IDX_FILES.values():
        _find_idx_file(directory, stem, name)


@functools.lru_cache(maxsize=4)
def load_dataset(name: str, data_dir: str | os.PathLike | None = None) -> tuple[Dataset, Dataset]:
    """Load ``(train, test)`` for ``name`` in :data:`DATASETS`.

    Cached per process: clients that share a process (the in-process transport) share one
    read-only copy instead of decoding the files once each.

    ``digits`` ignores ``data_dir`` and uses a fixed stratified 80/20 split. ``fashion-mnist``
    and ``mnist`` read the four IDX files (plain or ``.gz``) from ``data_dir``, falling back to
    :data:`DEFAULT_DIRS`; a missing directory or file raises :class:`DatasetUnavailable`.
    Nothing is downloaded here: see :func:`download_idx`.
    """
    _check_dataset_name(name)
    if name == "digits":
        return _load_digits()
    directory = _data_directory(name, data_dir)
    return _load_idx_split(directory, name, "train"), _load_idx_split(directory, name, "test")


def _digest(path: Path, algorithm: str, of: str) -> str:
    h = hashlib.new(algorithm)
    opener = gzip.open if of == "idx" else open
    with opener(path, "rb") as handle:
        while block := handle.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def idx_digest_error(name: str, stem: str, path: str | os.PathLike) -> str | None:
    """None if the gzipped file ``path`` matches a known digest of ``name``'s ``stem`` (see
    :data:`IDX_DIGESTS`), else a one-line description of the mismatch."""
    path = Path(path)
    seen = []
    for algorithm, of, expected in IDX_DIGESTS[name][stem]:
        try:
            got = _digest(path, algorithm, of)
        except (OSError, EOFError, gzip.BadGzipFile):  # "idx" of a file that is not gzip
            got = "unreadable"
        if got == expected:
            return None
        seen.append(f"{algorithm} of the {'decompressed ' if of == 'idx' else ''}file {got}, expected {expected}")
    return "; ".join(seen)


def download_idx(
    name: str, data_dir: str | os.PathLike, base_url: str | None = None, timeout: float = 60.0
) -> None:
    """Download the four gzipped IDX files of ``name`` into ``data_dir`` (the online path).

    ``base_url`` defaults to :data:`DOWNLOAD_BASE_URLS`. Files already present (plain or
    ``.gz``) are kept. Each file is written under a temporary name, checked against
    :data:`IDX_DIGESTS` and with :func:`read_idx`, then renamed, so an interrupted, corrupt
    or substituted download leaves nothing that :func:`load_dataset` would pick up; a
    checksum mismatch raises ValueError naming the file.
    """
    if name not in DOWNLOAD_BASE_URLS:
        raise ValueError(
            f"dataset {name!r} cannot be downloaded; valid choices: {', '.join(DOWNLOAD_BASE_URLS)}"
        )
    base = base_url if base_url is not None else DOWNLOAD_BASE_URLS[name]
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


# ---------------------------------------------------------------------------------------------
# Partitions


def _partition_error(spec: object, why: str) -> ValueError:
    return ValueError(f"bad partition spec {spec!r}: {why}; valid forms: {', '.join(PARTITION_FORMS)}")


def parse_partition(spec: str) -> tuple[str, float | int | None]:
    """Parse a partition spec into ``(kind, parameter)``.

    ``"iid"`` -> ``("iid", None)``; ``"dirichlet:0.1"`` -> ``("dirichlet", 0.1)``;
    ``"labelskew:4"`` -> ``("labelskew", 4)``. Anything else raises ValueError listing the
    valid forms. The upper bound of H is checked by :func:`partition`, which knows the labels.
    """
    if not isinstance(spec, str):
        raise _partition_error(spec, "not a string")
    text = spec.strip().lower()
    if text == "iid":
        return "iid", None
    kind, sep, arg = text.partition(":")
    if not sep:
        raise _partition_error(spec, "unknown form")
    arg = arg.strip()
    if kind == "dirichlet":
        try:
            alpha = float(arg)
        except ValueError:
            raise _partition_error(spec, f"ALPHA {arg!r} is not a number") from None
        if not math.isfinite(alpha) or alpha <= 0:
            raise _partition_error(spec, f"ALPHA must be a finite number > 0, got {arg!r}")
        return "dirichlet", alpha
    if kind == "labelskew":
        if not re.fullmatch(r"[+]?\d+", arg):
            raise _partition_error(spec, f"H {arg!r} is not a positive integer")
        h = int(arg)
        if h < 1:
            raise _partition_error(spec, f"H must be >= 1, got {h}")
        return "labelskew", h
    raise _partition_error(spec, f"unknown kind {kind!r}")


def _sorted_int64(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _partition_iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    per_client = n // num_clients
    order = rng.permutation(n)[: per_client * num_clients]
    return _sorted_int64(np.split(order, num_clients))


def _partition_dirichlet(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    n = labels.shape[0]
    min_size = min(10, n // num_clients)
    classes = np.unique(labels)
    for _ in range(DIRICHLET_MAX_TRIES):
        shards: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(proportions)[:-1] * members.size).astype(np.int64)
            for k, piece in enumerate(np.split(members, cuts)):
                shards[k].append(piece)
        parts = [np.concatenate(s) for s in shards]
        if min(p.size for p in parts) >= min_size:
            return _sorted_int64(parts)
    raise ValueError(
        f"dirichlet:{alpha} could not give each of {num_clients} clients at least {min_size} samples "
        f"in {DIRICHLET_MAX_TRIES} draws; use fewer clients or a larger ALPHA"
    )


LABELSKEW_ASSIGN = ("cyclic", "random")


def _partition_labelskew(
    labels: np.ndarray, num_clients: int, h: int, rng: np.random.Generator, assign: str = "cyclic"
) -> list[np.ndarray]:
    classes = np.unique(labels)
    num_classes = classes.size
    if h > num_classes:
        raise _partition_error(f"labelskew:{h}", f"H={h} exceeds the {num_classes} classes present")
    if assign == "cyclic":
        perm = rng.permutation(classes)
        # Cyclic layout: consecutive clients take consecutive windows of H classes, so every
        # class is held by about num_clients * H / C clients.
        held = [[perm[(k * h + j) % num_classes] for j in range(h)] for k in range(num_clients)]
    elif assign == "random":
        # Each client draws its H classes independently: some classes may be held by many
        # clients and some by none, as in the usual "pathological non-IID" set-ups.
        held = [list(rng.choice(classes, size=h, replace=False)) for _ in range(num_clients)]
    else:
        raise ValueError(f"labelskew assignment {assign!r} is not valid; choose one of: {', '.join(LABELSKEW_ASSIGN)}")
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    for k, cls in enumerate(held):
        for c in cls:
            holders[int(c)].append(k)
    shuffled = {int(c): rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    # A client takes the same count from each of its classes (the paper's "equal samples per
    # class"): the smallest equal share among its classes, so no class is over-drawn.
    share = {c: shuffled[c].size // len(ks) for c, ks in holders.items() if ks}
    per_client = [min(share[int(c)] for c in cls) for cls in held]
    if min(per_client) == 0:
        raise ValueError(
            f"labelskew:{h} leaves a client with 0 samples per class for {num_clients} clients; "
            "use fewer clients or a larger dataset"
        )
    offset = {c: 0 for c in holders}
    parts: list[np.ndarray] = []
    for k, cls in enumerate(held):
        pieces = []
        for c in cls:
            c = int(c)
            pieces.append(shuffled[c][offset[c] : offset[c] + per_client[k]])
            offset[c] += per_client[k]
        parts.append(np.concatenate(pieces))
    return _sorted_int64(parts)


def partition(
    labels: np.ndarray, num_clients: int, spec: str, seed: int, *, labelskew_assign: str = "cyclic"
) -> list[np.ndarray]:
    """Split sample indices among ``num_clients`` clients according to ``spec``.

    - ``iid``: seeded shuffle cut into equal parts; the remainder ``n % num_clients`` is dropped.
    - ``dirichlet:ALPHA``: per class, proportions ~ Dir(ALPHA) over clients split that class's
      samples; redrawn (at most :data:`DIRICHLET_MAX_TRIES` times) until every client has at
      least ``min(10, n // num_clients)`` samples.
    - ``labelskew:H``: client k holds classes ``perm[(k*H + j) % C]`` for ``j < H`` (seeded
      class permutation); each client takes the same number of samples from each of its
      classes, the smallest equal share of those classes among their holders. Samples beyond
      that are unused. ``labelskew_assign="random"`` instead lets every client draw its H
      classes at random (seeded).

    Returns one sorted int64 index array per client; the arrays are disjoint.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    if labels.shape[0] < num_clients:
        raise ValueError(f"cannot split {labels.shape[0]} samples among num_clients={num_clients} clients")
    kind, param = parse_partition(spec)
    rng = np.random.default_rng(seed)
    if kind == "iid":
        return _partition_iid(labels.shape[0], int(num_clients), rng)
    if kind == "dirichlet":
        return _partition_dirichlet(labels, int(num_clients), float(param), rng)
    return _partition_labelskew(labels, int(num_clients), int(param), rng, labelskew_assign)


# ---------------------------------------------------------------------------------------------
# Local test sets and auxiliary subsets


def local_test_indices(
    train_labels: np.ndarray, test_labels: np.ndarray, num_classes: int, size: int, seed: int
) -> np.ndarray:
    """Draw a local test set whose label distribution matches a client's training shard.

    With ``p_c`` the fraction of class ``c`` in ``train_labels``, take ``round(p_c * size)``
    test samples of class ``c`` without replacement (fewer if the test set has fewer). The
    total may differ from ``size`` by rounding. Returns sorted int64 indices into
    ``test_labels``.
    """
    train_labels = np.asarray(train_labels)
    test_labels = np.asarray(test_labels)
    if train_labels.ndim != 1 or train_labels.size == 0:
        raise ValueError(f"train_labels must be a non-empty 1-D array, got shape {train_labels.shape}")
    if test_labels.ndim != 1:
        raise ValueError(f"test_labels must be 1-D, got shape {test_labels.shape}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    if train_labels.min() < 0 or train_labels.max() >= num_classes:
        raise ValueError(
            f"train_labels must lie in 0..{num_classes - 1}, found {train_labels.min()}..{train_labels.max()}"
        )
    rng = np.random.default_rng(seed)
    fractions = np.bincount(train_labels.astype(np.int64), minlength=num_classes) / train_labels.size
    chosen = []
    for c in range(num_classes):
        # Half-up rounding (not numpy's half-to-even) so equal fractions get equal counts.
        want = int(math.floor(fractions[c] * size + 0.5))
        pool = np.flatnonzero(test_labels == c)
        take = min(want, pool.size)
        if take:
            chosen.append(rng.choice(pool, size=take, replace=False))
    if not chosen:
        return np.empty(0, dtype=np.int64)
    return np.sort(np.concatenate(chosen).astype(np.int64))


def aux_indices(n: int, fraction: float, seed: int) -> np.ndarray:
    """Sample the auxiliary subset: ``max(1, ceil(fraction * n))`` of ``range(n)``.

    Drawn without replacement with ``seed``; ``fraction`` must lie in (0, 1]. Returns sorted
    int64 indices (positions within the client's own training shard).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction <= 1:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction!r}")
    # The small tolerance keeps e.g. 0.1 * 30 = 3.0000000000000004 at 3, not 4.
    count = min(n, max(1, math.ceil(fraction * n - 1e-9)))
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=count, replace=False).astype(np.int64))
