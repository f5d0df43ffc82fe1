"""FEMNIST, read from the JSON files of LEAF's preprocessing, grouped by writer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np

from dfedrw.peer.checked import Checked
from dfedrw.peer.learning.data import DatasetUnavailable
from dfedrw.peer.registry import check_int
from dfedrw.peer.learning.datasets.registry import DATASET_REGISTRY
from dfedrw.peer.learning.datasets.files import cache_settings, data_folder, file_stamps, scaled_splits


@DATASET_REGISTRY.register("femnist")
@dataclass(frozen=True)
class FEMNIST(Checked):
    """FEMNIST (LEAF, Caldas et al. 2018): 28x28 greyscale characters of 62 classes, by writer.

    The writers are the groups of ``data.partition = "natural"``. Read from the JSON files of
    LEAF's preprocessing: ``data.dir`` holds ``train/*.json`` and ``test/*.json`` (LEAF's
    ``data/femnist/data``), each read once. Pixels, written as grey level / 255, are stored as
    the grey levels; a value that is no grey level is refused. Writers are sorted by id, each
    writer's rows kept in file order. ``max_writers``: 0 reads every writer, N only the first N
    writers (sorted) of each split (after LEAF's sample split, normally the same ones)."""

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

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        check_int("femnist", "max_writers", s.max_writers, minimum=0)

    def unavailable_hint(self) -> str:
        return "set data.dir to the folder holding LEAF's train/ and test/ folders of FEMNIST JSON files (data/femnist/data after its preprocessing)"

    def folder(self) -> Path:
        return data_folder(self.name, self.data_dir, self.unavailable_hint())

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
        return {"name": self.name, "folder": str(root.resolve()), "files": file_stamps(paths, root), "settings": cache_settings(self)}

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
        return scaled_splits(*self.pixels())


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
