"""Building a data set by name and loading it: its values checked against what it declares, its
natural groups, its cache key."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import numbers
import os
from typing import Any

import numpy as np

from dfedrw.peer.learning.data import Dataset
from dfedrw.peer.registry import settings_of
from dfedrw.peer.learning.datasets.registry import DATASET_REGISTRY


def build_dataset(name: str, params: dict[str, Any] | None = None, data_dir: str | os.PathLike | None = None) -> Any:
    """The data set ``name`` with its settings; ``data_dir`` goes to a class that takes it.
    Raises ``ValueError`` for an unknown name or a bad setting; loads nothing."""
    return DATASET_REGISTRY.build(name, params, {"data_dir": str(data_dir or "")})


def dataset_layout(name: str, params: dict[str, Any] | None = None, data_dir: str | os.PathLike | None = None) -> Any:
    """The data set ``name`` with its settings, checked and described (``num_features``,
    ``num_classes``, ``input_shape``, ``natural_groups``...) without building it: a built-in set
    is read off its class (:meth:`Registry.described`), a plugin's is built (which loads nothing).
    Raises ``ValueError`` as :func:`build_dataset` does."""
    return DATASET_REGISTRY.described(name, params, {"data_dir": str(data_dir or "")})


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
    """``(train, test)`` of the data set ``name`` with its default settings, cached per process
    (clients in one process share one read-only copy). ``digits`` ignores ``data_dir``; the others
    read it as their classes say (an IDX set falls back to its ``default_dir``); a missing folder or
    file raises :class:`DatasetUnavailable`. Nothing is downloaded here (:func:`download_idx`)."""
    source = build_dataset(name, None, data_dir)
    check_available(source)
    return load_splits(source)


def source_key(source: Any) -> tuple[str, dict[str, Any]]:
    """(key, description) of where a cacheable set's values come from (see :mod:`peer.learning.datacache`)."""
    description = source.source()
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]
    return key, description
