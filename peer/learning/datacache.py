"""A data set stored once per machine as uint8 files that every client process maps.

Decoding the IDX files and converting all 70,000 images to float32 costs a client process about a
second and 235 MB, though it trains on a tenth of the rows. So the first process that needs a data
set writes its pixels and labels as raw uint8 files under the cache folder, with a manifest of their
shapes, scale and SHA-256; every process maps them read-only (the machine's page cache, shared by
all) and converts only the rows it uses to float32, the same to the bit as :func:`load_dataset`'s
(``uint8 -> float32`` is exact, ``/ scale`` one correctly rounded division).

Where: ``$DFEDRW_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/dfedrw``, else ``~/.cache/dfedrw``; a
data set lives in ``data/<name>-<key>/``, the key naming its source (for IDX files: their folder,
sizes and modification times, so replaced files give a new entry). A set is cached when its class
gives uint8 ``pixels()`` and a ``source()`` (the built-in sets, :mod:`peer.learning.datasets`); any
other is loaded by each process that needs it. Its ``train_groups`` (natural groups, FEMNIST's
writers) are stored beside as little-endian int32 (``train_groups.i32``, in the manifest like the
others). An entry is written under a temporary name and renamed when complete, so processes that
build it at once never see half of one. Opening an entry checks the manifest and the file sizes;
:func:`verify_stored` re-hashes the files (a launcher, once before starting its clients) and a
damaged entry is rebuilt. Where no cache folder can be written the arrays stay in memory."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfedrw.peer.learning.data import Dataset
from dfedrw.peer.learning.datasets import check_available, checked_groups, describe, load_grouped_splits, source_key

__all__ = [
    "CACHE_ENV", "Held", "Stored", "StoredSplit", "cache_root", "clear_stored", "content_digest", "provide", "provided", "stored_arrays", "stored_dataset",
    "test_set", "training_pixels", "training_set", "verify_stored",
]

CACHE_ENV = "DFEDRW_CACHE_DIR"
_FORMAT = 1
_FILES = ("train_x", "train_y", "test_x", "test_y")
# Each part an entry may hold: its file and the type of its values. The groups are optional, so
# an entry without them is format 1 all the same.
_PARTS = {part: (f"{part}.u8", np.dtype(np.uint8)) for part in _FILES} | {"train_groups": ("train_groups.i32", np.dtype("<i4"))}


def cache_root() -> Path:
    """The folder the data cache lives under (see the module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dfedrw"


@dataclass(frozen=True)
class StoredSplit:
    """One split as uint8 pixels ``images [n, F]`` and labels ``labels [n]`` (mapped or held);
    features are ``pixel / scale`` in float32. ``groups``: the rows' natural groups (int32
    ``[n]``) of a training split that has them, else None."""

    images: np.ndarray
    labels: np.ndarray
    scale: float
    num_classes: int
    groups: np.ndarray | None = None

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

    @property
    def train_groups(self) -> np.ndarray | None:
        """The training rows' natural groups, or None."""
        return self.train.groups


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
        for part in _entry_parts(arrays):
            name, dtype = _PARTS[part]
            array = np.ascontiguousarray(arrays[part], dtype=dtype)
            (tmp / name).write_bytes(array.tobytes())
            files[part] = {"shape": list(array.shape), "sha256": _digest(tmp / name)}
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
        for part in _entry_parts(manifest["files"]):
            name, dtype = _PARTS[part]
            shape = tuple(int(n) for n in manifest["files"][part]["shape"])
            path = folder / name
            if path.stat().st_size != int(np.prod(shape)) * dtype.itemsize:
                return None
            mapped[part] = np.memmap(path, dtype=dtype, mode="r", shape=shape) if np.prod(shape) else np.zeros(shape, dtype)
        scale, classes = float(manifest["scale"]), int(manifest["num_classes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return _splits(mapped, scale, classes, folder)


def _entry_parts(listed: Any) -> list[str]:
    """The parts of an entry: the four splits' files, and the groups if ``listed`` (the arrays
    written, or the manifest's files) has them."""
    return [part for part in _PARTS if part in _FILES or part in listed]


def _splits(arrays: dict[str, np.ndarray], scale: float, classes: int, folder: Path | None) -> Stored:
    return Stored(
        StoredSplit(arrays["train_x"], arrays["train_y"], scale, classes, arrays.get("train_groups")),
        StoredSplit(arrays["test_x"], arrays["test_y"], scale, classes),
        folder,
    )


@dataclass(frozen=True)
class Held:
    """A data set that the cache cannot store (its class gives no uint8 pixels), held in memory;
    ``train_groups``: its training rows' natural groups when its ``load()`` gives them."""

    train: Dataset
    test: Dataset
    folder: None = None
    train_groups: np.ndarray | None = None


def _cacheable(source: Any) -> bool:
    return callable(getattr(source, "pixels", None)) and callable(getattr(source, "source", None))


def _entry(source: Any) -> tuple[Path, dict]:
    key, description = source_key(source)
    label = "".join(c if c.isalnum() or c in "-_" else "-" for c in str(description.get("name", type(source).__name__)))
    return cache_root() / "data" / f"{label}-{key}", description


_STORED: dict[Any, Stored | Held] = {}
# Data sets this process was given as arrays (:func:`provide`), not read from files here.
_PROVIDED: dict[Any, Stored] = {}


def provide(source: Any, arrays: dict[str, np.ndarray], scale: float, classes: int) -> None:
    """Serve ``source`` in this process from ``arrays`` (its parts as :func:`stored_arrays` gives
    them) instead of its files, which this machine lacks: a node of a sweep on Ray given the
    driver's copy. Kept until :func:`clear_stored`."""
    _PROVIDED[source] = _splits(dict(arrays), float(scale), int(classes), None)


def provided(source: Any) -> bool:
    """Whether :func:`provide` gave this process ``source``."""
    try:
        return source in _PROVIDED
    except TypeError:
        return False


def stored_arrays(source: Any) -> tuple[dict[str, np.ndarray], float, int] | None:
    """A cacheable data set's parts (uint8 ``train_x``, ``train_y``, ``test_x``, ``test_y``; int32
    ``train_groups`` where it has them), scale and number of classes, checked
    (:func:`verify_stored`); None for a set the cache cannot store."""
    stored = verify_stored(source)  # a set given with provide() is what it was given
    if isinstance(stored, Held):
        return None
    arrays = {"train_x": stored.train.images, "train_y": stored.train.labels, "test_x": stored.test.images, "test_y": stored.test.labels}
    if stored.train.groups is not None:
        arrays["train_groups"] = stored.train.groups
    return arrays, stored.train.scale, stored.train.num_classes


def content_digest(source: Any) -> str | None:
    """The SHA-256 of a cacheable data set's contents (every part's values, shape and type,
    its scale and classes): equal where two machines hold the same data, whatever their files'
    names and times. None for a set the cache cannot store."""
    found = stored_arrays(source)
    if found is None:
        return None
    arrays, scale, classes = found
    h = hashlib.sha256(json.dumps({"scale": scale, "classes": classes}).encode())
    for part in sorted(arrays):
        array = np.ascontiguousarray(arrays[part])
        h.update(f"{part}:{array.dtype.str}:{array.shape}".encode())
        h.update(memoryview(array).cast("B"))
    return h.hexdigest()


def stored_dataset(source: Any) -> Stored | Held:
    """The splits of a built data set (:mod:`peer.learning.datasets`), mapped from the cache (built
    first if missing or damaged), or loaded and held for a set the cache cannot store. Kept
    per process (a set given with :func:`provide`: its arrays). Raises
    :class:`~dfedrw.peer.learning.data.DatasetUnavailable` when its files are missing,
    ``ValueError`` when its values do not match what it declares."""
    if provided(source):
        return _PROVIDED[source]
    try:
        return _STORED[source]
    except TypeError:  # an unhashable data set object: not kept
        return _stored(source)
    except KeyError:
        stored = _STORED[source] = _stored(source)
        if len(_STORED) > 4:
            _STORED.pop(next(iter(_STORED)))
        return stored


def clear_stored() -> None:
    """Forget what this process mapped, loaded, verified or was given (as a new process would start)."""
    _STORED.clear()
    _PROVIDED.clear()
    _VERIFIED.clear()
    _split.cache_clear()
    _pixels.cache_clear()


def training_set(source: Any) -> Dataset:
    """Every training row of a built data set converted (float32 features, int64 labels), kept
    per process: the batched engine indexes one copy for all the runs of a batch."""
    return _converted(source, "train")


@dataclass(frozen=True)
class Pixels:
    """A training split as it is stored: ``x [n, F]`` uint8 pixels whose features are
    ``x / scale`` in float32 (``scale`` None: ``x`` holds the float32 features themselves, a set
    the cache cannot store), ``y [n]`` int64 labels. A quarter of the float32 features' memory,
    and no conversion of rows nobody trains on."""

    x: torch.Tensor
    y: torch.Tensor
    scale: float | None

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of ``x`` (gathered from :attr:`x`) as float32 features, the same to the bit as
        :func:`training_set`'s."""
        return x if self.scale is None else x.to(torch.float32).div_(self.scale)


def training_pixels(source: Any) -> Pixels:
    """Every training row of a built data set as stored (see :class:`Pixels`), kept per process:
    the batched engine gathers each minibatch from one copy for all the runs of a batch."""
    try:
        return _pixels(source)
    except TypeError:  # unhashable: not kept
        return _pixels.__wrapped__(source)


@functools.lru_cache(maxsize=2)
def _pixels(source: Any) -> Pixels:
    stored = stored_dataset(source)
    if isinstance(stored, Held):
        return Pixels(stored.train.x, stored.train.y, None)
    split = stored.train
    images = split.images
    if not images.flags.writeable and images.flags.c_contiguous and images.dtype == np.uint8:
        # The mapped file (or the arrays a Ray node was given) itself, no copy: its pages are
        # shared with every process that maps them; nothing writes to it (torch's warning is moot).
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return Pixels(torch.from_numpy(images), split.y, float(split.scale))
    return Pixels(torch.from_numpy(np.ascontiguousarray(images, dtype=np.uint8)), split.y, float(split.scale))


def test_set(source: Any) -> Dataset:
    """Each test row of a built data set converted, kept per process for a batch's runs to share."""
    return _converted(source, "test")


def _converted(source: Any, split: str) -> Dataset:
    try:
        return _split(source, split)
    except TypeError:  # unhashable: not kept
        return getattr(stored_dataset(source), split).dataset()


@functools.lru_cache(maxsize=4)  # both splits of two data sets
def _split(source: Any, split: str) -> Dataset:
    return getattr(stored_dataset(source), split).dataset()


def _stored(source: Any) -> Stored | Held:
    check_available(source)
    if not _cacheable(source):
        train, test, groups = load_grouped_splits(source)
        return Held(train, test, train_groups=groups)
    folder, description = _entry(source)
    stored = _open(folder)
    if stored is not None:
        return stored
    arrays, scale = source.pixels()
    classes = int(source.num_classes)
    rows = len(arrays["train_y"])
    if rows > int(source.train_size):
        raise ValueError(f"data set {describe(source)}: pixels() gave {rows} training rows, more than the set declares (train_size = {int(source.train_size)})")
    if "train_groups" in arrays:
        arrays = {**arrays, "train_groups": checked_groups(arrays["train_groups"], rows, describe(source))}
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
    return _splits(arrays, scale, classes, None)


# The entries this process has checked, each with its files' sizes and modification times.
_VERIFIED: set[tuple] = set()


def _stamp(folder: Path) -> tuple:
    """The entry's folder with its files' sizes and modification times (nanoseconds)."""
    names = ["manifest.json", *(name for part, (name, _) in _PARTS.items() if part in _FILES or (folder / name).exists())]
    stats = [(folder / name).stat() for name in names]
    return (str(folder), *((st.st_size, st.st_mtime_ns) for st in stats))


def verify_stored(source: Any) -> Stored | Held:
    """:func:`stored_dataset`, with every cache file's SHA-256 checked against its manifest first;
    an entry that fails is built again. For a launcher, once before its clients start; an entry
    this process has checked, whose files' sizes and modification times are unchanged since, is
    not hashed again (a batch of runs checks its data set once). A set given with :func:`provide`
    is what it was given."""
    if provided(source):
        return _PROVIDED[source]
    if _cacheable(source):
        check_available(source)
        folder, _ = _entry(source)
        try:
            stamp = _stamp(folder)
        except OSError:
            stamp = None
        if stamp is None or stamp not in _VERIFIED:
            try:
                manifest = json.loads((folder / "manifest.json").read_text())
                damaged = any(_digest(folder / _PARTS[part][0]) != manifest["files"][part]["sha256"] for part in _entry_parts(manifest["files"]))
            except (OSError, ValueError, KeyError, TypeError):
                damaged = folder.exists()
            if damaged:
                shutil.rmtree(folder, ignore_errors=True)
                clear_stored()
            elif stamp is not None:
                _VERIFIED.add(stamp)
    return stored_dataset(source)
