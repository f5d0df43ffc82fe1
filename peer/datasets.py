"""The data sets a scenario can name (``data.name``): one registry, one class each.

A data set is a class registered in :data:`DATASET_REGISTRY` (or named by import path
``"module:Class"``, or an installed plugin of the ``dfedrw.datasets`` entry-point group). Its
constructor's keyword parameters are its settings (``[data.NAME]`` in a scenario); ``data_dir``
is supplied from ``data.dir`` to a class that takes it. A built instance says, without loading
anything, what every client (a Byzantine one holds no data) must know:

* ``input_shape``: the shape of one sample, ``(channels, height, width)`` for images; its
  product is ``num_features``. Optional for a plugin set: one that does not declare it is
  ``(num_features,)`` (:func:`input_shape_of` reads and checks it);
* ``num_features``: features per sample (images are flattened, channel-major);
* ``num_classes``: labels are ``0 .. num_classes - 1``;
* ``train_size``: rows of the training set, at most (bounds the size a message may declare);

and ``load()`` returns ``((train_x, train_y), (test_x, test_y))``: float features ``[n, ...]``
(flattened to ``num_features``) and integer labels ``[n]``, as tensors or numpy arrays. The
values are checked against what the instance declared (:func:`load_splits`). A set whose
samples fall into natural groups (FEMNIST's writers, for ``data.partition = "natural"``) gives
the training split as ``(train_x, train_y, train_groups)``: one integer group per row, >= 0.
``natural_groups`` (a class attribute) says whether it does; a set that says False is refused
with a natural partition when the scenario is loaded, one that says nothing when loaded.

Optional, for the built-in sets: ``check()`` raises :class:`~dfedrw.peer.data.DatasetUnavailable`
without loading (a launcher checks before it starts clients); ``pixels()`` and ``source()``
give uint8 arrays (``train_x``, ``train_y``, ``test_x``, ``test_y``, and ``train_groups`` for a
set with natural groups) and a description of their origin, which lets the machine-wide cache
(:mod:`peer.datacache`) store the set once for every client process to map; ``folder()`` is a
folder of files the set reads (mounted into containers by ``dfedrw compose``). A set without
``pixels`` is loaded by each process that needs it.

Built in: scikit-learn's 8x8 ``digits`` (offline); ``fashion-mnist`` and ``mnist`` read from
the standard IDX files in a folder (Debian's ``dataset-fashion-mnist`` for the first;
``dfedrw fetch`` downloads either on a machine online); ``cifar10`` and ``cifar100`` read from
the binary version of CIFAR (its ``.tar.gz`` or the folder in it); ``femnist`` read from the
JSON files of LEAF's preprocessing, grouped by writer. Nothing is downloaded for the last three.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import math
import numbers
import os
import tarfile
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dfedrw.peer.data import Dataset, DatasetUnavailable, read_idx
from dfedrw.peer.moved import moved_names
from dfedrw.peer.registry import Registry, check_choice, check_int, settings_of

__all__ = [
    "CIFAR10",
    "CIFAR100",
    "DATASET_REGISTRY",
    "FEMNIST",
    "IDX_FILES",
    "CifarBinary",
    "Digits",
    "FashionMNIST",
    "IdxDataset",
    "MNIST",
    "build_dataset",
    "check_dataset",
    "checked_groups",
    "dataset_of",
    "download_idx",
    "idx_digest_error",
    "input_shape_of",
    "load_dataset",
    "load_grouped_splits",
    "load_splits",
    "natural_groups_error",
]

__getattr__ = moved_names(__name__, {"scenario_dataset": "dfedrw.peer.wiring"})

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
    input_shape: ClassVar[tuple[int, ...]] = (1, 8, 8)
    num_features: ClassVar[int] = 64
    num_classes: ClassVar[int] = 10
    train_size: ClassVar[int] = 1437
    natural_groups: ClassVar[bool] = False
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
        return _data_folder(self.name, self.data_dir or self.default_dir, self.unavailable_hint())

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
        return {"name": self.name, "folder": str(self.folder().resolve()), "files": _stamps([self.file(role) for role in IDX_FILES])}

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


# ---------------------------------------------------------------------------------------------
# CIFAR, binary version


@dataclass(frozen=True)
class CifarBinary:
    """A CIFAR set read from its binary version (Krizhevsky 2009): fixed-size records of label
    bytes then 3,072 pixel bytes, the 1,024 red, 1,024 green, 1,024 blue values of a 32x32
    image, each plane row-major. The features are those bytes as they stand, (C, H, W) order.

    ``data_dir`` may be the folder of the ``.bin`` files, the folder holding it (the archive's
    ``subfolder``), or the folder holding the distributed ``archive``, read as it is (its
    members found by name, nothing extracted); the first of these three where any of the files
    is found is read. The archive is checked against its published
    MD5 (``archive_md5``, from the CIFAR page); the ``.bin`` files have no published digest
    and are not checked. Subclasses name the files and the label bytes."""

    data_dir: str = ""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    input_shape: ClassVar[tuple[int, ...]] = (3, 32, 32)
    num_features: ClassVar[int] = 3 * 32 * 32
    train_size: ClassVar[int] = 50_000
    natural_groups: ClassVar[bool] = False
    archive: ClassVar[str] = ""
    archive_md5: ClassVar[str] = ""
    subfolder: ClassVar[str] = ""
    train_files: ClassVar[tuple[str, ...]] = ()
    test_files: ClassVar[tuple[str, ...]] = ()
    # The classes of each label byte of a record, in the file's order.
    label_classes: ClassVar[tuple[int, ...]] = ()

    @property
    def label_byte(self) -> int:
        """Which of a record's label bytes is the label."""
        return 0

    def unavailable_hint(self) -> str:
        return f"put the {self.title} binary version ({self.archive}, or its {self.subfolder}/ folder) in data.dir"

    def folder(self) -> Path:
        return _data_folder(self.name, self.data_dir, self.unavailable_hint())

    def _location(self) -> tuple[Path, bool]:
        """Where the files are: (their folder, False) or (the archive, True)."""
        directory = self.folder()
        for candidate in (directory, directory / self.subfolder):
            if any((candidate / name).is_file() for name in (*self.train_files, *self.test_files)):
                return candidate, False
        if (directory / self.archive).is_file():
            return directory / self.archive, True
        return directory, False  # the check names the first file missing

    def check(self) -> None:
        where, packed = self._location()
        if packed:
            return  # its members are checked as it is read, once per machine (the cache)
        for name in (*self.train_files, *self.test_files):
            if not (where / name).is_file():
                raise DatasetUnavailable(f"{self.name}: {name} not found in {where}; {self.unavailable_hint()}")

    def source(self) -> dict[str, Any]:
        self.check()
        where, packed = self._location()
        paths = [where] if packed else [where / name for name in (*self.train_files, *self.test_files)]
        return {"name": self.name, "folder": str(paths[0].parent.resolve()), "files": _stamps(paths), "settings": _settings(self)}

    def pixels(self) -> tuple[dict[str, np.ndarray], float]:
        self.check()
        where, packed = self._location()
        names = (*self.train_files, *self.test_files)
        if packed:
            raw = self._members(where, names)
            origin = {name: f"{where}:{self.subfolder}/{name}" for name in names}
        else:
            raw = {name: (where / name).read_bytes() for name in names}
            origin = {name: str(where / name) for name in names}
        arrays: dict[str, np.ndarray] = {}
        for split, files in (("train", self.train_files), ("test", self.test_files)):
            records = [self._records(raw.pop(name), origin[name]) for name in files]
            arrays[f"{split}_x"] = np.concatenate([x for x, _ in records])
            arrays[f"{split}_y"] = np.concatenate([y for _, y in records])
        return arrays, 255.0

    def _records(self, data: bytes, origin: str) -> tuple[np.ndarray, np.ndarray]:
        """(pixels [n, 3072], labels [n]) of one file's records, checked."""
        head = len(self.label_classes)
        size = head + self.num_features
        if not data or len(data) % size:
            raise ValueError(f"{origin}: {len(data)} bytes is not a whole number of {size}-byte records (truncated?)")
        records = np.frombuffer(data, dtype=np.uint8).reshape(-1, size)
        for byte, classes in enumerate(self.label_classes):
            bad = np.flatnonzero(records[:, byte] >= classes)
            if bad.size:
                raise ValueError(
                    f"{origin}: record {bad[0]} has label byte {byte} = {records[bad[0], byte]}; it must lie in 0..{classes - 1}"
                )
        return records[:, head:], records[:, self.label_byte].copy()

    def _members(self, archive: Path, names: tuple[str, ...]) -> dict[str, bytes]:
        """The bytes of ``subfolder/NAME`` for each name, read from the archive in one pass."""
        if self.archive_md5:
            got = _digest(archive, "md5", "file")
            if got != self.archive_md5:
                raise ValueError(
                    f"{self.name}: {archive} has MD5 {got}, the published {self.archive} has {self.archive_md5}: damaged or "
                    f"not the official archive (download it again, or put the {self.subfolder}/ folder it holds in data.dir)"
                )
        wanted = {f"{self.subfolder}/{name}": name for name in names}
        found: dict[str, bytes] = {}
        try:
            # Stream mode: members are read in order, each once; nothing is written to disk and
            # a member's path is only compared with the names above, never followed.
            with tarfile.open(archive, mode="r|gz") as tar:
                for member in tar:
                    name = wanted.get(member.name.removeprefix("./"))
                    if name is None:
                        continue
                    if not member.isfile() or name in found:
                        raise ValueError(f"{archive}: member {member.name} is not one regular file")
                    found[name] = tar.extractfile(member).read()
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"{archive}: not a readable .tar.gz archive ({' '.join(str(exc).split())})") from None
        missing = [member for member, name in wanted.items() if name not in found]
        if missing:
            raise ValueError(f"{archive}: no member {missing[0]}; {self.unavailable_hint()}")
        return found

    def load(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        return _scaled(*self.pixels())


@DATASET_REGISTRY.register("cifar10")
@dataclass(frozen=True)
class CIFAR10(CifarBinary):
    """CIFAR-10 (Krizhevsky 2009): 32x32 colour images of 10 classes, 50,000 + 10,000.

    Read from the binary version in ``data.dir``: ``cifar-10-binary.tar.gz`` or its
    ``cifar-10-batches-bin/`` folder (``data_batch_1.bin`` .. ``data_batch_5.bin``, ``test_batch.bin``).
    """

    name: ClassVar[str] = "cifar10"
    title: ClassVar[str] = "CIFAR-10"
    num_classes: ClassVar[int] = 10
    archive: ClassVar[str] = "cifar-10-binary.tar.gz"
    archive_md5: ClassVar[str] = "c32a1d4ab5d03f1284b67883e8d87530"
    subfolder: ClassVar[str] = "cifar-10-batches-bin"
    train_files: ClassVar[tuple[str, ...]] = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
    test_files: ClassVar[tuple[str, ...]] = ("test_batch.bin",)
    label_classes: ClassVar[tuple[int, ...]] = (10,)


CIFAR100_LABELS = ("fine", "coarse")


@DATASET_REGISTRY.register("cifar100")
@dataclass(frozen=True)
class CIFAR100(CifarBinary):
    """CIFAR-100 (Krizhevsky 2009): 32x32 colour images, 100 fine classes in 20 coarse ones.

    Read from the binary version in ``data.dir``: ``cifar-100-binary.tar.gz`` or its
    ``cifar-100-binary/`` folder (``train.bin``, ``test.bin``). ``labels``: ``"fine"`` (100
    classes) or ``"coarse"`` (20 superclasses).
    """

    labels: str = "fine"

    name: ClassVar[str] = "cifar100"
    title: ClassVar[str] = "CIFAR-100"
    archive: ClassVar[str] = "cifar-100-binary.tar.gz"
    archive_md5: ClassVar[str] = "03b5dce01913d631647c71ecec9e9cb8"
    subfolder: ClassVar[str] = "cifar-100-binary"
    train_files: ClassVar[tuple[str, ...]] = ("train.bin",)
    test_files: ClassVar[tuple[str, ...]] = ("test.bin",)
    label_classes: ClassVar[tuple[int, ...]] = (20, 100)  # a record's coarse byte, then its fine byte

    def __post_init__(self) -> None:
        check_choice("cifar100", "labels", self.labels, CIFAR100_LABELS)

    @property
    def label_byte(self) -> int:
        return 1 if self.labels == "fine" else 0

    @property
    def num_classes(self) -> int:
        return self.label_classes[self.label_byte]


# ---------------------------------------------------------------------------------------------
# FEMNIST, LEAF's JSON files


@DATASET_REGISTRY.register("femnist")
@dataclass(frozen=True)
class FEMNIST:
    """FEMNIST (LEAF, Caldas et al. 2018): 28x28 greyscale characters of 62 classes, by writer.

    The writers are the groups of ``data.partition = "natural"``. Read from the JSON files of
    LEAF's preprocessing: ``data.dir`` holds ``train/*.json`` and ``test/*.json`` (LEAF's
    ``data/femnist/data``), each read once. Pixels, written as grey level / 255, are stored as
    the grey levels; a value that is no grey level is refused. Writers are sorted by id, each
    writer's rows kept in file order. ``max_writers``: 0 reads every writer, N only the first N
    writers (sorted) of each split (after LEAF's sample split, normally the same ones).
    """

    data_dir: str = ""
    max_writers: int = 0

    name: ClassVar[str] = "femnist"
    input_shape: ClassVar[tuple[int, ...]] = (1, 28, 28)
    num_features: ClassVar[int] = 784
    num_classes: ClassVar[int] = 62
    # A bound known without reading the files (messages are checked against it): LEAF's full
    # FEMNIST has about 805,000 samples in all.
    train_size: ClassVar[int] = 1_000_000
    natural_groups: ClassVar[bool] = True
    splits: ClassVar[tuple[str, ...]] = ("train", "test")

    def __post_init__(self) -> None:
        check_int("femnist", "max_writers", self.max_writers, minimum=0)

    def unavailable_hint(self) -> str:
        return "set data.dir to the folder holding LEAF's train/ and test/ folders of FEMNIST JSON files (data/femnist/data after its preprocessing)"

    def folder(self) -> Path:
        return _data_folder(self.name, self.data_dir, self.unavailable_hint())

    def files(self, split: str) -> list[Path]:
        directory = self.folder() / split
        if not directory.is_dir():
            raise DatasetUnavailable(f"{self.name}: no {split}/ folder in {self.folder()}; {self.unavailable_hint()}")
        found = sorted(p for p in directory.glob("*.json") if p.is_file())
        if not found:
            raise DatasetUnavailable(f"{self.name}: no .json files in {directory}; {self.unavailable_hint()}")
        return found

    def check(self) -> None:
        for split in self.splits:
            self.files(split)

    def source(self) -> dict[str, Any]:
        root = self.folder()
        paths = [p for split in self.splits for p in self.files(split)]
        return {"name": self.name, "folder": str(root.resolve()), "files": _stamps(paths, root), "settings": _settings(self)}

    def pixels(self) -> tuple[dict[str, np.ndarray], float]:
        arrays: dict[str, np.ndarray] = {}
        for split in self.splits:
            writers = read_leaf_writers(self.files(split), self.num_features, self.num_classes)
            chosen = sorted(writers)[: self.max_writers or None]
            arrays[f"{split}_x"] = np.concatenate([writers[w][0] for w in chosen])
            arrays[f"{split}_y"] = np.concatenate([writers[w][1] for w in chosen])
            if split == "train":
                sizes = [len(writers[w][1]) for w in chosen]
                arrays["train_groups"] = np.repeat(np.arange(len(chosen), dtype=np.int32), sizes)
        return arrays, 255.0

    def load(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, np.ndarray]]:
        return _scaled(*self.pixels())


