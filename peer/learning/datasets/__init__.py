"""The data sets a scenario can name (``data.name``): one registry, one class each.

A data set is a class registered in :data:`DATASET_REGISTRY` (or named by import path
``"module:Class"``, or an installed plugin of the ``dfedrw.datasets`` entry-point group). Its
constructor's keyword parameters are its settings (``[data.NAME]`` in a scenario); ``data_dir`` is
supplied from ``data.dir`` to a class that takes it. A built instance says, without loading
anything, what every client (a Byzantine one holds no data) must know:

* ``input_shape``: one sample's shape, ``(channels, height, width)`` for images, whose product is
  ``num_features``; a plugin set without it has ``(num_features,)`` (:func:`input_shape_of`);
* ``num_features``: features per sample (images are flattened, channel-major);
* ``num_classes``: labels are ``0 .. num_classes - 1``;
* ``train_size``: rows of the training set, at most (bounds the size a message may declare);

and ``load()`` returns ``((train_x, train_y), (test_x, test_y))``: float features ``[n, ...]``
(flattened to ``num_features``) and integer labels ``[n]``, as tensors or numpy arrays, checked
against what the instance declared (:func:`load_splits`). A set whose samples fall into natural
groups (FEMNIST's writers, for ``data.partition = "natural"``) gives the training split as
``(train_x, train_y, train_groups)``: one integer group per row, >= 0; its class attribute
``natural_groups`` says so. With a natural partition, a set that says False is refused when the
scenario is loaded, one that says nothing when its data is loaded.

Optional, for the built-in sets: ``check()`` raises :class:`~dfedrw.peer.learning.data.DatasetUnavailable`
without loading (a launcher checks before it starts clients); ``pixels()`` (uint8 ``train_x``,
``train_y``, ``test_x``, ``test_y``; ``train_groups`` too for a set with natural groups) and
``source()`` (their origin) let the machine-wide cache (:mod:`peer.learning.datacache`) store the
set once for every client process to map; ``folder()``: the folder of files the set reads
(mounted into containers by ``dfedrw compose``).

Built in: ``digits`` (:mod:`.digits`, offline), ``fashion-mnist`` and ``mnist`` (:mod:`.idx`, the
only ones ``dfedrw fetch`` downloads), ``cifar10`` and ``cifar100`` (:mod:`.cifar`) and ``femnist``
(:mod:`.femnist`); each module says what its sets read."""

from __future__ import annotations

from dfedrw.peer.learning.datasets.registry import DATASET_REGISTRY
from dfedrw.peer.learning.datasets.digits import Digits
from dfedrw.peer.learning.datasets.idx import IDX_FILES, FashionMNIST, IdxDataset, MNIST, download_idx, idx_digest_error
from dfedrw.peer.learning.datasets.cifar import CIFAR10, CIFAR100, CifarBinary
from dfedrw.peer.learning.datasets.femnist import FEMNIST, LEAF_TOLERANCE, read_leaf_writers
from dfedrw.peer.learning.datasets.loading import (
    build_dataset, check_available, check_dataset, checked_groups, dataset_layout, dataset_of, describe, input_shape_of, load_dataset, load_grouped_splits,
    load_splits, natural_groups_error, source_key,
)

__all__ = [
    "CIFAR10",
    "CIFAR100",
    "DATASET_REGISTRY",
    "FEMNIST",
    "IDX_FILES",
    "LEAF_TOLERANCE",
    "CifarBinary",
    "Digits",
    "FashionMNIST",
    "IdxDataset",
    "MNIST",
    "build_dataset",
    "check_available",
    "check_dataset",
    "checked_groups",
    "dataset_layout",
    "dataset_of",
    "describe",
    "download_idx",
    "idx_digest_error",
    "input_shape_of",
    "load_dataset",
    "load_grouped_splits",
    "load_splits",
    "natural_groups_error",
    "read_leaf_writers",
    "source_key",
]

