"""What the built-in sets share of reading files: the folder a set reads (or one line saying what
to put there), the files' sizes and times and a set's settings (its cache key), a file's digest,
and the cached bytes as ``load()`` gives them."""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from dfedrw.peer.learning.data import DatasetUnavailable


def data_folder(name: str, chosen: str | None, hint: str) -> Path:
    """The folder a set reads, which must exist; one line saying what to do otherwise."""
    if not chosen:
        raise DatasetUnavailable(f"{name}: no data directory given; {hint}")
    directory = Path(chosen)
    if not directory.is_dir():
        raise DatasetUnavailable(f"{name}: data directory {directory} does not exist; {hint}")
    return directory


def file_stamps(paths: list[Path], root: Path | None = None) -> dict[str, list[int]]:
    """Each file's [size, modification time in ns], by name (by path under ``root`` if given)."""
    out = {}
    for path in paths:
        stat = path.stat()
        out[path.relative_to(root).as_posix() if root else path.name] = [stat.st_size, stat.st_mtime_ns]
    return out


def cache_settings(source: Any) -> dict[str, Any]:
    """A data set's settings (its constructor's fields but the folder): part of its cache key."""
    return {f.name: getattr(source, f.name) for f in fields(source) if f.name != "data_dir"}


def scaled_splits(arrays: dict[str, np.ndarray], scale: float) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, np.ndarray]]:
    """``pixels()`` as ``load()`` gives them: the training split with its groups if it has them."""

    def split(name: str) -> tuple[np.ndarray, np.ndarray]:
        # uint8 -> float32 is exact and "/ scale" one correctly rounded division: the same
        # values as the cache's rows (peer.learning.datacache).
        return arrays[f"{name}_x"].astype(np.float32) / np.float32(scale), arrays[f"{name}_y"].astype(np.int64)

    groups = (arrays["train_groups"],) if "train_groups" in arrays else ()
    return (*split("train"), *groups), split("test")


def file_digest(path: Path, algorithm: str, of: str) -> str:
    """The hex digest of the file (``of`` = "gz" or "file") or of its gzip content ("idx")."""
    h = hashlib.new(algorithm)
    opener = gzip.open if of == "idx" else open
    with opener(path, "rb") as handle:
        while block := handle.read(1 << 20):
            h.update(block)
    return h.hexdigest()