# A pixel LEAF wrote as k / 255 reads back within this of it (JSON keeps a float64 exactly).
LEAF_TOLERANCE = 1e-6


def read_leaf_writers(paths: list[Path], features: int, classes: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each writer's (grey levels uint8 [n, features], labels uint8 [n]) from LEAF JSON files
    (``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``),
    each file read once. Writers without samples are left out. Raises ValueError naming the file
    (and writer) for anything that is not such a file, a writer in two files, a label outside
    ``0 .. classes - 1``, or a pixel outside [0, 1] or not within :data:`LEAF_TOLERANCE` of k/255."""
    writers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    seen_in: dict[str, Path] = {}
    for path in paths:
        try:
            with open(path, "rb") as handle:
                content = json.load(handle)
            users, user_data = content["users"], content["user_data"]
            counts = content.get("num_samples", [None] * len(users))
            if not isinstance(users, list) or not isinstance(user_data, dict) or len(counts) != len(users):
                raise TypeError("users, num_samples and user_data do not match")
            if set(users) != set(user_data) or len(set(users)) != len(users):
                raise TypeError("users and the keys of user_data differ")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}: not a LEAF data file ({type(exc).__name__}: {' '.join(str(exc).split())})") from None
        for user, count in zip(users, counts):
            where = f"{path}: writer {user!r}"
            if user in seen_in:
                raise ValueError(f"{where} is also in {seen_in[user]}")
            seen_in[user] = path
            x, y = _leaf_samples(user_data[user], where, features, classes)
            if count is not None and count != len(y):
                raise ValueError(f"{where}: num_samples says {count}, user_data holds {len(y)}")
            if len(y):
                writers[user] = (x, y)
    return writers


def _leaf_samples(data: Any, where: str, features: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        x = np.asarray(data["x"], dtype=np.float64)
        y = np.asarray(data["y"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: x and y must be lists of samples and labels ({' '.join(str(exc).split())})") from None
    if y.ndim != 1 or (y.size and not np.issubdtype(y.dtype, np.integer)):
        raise ValueError(f"{where}: y must be a list of integer labels")
    if y.size == 0:
        return np.zeros((0, features), np.uint8), np.zeros(0, np.uint8)
    if x.shape != (y.size, features):
        raise ValueError(f"{where}: x must be {y.size} samples of {features} values, one per label, got shape {x.shape}")
    if y.min() < 0 or y.max() >= classes:
        raise ValueError(f"{where}: labels must lie in 0..{classes - 1}, found {y.min()}..{y.max()}")
    outside = ~((x >= 0) & (x <= 1))  # NaN is outside too
    levels = np.rint(np.where(outside, 0, x) * 255)
    off = outside | (np.abs(x - levels / 255) > LEAF_TOLERANCE)
    if off.any():
        row, column = (int(i[0]) for i in np.nonzero(off))
        raise ValueError(f"{where}: sample {row} value {column} is {float(x[row, column])!r}, not a grey level k/255 in [0, 1]")
    return levels.astype(np.uint8), y.astype(np.uint8)


def _data_folder(name: str, chosen: str | None, hint: str) -> Path:
    """The folder a set reads, which must exist; one line saying what to do otherwise."""
    if not chosen:
        raise DatasetUnavailable(f"{name}: no data directory given; {hint}")
    directory = Path(chosen)
    if not directory.is_dir():
        raise DatasetUnavailable(f"{name}: data directory {directory} does not exist; {hint}")
    return directory


def _stamps(paths: list[Path], root: Path | None = None) -> dict[str, list[int]]:
    """Each file's [size, modification time in ns], by name (by path under ``root`` if given)."""
    out = {}
    for path in paths:
        stat = path.stat()
        out[path.relative_to(root).as_posix() if root else path.name] = [stat.st_size, stat.st_mtime_ns]
    return out


def _settings(source: Any) -> dict[str, Any]:
    """A data set's settings (its constructor's fields but the folder): part of its cache key."""
    return {f.name: getattr(source, f.name) for f in fields(source) if f.name != "data_dir"}


def _scaled(arrays: dict[str, np.ndarray], scale: float) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, np.ndarray]]:
    """``pixels()`` as ``load()`` gives them: the training split with its groups if it has them."""

    def split(name: str) -> tuple[np.ndarray, np.ndarray]:
        # uint8 -> float32 is exact and "/ scale" one correctly rounded division: the same
        # values as the cache's rows (peer.datacache).
        return arrays[f"{name}_x"].astype(np.float32) / np.float32(scale), arrays[f"{name}_y"].astype(np.int64)

    groups = (arrays["train_groups"],) if "train_groups" in arrays else ()
    return (*split("train"), *groups), split("test")


