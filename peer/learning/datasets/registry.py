"""The data set registry (``data.name``); every module of this package registers its sets in it."""

from __future__ import annotations

from dfedrw.peer.registry import Registry


DATASET_REGISTRY = Registry(
    "dataset", "dfedrw.datasets", package=__package__, modules=tuple(f"{__package__}.{m}" for m in ("digits", "idx", "cifar", "femnist")),
    required=("load",), supplied=("data_dir",), calls={"load": ()},
)
"""The data sets by name; settings in a scenario's ``[data.NAME]``, ``data_dir`` from ``data.dir``."""
