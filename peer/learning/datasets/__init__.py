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

Optional, for the built-in sets: ``check()`` raises :class:`~dfedrw.peer.learning.data.DatasetUnavailable`
without loading (a launcher checks before it starts clients); ``pixels()`` and ``source()``
give uint8 arrays (``train_x``, ``train_y``, ``test_x``, ``test_y``, and ``train_groups`` for a
set with natural groups) and a description of their origin, which lets the machine-wide cache
(:mod:`peer.learning.datacache`) store the set once for every client process to map; ``folder()`` is a
folder of files the set reads (mounted into containers by ``dfedrw compose``). A set without
``pixels`` is loaded by each process that needs it.

Built in: scikit-learn's 8x8 ``digits`` (offline); ``fashion-mnist`` and ``mnist`` read from
the standard IDX files in a folder (Debian's ``dataset-fashion-mnist`` for the first;
``dfedrw fetch`` downloads either on a machine online); ``cifar10`` and ``cifar100`` read from
the binary version of CIFAR (its ``.tar.gz`` or the folder in it); ``femnist`` read from the
JSON files of LEAF's preprocessing, grouped by writer. Nothing is downloaded for the last three.
"""

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