# ---------------------------------------------------------------------------------------------
# Building and loading


def build_dataset(name: str, params: dict[str, Any] | None = None, data_dir: str | os.PathLike | None = None) -> Any:
    """The data set ``name`` with its settings; ``data_dir`` goes to a class that takes it.
    Raises ``ValueError`` for an unknown name or a bad setting; loads nothing."""
    return DATASET_REGISTRY.build(name, params, {"data_dir": str(data_dir or "")})


@functools.lru_cache(maxsize=16)
def dataset_of(name: str, tables: tuple, data_dir: str) -> Any:
    """The data set ``name`` with its settings from frozen settings tables (``[data.NAME]``, as
    a scenario keeps them), built once per process (nothing loaded)."""
    return build_dataset(name, settings_of(tables, name), data_dir)


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


def input_shape_of(source: Any) -> tuple[int, ...]:
    """The shape of one sample of a built data set: its ``input_shape``, checked (positive
    integers whose product is ``num_features``), or ``(num_features,)`` when it declares none.
    Raises ``ValueError`` naming the set."""
    features = int(source.num_features)
    declared = getattr(source, "input_shape", None)
    if declared is None:
        return (features,)
    try:
        shape = tuple(declared)
    except TypeError:
        shape = ()
    if not shape or any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1 for n in shape):
        raise ValueError(f"data set {describe(source)}: input_shape must be a tuple of positive integers, got {declared!r}")
    if math.prod(shape) != features:
        raise ValueError(f"data set {describe(source)}: input_shape {shape} holds {math.prod(shape)} values, the set declares num_features = {features}")
    return tuple(int(n) for n in shape)


