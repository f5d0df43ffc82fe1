"""Synthetic 28x28 greyscale images of 10 classes, written as the four IDX files of MNIST's and
Fashion-MNIST's layout, for benchmarks on a machine that has neither data set (a GPU machine
that reaches no network, say): read them with ``data.name = "fashion-mnist"`` and
``data.dir = DIR``.

    python bench/synthetic_idx.py DIR                      # 60,000 + 10,000, as Fashion-MNIST
    python bench/synthetic_idx.py DIR --train 6000 --test 1000

The files have Fashion-MNIST's shapes and counts, so a round costs what it costs on Fashion-MNIST
(the arithmetic does not depend on the pixels); accuracies on them say nothing of
Fashion-MNIST's. Each class is a smooth random template (a 7x7 grid of grey levels, enlarged
4x); an image is its class's template, shifted by up to two pixels, dimmed or brightened, with
uniform noise, so that a model learns it well but not at once. The same arguments give the same
bytes (integer draws only, from numpy's PCG64): it prints the SHA-256 of each file, to check
that two machines benchmarked the same data.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import struct
import sys
from pathlib import Path

import numpy as np

FILES = {
    "train-images-idx3-ubyte": "train_images",
    "train-labels-idx1-ubyte": "train_labels",
    "t10k-images-idx3-ubyte": "test_images",
    "t10k-labels-idx1-ubyte": "test_labels",
}


def idx(array: np.ndarray) -> bytes:
    """``array`` (uint8) in the IDX format: two zero bytes, the type code 0x08, the number of
    dimensions, each dimension as a big-endian int32, then the bytes."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">i", d) for d in array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def images(rng: np.random.Generator, templates: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` images and their labels (classes in turn, then shuffled)."""
    labels = (np.arange(count) % len(templates)).astype(np.uint8)
    labels = labels[rng.permutation(count)]
    out = np.empty((count, 28, 28), dtype=np.uint8)
    block = 5000  # rows at a time: the int16 working arrays stay small
    for lo in range(0, count, block):
        ys = labels[lo : lo + block]
        n = len(ys)
        shifts = rng.integers(-2, 3, size=(n, 2))
        gain = rng.integers(6, 13, size=(n, 1, 1)).astype(np.int32)  # tenths
        noise = rng.integers(-70, 71, size=(n, 28, 28)).astype(np.int32)
        base = templates[ys].astype(np.int32)
        for i in range(n):
            base[i] = np.roll(base[i], tuple(shifts[i]), axis=(0, 1))
        out[lo : lo + n] = np.clip(base * gain // 10 + noise, 0, 255).astype(np.uint8)
    return out, labels


def generate(directory: Path, train: int, test: int, seed: int, compress: bool = False) -> dict[str, str]:
    """Write the four files into ``directory``; returns each file's name -> SHA-256."""
    rng = np.random.default_rng(seed)
    grid = rng.integers(0, 256, size=(10, 7, 7))
    templates = np.kron(grid, np.ones((4, 4), dtype=grid.dtype))  # [10, 28, 28]
    arrays = {}
    arrays["train_images"], arrays["train_labels"] = images(rng, templates, train)
    arrays["test_images"], arrays["test_labels"] = images(rng, templates, test)
    directory.mkdir(parents=True, exist_ok=True)
    digests = {}
    for stem, role in FILES.items():
        data = idx(arrays[role])
        name = stem + (".gz" if compress else "")
        (directory / name).write_bytes(gzip.compress(data, mtime=0) if compress else data)
        digests[name] = hashlib.sha256(data).hexdigest()
    return digests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path, help="the folder to write the four IDX files into")
    parser.add_argument("--train", type=int, default=60_000, help="training images (at most 60,000: the count the IDX sets declare)")
    parser.add_argument("--test", type=int, default=10_000, help="test images")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gzip", action="store_true", help="write .gz files")
    args = parser.parse_args(argv)
    if not 10 <= args.train <= 60_000 or args.test < 10:
        parser.error("--train must lie in 10..60000 and --test be at least 10")
    for name, digest in generate(args.dir, args.train, args.test, args.seed, args.gzip).items():
        print(f"{digest}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
