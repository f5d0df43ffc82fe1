"""scikit-learn's 8x8 digits, offline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dfedrw.peer.checked import Checked
from dfedrw.peer.learning.datasets.registry import DATASET_REGISTRY
from dfedrw.peer.learning.datasets.files import scaled_splits


@DATASET_REGISTRY.register("digits")
@dataclass(frozen=True)
class Digits(Checked):
    """scikit-learn's 8x8 handwritten digits: 1,797 images, a fixed stratified 80/20 split.

    Always available offline (it ships with scikit-learn). Pixels 0..16 scaled to [0, 1]."""

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
        return scaled_splits(*self.pixels())