def checked_groups(groups: Any, rows: int, what: str) -> np.ndarray:
    """A training split's natural groups as int32, one per row, each >= 0; ``ValueError``
    naming the set ``what`` otherwise."""
    array = np.asarray(groups)
    if array.ndim != 1 or array.shape[0] != rows:
        raise ValueError(f"data set {what}: train_groups must hold one group per training row ({rows}), got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"data set {what}: train_groups must be integers, got {array.dtype}")
    if array.size and (int(array.min()) < 0 or int(array.max()) > np.iinfo(np.int32).max):
        raise ValueError(f"data set {what}: train_groups must lie in 0..{np.iinfo(np.int32).max}, found {int(array.min())}..{int(array.max())}")
    return array.astype(np.int32)


def natural_groups_error(source: Any) -> str:
    """Why ``data.partition = "natural"`` cannot split ``source``: it has no natural groups."""
    having = [n for n in DATASET_REGISTRY.builtin_names() if getattr(DATASET_REGISTRY.resolve(n), "natural_groups", False) is True]
    return f"data.partition='natural' needs a data set with natural groups ({', '.join(having)}); {describe(source)} has none"


def load_splits(source: Any) -> tuple[Dataset, Dataset]:
    """``source.load()`` checked against what the set declares and made :class:`Dataset`\\ s:
    features flattened to ``num_features`` float32, labels int64 in ``0 .. num_classes - 1``,
    at most ``train_size`` training rows. Raises ``ValueError`` naming the set and what is wrong."""
    train, test, _ = load_grouped_splits(source)
    return train, test


def load_grouped_splits(source: Any) -> tuple[Dataset, Dataset, np.ndarray | None]:
    """:func:`load_splits` and the training rows' natural groups (int32; None when the set's
    ``load()`` gives none)."""
    import torch

    what = describe(source)
    try:
        train_split, (test_x, test_y) = source.load()
        train_x, train_y, *groups = train_split
        if len(groups) > 1:
            raise ValueError("too many values")
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValueError) and "not enough values" not in str(exc) and "too many values" not in str(exc):
            raise
        raise ValueError(
            f"data set {what}: load() must return ((train_x, train_y), (test_x, test_y)), or (train_x, train_y, train_groups) as its first"
        ) from None
    features, classes = int(source.num_features), int(source.num_classes)
    input_shape_of(source)

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
    return train, test, checked_groups(groups[0], len(train), what) if groups else None


@functools.lru_cache(maxsize=4)
def load_dataset(name: str, data_dir: str | os.PathLike | None = None) -> tuple[Dataset, Dataset]:
    """``(train, test)`` of the data set ``name`` with its default settings.

    Cached per process: clients that share a process share one read-only copy. ``digits``
    ignores ``data_dir``; ``fashion-mnist`` and ``mnist`` read the four IDX files (plain or
    ``.gz``) from ``data_dir``, falling back to their default folder; the other sets read
    ``data_dir`` (see their classes); a missing folder or file raises
    :class:`DatasetUnavailable`. Nothing is downloaded here: see :func:`download_idx`.
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
    """The hex digest of the file (``of`` = "gz" or "file") or of its gzip content ("idx")."""
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


def source_key(source: Any) -> tuple[str, dict[str, Any]]:
    """(key, description) of where a cacheable set's values come from (see :mod:`peer.datacache`)."""
    description = source.source()
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]
    return key, description
