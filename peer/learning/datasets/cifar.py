"""CIFAR-10 and CIFAR-100, read from the binary version of CIFAR (its ``.tar.gz`` or the folder in
it)."""

from __future__ import annotations

import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np

from dfedrw.peer.checked import Checked
from dfedrw.peer.learning.data import DatasetUnavailable
from dfedrw.peer.registry import check_choice
from dfedrw.peer.learning.datasets.registry import DATASET_REGISTRY
from dfedrw.peer.learning.datasets.files import cache_settings, data_folder, file_digest, file_stamps, scaled_splits


@dataclass(frozen=True)
class CifarBinary(Checked):
    """A CIFAR set read from its binary version (Krizhevsky 2009): fixed-size records of label
    bytes then 3,072 pixel bytes, the 1,024 red, 1,024 green, 1,024 blue values of a 32x32
    image, each plane row-major. The features are those bytes as they stand, (C, H, W) order.

    ``data_dir`` may be the folder of the ``.bin`` files, the folder holding it (the archive's
    ``subfolder``), or the folder holding the distributed ``archive``, read as it is (members found
    by name, nothing extracted): the first of these that holds any of the files. The archive is
    checked against its published MD5 (``archive_md5``, from the CIFAR page); the ``.bin`` files
    have no published digest and are not checked. Subclasses name the files and the label bytes."""

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
        return data_folder(self.name, self.data_dir, self.unavailable_hint())

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
        return {"name": self.name, "folder": str(paths[0].parent.resolve()), "files": file_stamps(paths), "settings": cache_settings(self)}

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
            got = file_digest(archive, "md5", "file")
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
        return scaled_splits(*self.pixels())


@DATASET_REGISTRY.register("cifar10")
@dataclass(frozen=True)
class CIFAR10(CifarBinary):
    """CIFAR-10 (Krizhevsky 2009): 32x32 colour images of 10 classes, 50,000 + 10,000.

    Read from the binary version in ``data.dir``: ``cifar-10-binary.tar.gz`` or its folder
    ``cifar-10-batches-bin/`` (``data_batch_1.bin`` .. ``data_batch_5.bin``, ``test_batch.bin``)."""

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
    classes) or ``"coarse"`` (20 superclasses)."""

    labels: str = "fine"

    name: ClassVar[str] = "cifar100"
    title: ClassVar[str] = "CIFAR-100"
    archive: ClassVar[str] = "cifar-100-binary.tar.gz"
    archive_md5: ClassVar[str] = "03b5dce01913d631647c71ecec9e9cb8"
    subfolder: ClassVar[str] = "cifar-100-binary"
    train_files: ClassVar[tuple[str, ...]] = ("train.bin",)
    test_files: ClassVar[tuple[str, ...]] = ("test.bin",)
    label_classes: ClassVar[tuple[int, ...]] = (20, 100)  # a record's coarse byte, then its fine byte

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        check_choice("cifar100", "labels", s.labels, CIFAR100_LABELS)

    @property
    def label_byte(self) -> int:
        return 1 if self.labels == "fine" else 0

    @property
    def num_classes(self) -> int:
        return self.label_classes[self.label_byte]
