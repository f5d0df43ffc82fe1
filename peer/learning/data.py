"""Data held as tensors, client partitions, local test sets, auxiliary subsets, augmentation.

Which data sets a scenario can name, and how each is loaded, is :mod:`peer.learning.datasets`.
Partitions follow the paper's "Experimental Settings": IID, Dirichlet(alpha) and LabelSkew(h);
"natural" deals a data set's own groups (FEMNIST's writers) to the clients. Every randomised
function takes an explicit seed; nothing here touches global RNG state or writes to disk."""

from __future__ import annotations

import heapq
import math
import numbers
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from dfedrw.peer.quote import shown

__all__ = [
    "PARTITION_FORMS",
    "Dataset",
    "DatasetUnavailable",
    "aux_indices",
    "local_test_indices",
    "parse_partition",
    "partition",
]

PARTITION_FORMS = ("iid", "iid:balanced", "dirichlet:ALPHA (ALPHA > 0)", "labelskew:H (1 <= H <= num_classes)", "natural")

# Bounded so that an impossible request (e.g. more clients than samples allow) fails fast.
DIRICHLET_MAX_TRIES = 1000


@dataclass(frozen=True)
class Dataset:
    """Features and labels held as tensors: ``x`` float32 ``[n, features]``, pixel values scaled
    to [0, 1] and images flattened; ``y`` int64 ``[n]``, values in ``0 .. num_classes - 1``."""

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int

    def __post_init__(self) -> None:
        if self.x.ndim != 2:
            raise ValueError(f"Dataset.x must be 2-D [n, features], got shape {tuple(self.x.shape)}")
        if self.y.ndim != 1 or self.y.shape[0] != self.x.shape[0]:
            raise ValueError(
                f"Dataset.y must be 1-D with {self.x.shape[0]} entries, got shape {tuple(self.y.shape)}"
            )
        if self.num_classes < 1:
            raise ValueError(f"Dataset.num_classes must be >= 1, got {self.num_classes}")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, idx: Sequence[int] | np.ndarray | torch.Tensor) -> "Dataset":
        """The rows ``idx`` (any integer index sequence) as a new Dataset."""
        index = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        return Dataset(x=self.x[index], y=self.y[index], num_classes=self.num_classes)

    def dataset(self) -> "Dataset":
        """Every row (itself: what a split mapped from the data cache converts on demand)."""
        return self


class DatasetUnavailable(RuntimeError):
    """The dataset's files are not on this machine; the message says how to get them."""


# ---------------------------------------------------------------------------------------------
# Partitions


def _partition_error(spec: object, why: str) -> ValueError:
    return ValueError(f"bad partition spec {shown(spec)}: {why}; valid forms: {', '.join(PARTITION_FORMS)}")


def parse_partition(spec: str) -> tuple[str, float | int | str | None]:
    """Parse a partition spec into ``(kind, parameter)``: ``"iid"`` -> ``("iid", None)``;
    ``"iid:balanced"`` -> ``("iid", "balanced")``; ``"dirichlet:0.1"`` -> ``("dirichlet", 0.1)``;
    ``"labelskew:4"`` -> ``("labelskew", 4)``; ``"natural"`` -> ``("natural", None)``. Anything
    else raises ValueError listing the valid forms. The upper bound of H is checked by
    :func:`partition`, which knows the labels."""
    if not isinstance(spec, str):
        raise _partition_error(spec, "not a string")
    text = spec.strip().lower()
    if text in ("iid", "natural"):
        return text, None
    if text == "iid:balanced":
        return "iid", "balanced"
    kind, sep, arg = text.partition(":")
    if not sep:
        raise _partition_error(spec, "unknown form")
    arg = arg.strip()
    if kind == "dirichlet":
        try:
            alpha = float(arg)
        except ValueError:
            raise _partition_error(spec, f"ALPHA {arg!r} is not a number") from None
        if not math.isfinite(alpha) or alpha <= 0:
            raise _partition_error(spec, f"ALPHA must be a finite number > 0, got {arg!r}")
        return "dirichlet", alpha
    if kind == "labelskew":
        if not re.fullmatch(r"[+]?\d+", arg):
            raise _partition_error(spec, f"H {arg!r} is not a positive integer")
        h = int(arg)
        if h < 1:
            raise _partition_error(spec, f"H must be >= 1, got {h}")
        return "labelskew", h
    raise _partition_error(spec, f"unknown kind {kind!r}")


