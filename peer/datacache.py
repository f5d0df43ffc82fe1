"""A data set stored once per machine as uint8 files that every client process maps.

Decoding the IDX files and converting all 70,000 images to float32 costs a client process
about a second and 235 MB, though it trains on a tenth of the rows. Instead, the first process
that needs a data set writes its pixels and labels as raw uint8 files (with a manifest giving
their shapes, scale and SHA-256) under the cache folder; every process then maps those files
read-only (the pages are the machine's page cache, shared by all processes) and converts only
the rows it uses to float32. The values are the same to the bit as :func:`load_dataset`'s:
``uint8 -> float32`` is exact and ``/ scale`` is one correctly rounded division either way.

Where: ``$DFEDRW_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/dfedrw``, else ``~/.cache/dfedrw``;
a data set lives in ``data/<name>-<key>/``, the key naming its source (for IDX files: their
folder, sizes and modification times, so replaced files give a new entry). An entry is written
under a temporary name and renamed when complete, so processes that build it at once never see
half of one. A process opening an entry checks the manifest and the file sizes;
:func:`verify_stored` re-hashes the files (a launcher does it once before starting its
clients) and a damaged entry is rebuilt. Where no cache folder can be written the arrays stay
in the process's memory, as before.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dfedrw.peer.data import IDX_FILES, Dataset, _check_dataset_name, _data_directory, _find_idx_file

__all__ = ["CACHE_ENV", "Stored", "StoredSplit", "cache_root", "stored_dataset", "verify_stored"]

CACHE_ENV = "DFEDRW_CACHE_DIR"
_FORMAT = 1
_FILES = ("train_x", "train_y", "test_x", "test_y")


def cache_root() -> Path:
    """The folder the data cache lives under (see the module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dfedrw"


@dataclass(frozen=True)
class StoredSplit:
    """One split as uint8 pixels ``images [n, F]`` and labels ``labels [n]`` (mapped or held);
    features are ``pixel / scale`` in float32."""

    images: np.ndarray
    labels: np.ndarray
    scale: float
    num_classes: int

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @functools.cached_property
    def y(self) -> torch.Tensor:
        """Every label as int64 (what a partition reads)."""
        return torch.from_numpy(self.labels.astype(np.int64))

    def subset(self, idx) -> Dataset:
        """Rows ``idx`` converted: float32 features, int64 labels (their own memory)."""
        index = np.asarray(idx, dtype=np.int64)
        return self._dataset(self.images[index], self.labels[index])

    def dataset(self) -> Dataset:
        """Every row converted (a transient copy: ``len * F * 4`` bytes)."""
        return self._dataset(self.images, self.labels)

    def _dataset(self, images: np.ndarray, labels: np.ndarray) -> Dataset:
        x = images.astype(np.float32) / np.float32(self.scale)
        return Dataset(x=torch.from_numpy(x), y=torch.from_numpy(labels.astype(np.int64)), num_classes=self.num_classes)


@dataclass(frozen=True)
class Stored:
    """A data set's two splits and the folder they are mapped from (None: held in memory)."""

    train: StoredSplit
    test: StoredSplit
    folder: Path | None


def _source(name: str, data_dir: str | os.PathLike | None) -> tuple[str, dict]:
    """(key, description) of where ``name``'s values come from."""
    if name == "digits":
        from importlib.metadata import version

        description = {"name": name, "scikit-learn": version("scikit-learn")}
    else:
        directory = _data_directory(name, data_dir).resolve()
        files = {}
        for stem in IDX_FILES.values():
            path = _find_idx_file(directory, stem, name)
            stat = path.stat()
            files[path.name] = [stat.st_size, stat.st_mtime_ns]
        description = {"name": name, "folder": str(directory), "files": files}
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]
    return key, description


