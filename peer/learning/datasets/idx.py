"""Fashion-MNIST and MNIST, read from the standard IDX files in a folder, and the online path that
fetches and checks those files (``dfedrw fetch``)."""

from __future__ import annotations

import gzip
import math
import os
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dfedrw.peer.checked import Checked
from dfedrw.peer.quote import shown
from dfedrw.peer.learning.data import DatasetUnavailable
from dfedrw.peer.learning.datasets.registry import DATASET_REGISTRY
from dfedrw.peer.learning.datasets.files import data_folder, file_digest, file_stamps, scaled_splits


# IDX type code -> big-endian numpy dtype (format by LeCun et al., the MNIST page).
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (plain or gzip-compressed) into a numpy array of native byte order. Header:
    two zero bytes, a type code (``_IDX_DTYPES``), the number of dimensions, then each dimension as
    a big-endian int32; the data follow in C order, big-endian. A bad magic number, unknown type
    code or truncated/overlong body raises ValueError naming the file."""
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


@dataclass(frozen=True)
class IdxDataset(Checked):
    """A data set stored as the four standard IDX files (``IDX_FILES``, plain or ``.gz``) in a
    folder: ``data_dir``, else the class's ``default_dir``. Subclasses name the set and its
    digests and where it can be downloaded."""

    data_dir: str = ""

    name: ClassVar[str] = ""
    input_shape: ClassVar[tuple[int, ...]] = (1, 28, 28)
    num_features: ClassVar[int] = 784
    num_classes: ClassVar[int] = 10
    train_size: ClassVar[int] = 60_000
    natural_groups: ClassVar[bool] = False
    default_dir: ClassVar[str | None] = None
    download_url: ClassVar[str] = ""
    digests: ClassVar[Digests] = {}

    def unavailable_hint(self) -> str:
        return f"set data.dir to a folder with the four IDX files, or run `dfedrw fetch {self.name} --dir DIR` on a machine online"

    def folder(self) -> Path:
        return data_folder(self.name, self.data_dir or self.default_dir, self.unavailable_hint())

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
        return {"name": self.name, "folder": str(self.folder().resolve()), "files": file_stamps([self.file(role) for role in IDX_FILES])}

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
        return scaled_splits(*self.pixels())


@DATASET_REGISTRY.register("fashion-mnist")
@dataclass(frozen=True)
class FashionMNIST(IdxDataset):
    """Fashion-MNIST (Xiao et al. 2017): 28x28 greyscale clothing images, 60,000 + 10,000.

    Read from IDX files: Debian's ``dataset-fashion-mnist`` package, or ``data.dir``."""

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

    Read from IDX files in ``data.dir`` (no offline package; ``dfedrw fetch mnist --dir DIR``)."""

    name: ClassVar[str] = "mnist"
    download_url: ClassVar[str] = "https://ossci-datasets.s3.amazonaws.com/mnist/"
    # No SHA-256 of the MNIST files is published: the MD5 sums torchvision checks.
    digests: ClassVar[Digests] = {
        "train-images-idx3-ubyte": (("md5", "gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),),
        "train-labels-idx1-ubyte": (("md5", "gz", "d53e105ee54ea40749a09fcbcd1e9432"),),
        "t10k-images-idx3-ubyte": (("md5", "gz", "9fb629c4189551a2d022fa330f9573f3"),),
        "t10k-labels-idx1-ubyte": (("md5", "gz", "ec29112dd5afa0611ce80d1b7f02629c"),),
    }


# ---------------------------------------------------------------------------------------------
# The online path for IDX sets


def _idx_class(name: str) -> type[IdxDataset]:
    downloadable = {n: DATASET_REGISTRY.resolve(n) for n in DATASET_REGISTRY.builtin_names()}
    downloadable = {n: c for n, c in downloadable.items() if isinstance(c, type) and issubclass(c, IdxDataset) and c.download_url}
    if name not in downloadable:
        raise ValueError(f"dataset {shown(name)} cannot be downloaded; valid choices: {', '.join(downloadable)}")
    return downloadable[name]


def idx_digest_error(name: str, stem: str, path: str | os.PathLike) -> str | None:
    """None if the gzipped file ``path`` matches a known digest of ``name``'s ``stem`` (the
    class's ``digests``), else a one-line description of the mismatch."""
    path = Path(path)
    seen = []
    for algorithm, of, expected in _idx_class(name).digests[stem]:
        try:
            got = file_digest(path, algorithm, of)
        except (OSError, EOFError, gzip.BadGzipFile):  # "idx" of a file that is not gzip
            got = "unreadable"
        if got == expected:
            return None
        seen.append(f"{algorithm} of the {'decompressed ' if of == 'idx' else ''}file {got}, expected {expected}")
    return "; ".join(seen)


def download_idx(name: str, data_dir: str | os.PathLike, base_url: str | None = None, timeout: float = 60.0) -> None:
    """Download the four gzipped IDX files of ``name`` into ``data_dir`` (the online path), from
    ``base_url`` (default: the class's ``download_url``); files already there (plain or ``.gz``) are
    kept. Each is written under a temporary name, checked against the class's digests and with
    :func:`read_idx`, then renamed, so an interrupted, corrupt or substituted download leaves
    nothing that :func:`load_dataset` would pick up; a checksum mismatch raises ValueError naming
    the file."""
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