def _sorted_int64(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _partition_iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    per_client = n // num_clients
    order = rng.permutation(n)[: per_client * num_clients]
    return _sorted_int64(np.split(order, num_clients))


def _partition_iid_balanced(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    classes = np.unique(labels)
    counts = {int(c): int((labels == c).sum()) for c in classes}
    short = [c for c, n in counts.items() if n < num_clients]
    if short:
        raise _partition_error(
            "iid:balanced", f"class {short[0]} has {counts[short[0]]} samples, fewer than the {num_clients} clients; use iid"
        )
    shards: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in classes:
        members = rng.permutation(np.flatnonzero(labels == c))
        per_client = members.size // num_clients
        for k in range(num_clients):
            shards[k].append(members[k * per_client : (k + 1) * per_client])
    return _sorted_int64([np.concatenate(s) for s in shards])


def _partition_dirichlet(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    n = labels.shape[0]
    min_size = min(10, n // num_clients)
    classes = np.unique(labels)
    for _ in range(DIRICHLET_MAX_TRIES):
        shards: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(proportions)[:-1] * members.size).astype(np.int64)
            for k, piece in enumerate(np.split(members, cuts)):
                shards[k].append(piece)
        parts = [np.concatenate(s) for s in shards]
        if min(p.size for p in parts) >= min_size:
            return _sorted_int64(parts)
    raise ValueError(
        f"dirichlet:{alpha} could not give each of {num_clients} clients at least {min_size} samples "
        f"in {DIRICHLET_MAX_TRIES} draws; use fewer clients or a larger ALPHA"
    )


def _partition_natural(groups: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    ids, row_group, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    if ids.size < num_clients:
        raise ValueError(
            f"partition 'natural': {ids.size} groups cannot give each of {num_clients} clients groups of its own; use fewer clients"
        )
    # Groups of equal size in a seeded order, so the seed decides which client gets which.
    shuffled = rng.permutation(ids.size)
    order = shuffled[np.argsort(-sizes[shuffled], kind="stable")]
    owner = np.empty(ids.size, dtype=np.int64)
    loads = [(0, k) for k in range(num_clients)]
    for g in order:
        rows, k = heapq.heappop(loads)
        owner[g] = k
        heapq.heappush(loads, (rows + int(sizes[g]), k))
    row_owner = owner[row_group.reshape(-1)]
    # A stable sort of the rows by owner lists each client's rows in increasing order.
    by_owner = np.argsort(row_owner, kind="stable")
    cuts = np.cumsum(np.bincount(row_owner, minlength=num_clients))[:-1]
    return _sorted_int64(np.split(by_owner, cuts))


LABELSKEW_ASSIGN = ("cyclic", "random")


def _partition_labelskew(
    labels: np.ndarray, num_clients: int, h: int, rng: np.random.Generator, assign: str = "cyclic"
) -> list[np.ndarray]:
    classes = np.unique(labels)
    num_classes = classes.size
    if h > num_classes:
        raise _partition_error(f"labelskew:{h}", f"H={h} exceeds the {num_classes} classes present")
    if assign == "cyclic":
        perm = rng.permutation(classes)
        # Cyclic layout: consecutive clients take consecutive windows of H classes, so every
        # class is held by about num_clients * H / C clients.
        held = [[perm[(k * h + j) % num_classes] for j in range(h)] for k in range(num_clients)]
    elif assign == "random":
        # Each client draws its H classes independently: some classes may be held by many
        # clients and some by none, as in the usual "pathological non-IID" set-ups.
        held = [list(rng.choice(classes, size=h, replace=False)) for _ in range(num_clients)]
    else:
        raise ValueError(f"labelskew assignment {shown(assign)} is not valid; choose one of: {', '.join(LABELSKEW_ASSIGN)}")
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    for k, cls in enumerate(held):
        for c in cls:
            holders[int(c)].append(k)
    shuffled = {int(c): rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    share = {c: shuffled[c].size // len(ks) for c, ks in holders.items() if ks}
    per_client = [min(share[int(c)] for c in cls) for cls in held]
    if min(per_client) == 0:
        raise ValueError(
            f"labelskew:{h} leaves a client with 0 samples per class for {num_clients} clients; "
            "use fewer clients or a larger dataset"
        )
    offset = {c: 0 for c in holders}
    parts: list[np.ndarray] = []
    for k, cls in enumerate(held):
        pieces = []
        for c in cls:
            c = int(c)
            pieces.append(shuffled[c][offset[c] : offset[c] + per_client[k]])
            offset[c] += per_client[k]
        parts.append(np.concatenate(pieces))
    return _sorted_int64(parts)


def partition(
    labels: np.ndarray,
    num_clients: int,
    spec: str,
    seed: int,
    *,
    labelskew_assign: str = "cyclic",
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Split sample indices among ``num_clients`` clients according to ``spec``: one sorted int64
    index array per client, the arrays disjoint.

    - ``iid``: seeded shuffle cut into equal parts; the remainder ``n % num_clients`` is dropped.
    - ``iid:balanced``: every client ``n_c // num_clients`` samples of each class ``c`` (seeded);
      the remainders are dropped.
    - ``dirichlet:ALPHA``: per class, proportions ~ Dir(ALPHA) over clients split that class's
      samples; redrawn (at most :data:`DIRICHLET_MAX_TRIES` times) until every client has at
      least ``min(10, n // num_clients)`` samples.
    - ``labelskew:H``: client k holds classes ``perm[(k*H + j) % C]`` for ``j < H`` (seeded class
      permutation), or with ``labelskew_assign="random"`` H classes drawn at random (seeded), and
      takes the same number of samples from each (the paper's "equal samples per class"): the
      smallest equal share of those classes among their holders (none over-drawn); the rest unused.
    - ``natural``: ``groups`` gives each sample's group (an integer, e.g. its writer); whole groups
      are dealt so that the clients' row counts are as even as possible: in a seeded order, stably
      sorted largest first, each to the client with the fewest rows so far (ties: the lower client
      index). Every sample is used and no group is split; fewer groups than clients is an error.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    if labels.shape[0] < num_clients:
        raise ValueError(f"cannot split {labels.shape[0]} samples among num_clients={num_clients} clients")
    kind, param = parse_partition(spec)
    rng = np.random.default_rng(seed)
    if kind == "natural":
        if groups is None:
            raise ValueError("partition 'natural' needs groups: one group index per sample")
        groups = np.asarray(groups)
        if groups.shape != labels.shape or not np.issubdtype(groups.dtype, np.integer):
            raise ValueError(f"groups must be integers, one per sample ({labels.shape[0]}), got {groups.dtype} of shape {groups.shape}")
        return _partition_natural(groups, int(num_clients), rng)
    if kind == "iid":
        if param == "balanced":
            return _partition_iid_balanced(labels, int(num_clients), rng)
        return _partition_iid(labels.shape[0], int(num_clients), rng)
    if kind == "dirichlet":
        return _partition_dirichlet(labels, int(num_clients), float(param), rng)
    return _partition_labelskew(labels, int(num_clients), int(param), rng, labelskew_assign)


# ---------------------------------------------------------------------------------------------
# Local test sets and auxiliary subsets


def local_test_indices(
    train_labels: np.ndarray, test_labels: np.ndarray, num_classes: int, size: int, seed: int
) -> np.ndarray:
    """Draw a local test set whose label distribution matches a client's training shard: with
    ``p_c`` the fraction of class ``c`` in ``train_labels``, ``round(p_c * size)`` test samples of
    class ``c`` without replacement (fewer if the test set has fewer), so the total may differ
    from ``size``. Returns sorted int64 indices into ``test_labels``."""
    train_labels = np.asarray(train_labels)
    test_labels = np.asarray(test_labels)
    if train_labels.ndim != 1 or train_labels.size == 0:
        raise ValueError(f"train_labels must be a non-empty 1-D array, got shape {train_labels.shape}")
    if test_labels.ndim != 1:
        raise ValueError(f"test_labels must be 1-D, got shape {test_labels.shape}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    if train_labels.min() < 0 or train_labels.max() >= num_classes:
        raise ValueError(
            f"train_labels must lie in 0..{num_classes - 1}, found {train_labels.min()}..{train_labels.max()}"
        )
    rng = np.random.default_rng(seed)
    fractions = np.bincount(train_labels.astype(np.int64), minlength=num_classes) / train_labels.size
    chosen = []
    for c in range(num_classes):
        # Half-up rounding (not numpy's half-to-even) so equal fractions get equal counts.
        want = int(math.floor(fractions[c] * size + 0.5))
        pool = np.flatnonzero(test_labels == c)
        take = min(want, pool.size)
        if take:
            chosen.append(rng.choice(pool, size=take, replace=False))
    if not chosen:
        return np.empty(0, dtype=np.int64)
    return np.sort(np.concatenate(chosen).astype(np.int64))


def aux_indices(n: int, fraction: float, seed: int) -> np.ndarray:
    """Sample the auxiliary subset: ``max(1, ceil(fraction * n))`` of ``range(n)``, without
    replacement, ``fraction`` in (0, 1]. Returns sorted int64 positions in the client's shard."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction <= 1:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction!r}")
    # The small tolerance keeps e.g. 0.1 * 30 = 3.0000000000000004 at 3, not 4.
    count = min(n, max(1, math.ceil(fraction * n - 1e-9)))
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=count, replace=False).astype(np.int64))


# ---------------------------------------------------------------------------------------------
# Data augmentation

AUGMENTATIONS = ("none", "crop", "crop_flip")


def augment_batch(x: torch.Tensor, input_shape: Sequence[int], kind: str, padding: int, generator: torch.Generator) -> torch.Tensor:
    """A minibatch ``x [B, features]`` of images of ``input_shape`` (channels, height, width),
    augmented as the usual CIFAR training does, as new flat rows on ``x``'s device: ``"crop"``:
    each image padded with ``padding`` zeros on every side and cropped back to its size at an
    offset drawn uniformly (both axes); ``"crop_flip"``: then mirrored left to right with
    probability 1/2; ``"none"``: ``x`` itself. The draws (row offsets, column offsets, flips:
    three vectors of ``B``) come from ``generator``, so every engine augments a client alike."""
    if kind == "none":
        return x
    if kind not in AUGMENTATIONS:
        raise ValueError(f"augmentation {shown(kind)} is not valid; choose one of: {', '.join(AUGMENTATIONS)}")
    if len(input_shape) != 3:
        raise ValueError(f"augmentation {shown(kind)} needs images (channels, height, width), got input_shape {tuple(input_shape)}")
    c, h, w = (int(n) for n in input_shape)
    count = x.shape[0]
    rows = torch.randint(0, 2 * padding + 1, (count,), generator=generator)
    cols = torch.randint(0, 2 * padding + 1, (count,), generator=generator)
    flips = torch.randint(0, 2, (count,), generator=generator).bool() if kind == "crop_flip" else torch.zeros(count, dtype=torch.bool)
    images = torch.nn.functional.pad(x.reshape(count, c, h, w), (padding,) * 4)
    device = x.device
    col_index = cols[:, None] + torch.arange(w)
    col_index = torch.where(flips[:, None], col_index.flip(1), col_index)  # a mirrored crop reads its columns backwards
    row_index = (rows[:, None] + torch.arange(h)).to(device)
    col_index = col_index.to(device)
    sample = torch.arange(count, device=device)[:, None, None, None]
    channel = torch.arange(c, device=device)[None, :, None, None]
    out = images[sample, channel, row_index[:, None, :, None], col_index[:, None, None, :]]
    return out.reshape(count, c * h * w)