def _decode(name: str, data_dir: str | os.PathLike | None) -> tuple[dict[str, np.ndarray], float, int]:
    """The four uint8 arrays of ``name`` from its source, the scale and the class count."""
    if name == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        bunch = load_digits()
        x, y = bunch.data.astype(np.uint8), bunch.target.astype(np.uint8)
        if not np.array_equal(x, bunch.data):
            raise ValueError("digits: pixel values are not whole numbers 0..16")
        # The split is part of the data set (fixed random_state), as in data._load_digits.
        train, test = train_test_split(np.arange(len(y)), test_size=0.2, stratify=y, random_state=0)
        train, test = np.sort(train), np.sort(test)
        return {"train_x": x[train], "train_y": y[train], "test_x": x[test], "test_y": y[test]}, 16.0, int(y.max()) + 1
    from dfedrw.peer.data import _IDX_NUM_CLASSES, read_idx

    directory = _data_directory(name, data_dir)
    arrays = {}
    for split in ("train", "test"):
        images = read_idx(_find_idx_file(directory, IDX_FILES[f"{split}_images"], name))
        labels = read_idx(_find_idx_file(directory, IDX_FILES[f"{split}_labels"], name))
        if images.dtype != np.uint8 or labels.ndim != 1 or labels.shape[0] != images.shape[0]:
            raise ValueError(f"{name}: {split} files are not uint8 images with one label each")
        if labels.size and int(labels.max()) >= _IDX_NUM_CLASSES:
            raise ValueError(f"{name}: {split} labels must lie in 0..{_IDX_NUM_CLASSES - 1}")
        arrays[f"{split}_x"] = images.reshape(images.shape[0], -1)
        arrays[f"{split}_y"] = labels.astype(np.uint8)
    return arrays, 255.0, _IDX_NUM_CLASSES


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _write(folder: Path, arrays: dict[str, np.ndarray], scale: float, classes: int, description: dict) -> None:
    """Write an entry under a temporary name in ``folder``'s parent, then rename it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        files = {}
        for part in _FILES:
            array = np.ascontiguousarray(arrays[part], dtype=np.uint8)
            (tmp / f"{part}.u8").write_bytes(array.tobytes())
            files[part] = {"shape": list(array.shape), "sha256": _digest(tmp / f"{part}.u8")}
        manifest = {"format": _FORMAT, "scale": scale, "num_classes": classes, "files": files, "source": description}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / "manifest.json").is_file():  # not another process's complete entry
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _open(folder: Path) -> Stored | None:
    """The entry in ``folder`` mapped, or None if it is missing or does not match its manifest."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        if manifest.get("format") != _FORMAT:
            return None
        mapped = {}
        for part in _FILES:
            shape = tuple(int(n) for n in manifest["files"][part]["shape"])
            path = folder / f"{part}.u8"
            if path.stat().st_size != int(np.prod(shape)):
                return None
            mapped[part] = np.memmap(path, dtype=np.uint8, mode="r", shape=shape) if np.prod(shape) else np.zeros(shape, np.uint8)
        scale, classes = float(manifest["scale"]), int(manifest["num_classes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Stored(
        StoredSplit(mapped["train_x"], mapped["train_y"], scale, classes),
        StoredSplit(mapped["test_x"], mapped["test_y"], scale, classes),
        folder,
    )


def _entry(name: str, data_dir: str | os.PathLike | None) -> tuple[Path, dict]:
    key, description = _source(name, data_dir)
    return cache_root() / "data" / f"{name}-{key}", description


@functools.lru_cache(maxsize=4)
def stored_dataset(name: str, data_dir: str | os.PathLike | None = None) -> Stored:
    """``name``'s splits, mapped from the cache (built first if missing or damaged). Cached per
    process. Raises :class:`~dfedrw.peer.data.DatasetUnavailable` as :func:`load_dataset` does."""
    _check_dataset_name(name)
    folder, description = _entry(name, data_dir)
    stored = _open(folder)
    if stored is not None:
        return stored
    arrays, scale, classes = _decode(name, data_dir)
    try:
        if folder.exists():  # damaged: replaced
            shutil.rmtree(folder, ignore_errors=True)
        _write(folder, arrays, scale, classes, description)
        stored = _open(folder)
    except OSError:
        stored = None
    if stored is not None:
        return stored
    # No writable cache: the arrays stay in this process.
    return Stored(
        StoredSplit(arrays["train_x"], arrays["train_y"], scale, classes),
        StoredSplit(arrays["test_x"], arrays["test_y"], scale, classes),
        None,
    )


def verify_stored(name: str, data_dir: str | os.PathLike | None = None) -> Stored:
    """:func:`stored_dataset`, with every cache file's SHA-256 checked against its manifest
    first; an entry that fails is built again. For a launcher, once before its clients start."""
    _check_dataset_name(name)
    folder, _ = _entry(name, data_dir)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        damaged = any(_digest(folder / f"{part}.u8") != manifest["files"][part]["sha256"] for part in _FILES)
    except (OSError, ValueError, KeyError, TypeError):
        damaged = folder.exists()
    if damaged:
        shutil.rmtree(folder, ignore_errors=True)
        stored_dataset.cache_clear()
    return stored_dataset(name, data_dir)
