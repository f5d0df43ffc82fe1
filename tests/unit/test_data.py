"""Unit tests for peer.learning.data: IDX io, dataset loading, partitions, local test and aux sets."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from dfedrw.peer.learning.data import (
    Dataset,
    DatasetUnavailable,
    aux_indices,
    local_test_indices,
    parse_partition,
    partition,
)
from dfedrw.peer.learning.datasets import DATASET_REGISTRY, IDX_FILES, load_dataset
from dfedrw.peer.learning.datasets.idx import read_idx
from tests.support.datafiles import idx_bytes, write_idx, write_idx_dataset

# --------------------------------------------------------------------------------- IDX reader


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("dtype", ["u1", "i1", ">i2", ">i4", ">f4", ">f8"])
def test_read_idx_round_trips_every_type_code(tmp_path, compress, dtype):
    # Prepare
    expected = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    if dtype == "u1":
        expected = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = write_idx(tmp_path / "a-idx3", expected, compress)
    # Execute
    got = read_idx(path)
    # Assert
    assert got.shape == (2, 3, 4)
    np.testing.assert_array_equal(got, expected)
    assert got.dtype.isnative


def test_read_idx_truncated_body_names_the_file(tmp_path):
    # Prepare
    data = idx_bytes(np.zeros((4, 2, 2), dtype=np.uint8))
    path = tmp_path / "short-idx3"
    path.write_bytes(data[:-3])
    # Execute / Assert
    with pytest.raises(ValueError, match=r"short-idx3.*truncated"):
        read_idx(path)


def test_read_idx_truncated_gzip_is_a_clear_error(tmp_path):
    # Prepare
    packed = gzip.compress(idx_bytes(np.zeros((40, 5), dtype=np.uint8)))
    path = tmp_path / "cut.gz"
    path.write_bytes(packed[: len(packed) // 2])
    # Execute / Assert
    with pytest.raises(ValueError, match="cut.gz"):
        read_idx(path)


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"\x01\x00\x08\x01\x00\x00\x00\x01\x07", "two zero bytes"),
        (b"\x00\x00\x0a\x01\x00\x00\x00\x01\x07", "type code 0x0A"),
        (b"\x00\x00\x08\x02\x00\x00\x00\x01", "header"),
        (b"\x00\x00", "too short"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x01\x07\x07", "trailing bytes"),
    ],
)
def test_read_idx_rejects_bad_headers(tmp_path, raw, message):
    # Prepare
    path = tmp_path / "bad"
    path.write_bytes(raw)
    # Execute / Assert
    with pytest.raises(ValueError, match=message):
        read_idx(path)


# --------------------------------------------------------------------------------- loading


@pytest.mark.parametrize("name", ["fashion-mnist", "mnist"])
@pytest.mark.parametrize("compress", [False, True])
def test_load_dataset_reads_idx_directory(tmp_path, name, compress):
    # Prepare
    arrays = write_idx_dataset(tmp_path, compress)
    # Execute
    train, test = load_dataset(name, data_dir=tmp_path)
    # Assert
    assert train.x.dtype == torch.float32 and train.y.dtype == torch.int64
    assert train.x.shape == (12, 784) and test.x.shape == (5, 784)
    assert train.num_classes == 10
    np.testing.assert_allclose(train.x.numpy(), arrays["train_images"].reshape(12, -1) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(test.y.numpy(), arrays["test_labels"])
    assert float(train.x.max()) == 1.0 and float(train.x.min()) >= 0.0


def test_load_dataset_accepts_mixed_plain_and_gzip(tmp_path):
    # Prepare
    write_idx_dataset(tmp_path, compress=True)
    stem = IDX_FILES["test_labels"]
    plain = gzip.decompress((tmp_path / f"{stem}.gz").read_bytes())
    (tmp_path / f"{stem}.gz").unlink()
    (tmp_path / stem).write_bytes(plain)
    # Execute
    _, test = load_dataset("mnist", data_dir=str(tmp_path))
    # Assert
    assert test.y.tolist() == [9, 0, 1, 2, 3]


@pytest.mark.parametrize(
    "name, hint",
    [("mnist", "dfedrw fetch mnist"), ("fashion-mnist", "apt-get install dataset-fashion-mnist")],
)
def test_missing_file_raises_dataset_unavailable_with_one_line_hint(tmp_path, name, hint):
    # Prepare
    write_idx_dataset(tmp_path, compress=True)
    (tmp_path / f"{IDX_FILES['train_labels']}.gz").unlink()
    # Execute
    with pytest.raises(DatasetUnavailable) as info:
        load_dataset(name, data_dir=tmp_path)
    # Assert
    message = str(info.value)
    assert "\n" not in message
    assert IDX_FILES["train_labels"] in message and hint in message


def test_missing_directory_raises_dataset_unavailable(tmp_path):
    # Execute
    with pytest.raises(DatasetUnavailable) as info:
        load_dataset("fashion-mnist", data_dir=tmp_path / "nowhere")
    # Assert
    assert "nowhere" in str(info.value) and "data.dir" in str(info.value)


def test_mnist_without_directory_says_how_to_get_it():
    # Execute
    with pytest.raises(DatasetUnavailable) as info:
        load_dataset("mnist")
    # Assert
    assert "data.dir" in str(info.value) and "\n" not in str(info.value)


def test_unknown_dataset_names_the_choices():
    with pytest.raises(ValueError, match="svhn.*" + ".*".join(sorted(DATASET_REGISTRY.names()))):
        load_dataset("svhn")


def test_digits_loads_fixed_stratified_split():
    # Execute
    train, test = load_dataset("digits")
    train_again, _ = load_dataset("digits", data_dir="/ignored")
    # Assert
    assert len(train) + len(test) == 1797
    assert len(test) == 360
    assert len(train) == DATASET_REGISTRY.build("digits").train_size  # what a message may declare at most
    assert train.x.shape[1] == 64 and train.num_classes == 10
    assert 0.0 <= float(train.x.min()) and float(train.x.max()) <= 1.0
    assert torch.equal(train.x, train_again.x)
    train_counts = np.bincount(train.y.numpy(), minlength=10) / len(train)
    test_counts = np.bincount(test.y.numpy(), minlength=10) / len(test)
    np.testing.assert_allclose(train_counts, test_counts, atol=0.01)


def test_dataset_subset_picks_rows():
    # Prepare
    data = Dataset(x=torch.arange(12, dtype=torch.float32).reshape(6, 2), y=torch.arange(6), num_classes=6)
    # Execute
    part = data.subset(np.array([4, 1]))
    # Assert
    assert part.y.tolist() == [4, 1]
    assert part.x.tolist() == [[8.0, 9.0], [2.0, 3.0]]
    assert part.num_classes == 6


# --------------------------------------------------------------------------------- partitions


def balanced_labels(per_class: int = 100, num_classes: int = 10) -> np.ndarray:
    return np.repeat(np.arange(num_classes), per_class)


@pytest.mark.parametrize(
    "spec, expected",
    [("iid", ("iid", None)), ("iid:balanced", ("iid", "balanced")), ("dirichlet:0.1", ("dirichlet", 0.1)), ("Dirichlet:1", ("dirichlet", 1.0)),
     ("labelskew:4", ("labelskew", 4)), ("natural", ("natural", None)), (" Natural ", ("natural", None))],
)
def test_parse_partition_accepts_valid_forms(spec, expected):
    assert parse_partition(spec) == expected


@pytest.mark.parametrize("spec", ["", "noniid", "dirichlet", "dirichlet:0", "dirichlet:-1", "dirichlet:nan",
                                  "dirichlet:x", "labelskew:0", "labelskew:2.5", "labelskew:", "iid:3", "iid:stratified", "natural:2"])
def test_parse_partition_rejects_bad_specs_listing_valid_forms(spec):
    with pytest.raises(ValueError, match=r"valid forms: iid, iid:balanced, dirichlet:ALPHA.*labelskew:H.*, natural$"):
        parse_partition(spec)


@pytest.mark.parametrize("spec", ["iid", "iid:balanced", "dirichlet:0.5", "labelskew:3"])
def test_partitions_are_disjoint_sorted_int64_and_deterministic(spec):
    # Prepare
    labels = balanced_labels()
    # Execute
    first = partition(labels, 7, spec, seed=43)
    again = partition(labels, 7, spec, seed=43)
    other = partition(labels, 7, spec, seed=44)
    # Assert
    assert len(first) == 7
    joined = np.concatenate(first)
    assert len(np.unique(joined)) == len(joined)
    for part in first:
        assert part.dtype == np.int64 and np.all(np.diff(part) > 0)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_iid_gives_equal_sizes_and_drops_only_the_remainder():
    # Prepare
    labels = balanced_labels(per_class=10, num_classes=10)  # 100 samples
    # Execute
    parts = partition(labels, 7, "iid", seed=1)
    # Assert
    assert [len(p) for p in parts] == [14] * 7
    assert len(np.concatenate(parts)) == 100 - 100 % 7


def test_iid_balanced_gives_every_client_the_same_count_of_each_class():
    # Prepare: classes of unequal sizes (30, 31, ..., 39 samples), shuffled
    labels = np.random.default_rng(0).permutation(np.concatenate([np.full(30 + c, c) for c in range(10)]))

    # Execute
    parts = partition(labels, 7, "iid:balanced", seed=1)

    # Assert: client k holds (30 + c) // 7 samples of class c, for every k; the rest unused
    counts = np.array([np.bincount(labels[p], minlength=10) for p in parts])
    assert (counts == [(30 + c) // 7 for c in range(10)]).all()
    # ... while the plain shuffle varies its clients' class counts
    plain = np.array([np.bincount(labels[p], minlength=10) for p in partition(labels, 7, "iid", seed=1)])
    assert (plain != plain[0]).any()


def test_iid_balanced_refuses_a_class_smaller_than_the_clients():
    labels = np.concatenate([np.zeros(50, dtype=np.int64), np.ones(3, dtype=np.int64)])

    with pytest.raises(ValueError, match=r"iid:balanced.*class 1 has 3 samples, fewer than the 5 clients; use iid"):
        partition(labels, 5, "iid:balanced", seed=0)


def test_dirichlet_covers_every_sample():
    # Prepare
    labels = balanced_labels()
    # Execute
    parts = partition(labels, 5, "dirichlet:1.0", seed=3)
    # Assert
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    assert min(len(p) for p in parts) >= 10


def class_share_spread(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    """Mean over clients of the largest class share: 1/C when uniform, 1 when one class."""
    shares = [np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]
    return float(np.mean(shares))


def test_dirichlet_small_alpha_is_skewed_and_large_alpha_nearly_uniform():
    # Prepare
    labels = balanced_labels(per_class=500)
    # Execute
    skewed = partition(labels, 10, "dirichlet:0.1", seed=43)
    uniform = partition(labels, 10, "dirichlet:1000", seed=43)
    # Assert
    assert class_share_spread(labels, skewed) > 0.4
    assert class_share_spread(labels, uniform) < 0.15
    sizes = np.array([len(p) for p in uniform])
    assert np.all(np.abs(sizes - 500) < 60)


def test_dirichlet_gives_up_with_value_error_when_impossible():
    # Prepare: 20 samples for 10 clients each needing 2, with extreme skew
    labels = np.repeat(np.arange(2), 10)
    # Execute / Assert
    with pytest.raises(ValueError, match="dirichlet"):
        partition(labels, 10, "dirichlet:0.001", seed=0)


@pytest.mark.parametrize("num_clients, h", [(10, 4), (7, 3), (5, 10), (10, 1)])
def test_labelskew_gives_each_client_h_classes_with_equal_counts(num_clients, h):
    # Prepare: unequal class sizes so equal per-class counts are not an accident
    labels = np.concatenate([np.full(90 + 3 * c, c) for c in range(10)])
    # Execute
    parts = partition(labels, num_clients, f"labelskew:{h}", seed=43)
    # Assert
    for part in parts:
        counts = np.bincount(labels[part], minlength=10)
        held = counts[counts > 0]
        assert len(held) == h
        assert np.all(held == held[0])


def test_labelskew_spreads_classes_cyclically():
    # Prepare
    labels = balanced_labels()
    # Execute
    parts = partition(labels, 10, "labelskew:4", seed=43)
    # Assert: 10 clients * 4 classes over 10 classes = every class on 4 clients
    holders = np.zeros(10, dtype=int)
    for part in parts:
        holders[np.unique(labels[part])] += 1
    assert holders.tolist() == [4] * 10
    assert [len(p) for p in parts] == [100] * 10


def test_labelskew_h_above_class_count_is_rejected():
    with pytest.raises(ValueError, match="H=11"):
        partition(balanced_labels(), 3, "labelskew:11", seed=0)


@pytest.mark.parametrize("num_clients", [0, -1, 2.5])
def test_partition_rejects_bad_client_counts(num_clients):
    with pytest.raises(ValueError, match="num_clients"):
        partition(balanced_labels(), num_clients, "iid", seed=0)


def writer_groups(sizes: list[int], seed: int = 0) -> np.ndarray:
    """One group index per row, ``sizes[g]`` rows of group g, the rows in a shuffled order."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(len(sizes)), sizes))


def test_natural_deals_whole_groups_largest_first_to_the_emptiest_client():
    # Prepare: groups of 5, 3, 3 and 1 rows for 2 clients. By hand: 5 -> client 0; 3 -> client 1;
    # the other 3 -> client 1 (3 < 5); 1 -> client 0 (5 < 6): 6 rows each, whatever the seed.
    groups = writer_groups([5, 3, 3, 1])
    labels = np.zeros(groups.size, dtype=np.int64)

    # Execute
    parts = partition(labels, 2, "natural", seed=43, groups=groups)

    # Assert
    assert [sorted(set(groups[p])) for p in parts] == [[0, 3], [1, 2]]
    assert [len(p) for p in parts] == [6, 6]


@pytest.mark.parametrize("num_clients", [1, 4, 9])
def test_natural_is_disjoint_covers_every_row_keeps_writers_whole_and_is_balanced(num_clients):
    # Prepare: 40 writers of 1..30 rows
    sizes = [int(n) for n in np.random.default_rng(5).integers(1, 31, size=40)]
    groups = writer_groups(sizes, seed=1)
    labels = np.random.default_rng(2).integers(0, 10, size=groups.size)

    # Execute
    parts = partition(labels, num_clients, "natural", seed=43, groups=groups)

    # Assert
    joined = np.concatenate(parts)
    assert len(parts) == num_clients and np.array_equal(np.sort(joined), np.arange(groups.size))
    for part in parts:
        assert part.dtype == np.int64 and np.all(np.diff(part) > 0)
    owners = [{int(g) for g in groups[p]} for p in parts]
    assert all(owners) and sum(len(o) for o in owners) == len(sizes)  # every writer with one client only
    rows = [len(p) for p in parts]
    assert max(rows) - min(rows) <= max(sizes)  # the bound of dealing largest first to the emptiest


def test_natural_is_seeded():
    groups, labels = writer_groups([4] * 12), np.zeros(48, dtype=np.int64)
    first, again, other = (partition(labels, 3, "natural", seed=s, groups=groups) for s in (43, 43, 44))
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))
    assert [len(p) for p in first] == [len(p) for p in other] == [16, 16, 16]


def test_natural_refuses_fewer_groups_than_clients_and_missing_or_bad_groups():
    groups, labels = writer_groups([2, 2, 2]), np.zeros(6, dtype=np.int64)
    with pytest.raises(ValueError, match=r"partition 'natural': 3 groups cannot give each of 4 clients groups of its own; use fewer clients"):
        partition(labels, 4, "natural", seed=0, groups=groups)
    with pytest.raises(ValueError, match=r"partition 'natural' needs groups: one group index per sample"):
        partition(labels, 2, "natural", seed=0)
    with pytest.raises(ValueError, match=r"groups must be integers, one per sample \(6\), got int64 of shape \(5,\)"):
        partition(labels, 2, "natural", seed=0, groups=groups[:5])
    with pytest.raises(ValueError, match=r"groups must be integers"):
        partition(labels, 2, "natural", seed=0, groups=groups.astype(float))


# --------------------------------------------------------------------------------- local test / aux


def test_local_test_set_matches_train_distribution():
    # Prepare
    train_labels = np.array([0] * 60 + [3] * 30 + [7] * 10)
    test_labels = np.repeat(np.arange(10), 100)
    # Execute
    idx = local_test_indices(train_labels, test_labels, num_classes=10, size=50, seed=5)
    # Assert
    counts = np.bincount(test_labels[idx], minlength=10)
    assert counts[[0, 3, 7]].tolist() == [30, 15, 5]
    assert counts.sum() == 50
    assert idx.dtype == np.int64 and np.all(np.diff(idx) > 0)
    np.testing.assert_array_equal(idx, local_test_indices(train_labels, test_labels, 10, 50, seed=5))
    assert not np.array_equal(idx, local_test_indices(train_labels, test_labels, 10, 50, seed=6))


def test_local_test_set_caps_at_available_samples():
    # Prepare
    train_labels = np.array([0, 0, 1, 1])
    test_labels = np.array([0, 0, 0, 1])
    # Execute
    idx = local_test_indices(train_labels, test_labels, num_classes=2, size=10, seed=0)
    # Assert
    assert idx.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "n, fraction, expected", [(30, 0.1, 3), (100, 0.1, 10), (5, 0.01, 1), (7, 1.0, 7), (11, 0.25, 3)]
)
def test_aux_indices_size(n, fraction, expected):
    # Execute
    idx = aux_indices(n, fraction, seed=2)
    # Assert
    assert len(idx) == expected
    assert len(np.unique(idx)) == expected and idx.min() >= 0 and idx.max() < n
    assert np.all(np.diff(idx) > 0) and idx.dtype == np.int64


def test_aux_indices_deterministic_per_seed():
    assert np.array_equal(aux_indices(1000, 0.1, seed=1), aux_indices(1000, 0.1, seed=1))
    assert not np.array_equal(aux_indices(1000, 0.1, seed=1), aux_indices(1000, 0.1, seed=2))


@pytest.mark.parametrize("fraction", [0, -0.1, 1.5, float("nan")])
def test_aux_indices_rejects_bad_fraction(fraction):
    with pytest.raises(ValueError, match="fraction"):
        aux_indices(10, fraction, seed=0)


def test_labelskew_random_assignment_gives_h_classes_each_and_is_seeded():
    labels = np.repeat(np.arange(10), 100)
    a = partition(labels, 10, "labelskew:3", seed=5, labelskew_assign="random")
    b = partition(labels, 10, "labelskew:3", seed=5, labelskew_assign="random")
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    for part in a:
        assert len(np.unique(labels[part])) == 3
    with pytest.raises(ValueError, match="cyclic, random"):
        partition(labels, 10, "labelskew:3", seed=5, labelskew_assign="bogus")


# -- download_idx checksums (never the network: urlopen is replaced) ----------------------------

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")


def _idx_gz(rows: int) -> bytes:
    body = struct.pack(">HBBI", 0, 0x08, 1, rows) + bytes(range(rows))
    return gzip.compress(body, mtime=0)


def _serve(monkeypatch, files: dict[str, bytes]) -> list[str]:
    import io
    import urllib.request

    asked = []

    def fake_urlopen(url, timeout=None):
        asked.append(url)
        return io.BytesIO(files[url.rsplit("/", 1)[1]])

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    return asked


def _digests_of(files: dict[str, bytes]) -> dict[str, tuple]:
    import hashlib

    return {name[: -len(".gz")]: (("sha256", "idx", hashlib.sha256(gzip.decompress(data)).hexdigest()),) for name, data in files.items()}


def test_download_keeps_files_that_match_their_digests(monkeypatch, tmp_path):
    import dfedrw.peer.learning.datasets
    from dfedrw import peer
    files = {f"{stem}.gz": _idx_gz(3 + i) for i, stem in enumerate(peer.learning.datasets.IDX_FILES.values())}
    monkeypatch.setattr(peer.learning.datasets.MNIST, "digests", _digests_of(files))
    asked = _serve(monkeypatch, files)
    peer.learning.datasets.download_idx("mnist", tmp_path, base_url="http://mirror.invalid/mnist")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)
    assert all(u.startswith("http://mirror.invalid/mnist/") for u in asked) and len(asked) == 4


def test_download_with_a_wrong_checksum_deletes_the_file_and_says_so(monkeypatch, tmp_path):
    import dfedrw.peer.learning.datasets
    from dfedrw import peer
    stems = list(peer.learning.datasets.IDX_FILES.values())
    files = {f"{stem}.gz": _idx_gz(5) for stem in stems}
    digests = _digests_of(files)
    files[f"{stems[1]}.gz"] = _idx_gz(6)  # a valid IDX file, but not the one expected
    monkeypatch.setattr(peer.learning.datasets.MNIST, "digests", digests)
    _serve(monkeypatch, files)
    with pytest.raises(ValueError, match=rf"mnist: http://m/{stems[1]}.gz failed its checksum and was deleted \(sha256 of the decompressed file [0-9a-f]{{64}}, expected {digests[stems[1]][0][2]}\)"):
        peer.learning.datasets.download_idx("mnist", tmp_path, base_url="http://m/")
    assert [p.name for p in tmp_path.iterdir()] == [f"{stems[0]}.gz"]


def test_mnist_digests_are_the_published_md5_of_the_gz(monkeypatch, tmp_path):
    import dfedrw.peer.learning.datasets
    from dfedrw import peer
    stem = "train-labels-idx1-ubyte"
    assert peer.learning.datasets.MNIST.digests[stem] == (("md5", "gz", "d53e105ee54ea40749a09fcbcd1e9432"),)
    _serve(monkeypatch, {f"{s}.gz": b"not gzip" for s in peer.learning.datasets.IDX_FILES.values()})
    with pytest.raises(ValueError, match="md5 of the file [0-9a-f]{32}, expected f68b3c2d"):
        peer.learning.datasets.download_idx("mnist", tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not DEBIAN_FMNIST.is_dir(), reason="needs Debian's dataset-fashion-mnist")
def test_debian_fashion_mnist_matches_the_recorded_digests(monkeypatch, tmp_path):
    import dfedrw.peer.learning.datasets
    from dfedrw import peer
    for stem in peer.learning.datasets.IDX_FILES.values():
        assert peer.learning.datasets.idx_digest_error("fashion-mnist", stem, DEBIAN_FMNIST / f"{stem}.gz") is None
    # A download serving those bytes is accepted as is.
    _serve(monkeypatch, {p.name: p.read_bytes() for p in DEBIAN_FMNIST.glob("*.gz")})
    peer.learning.datasets.download_idx("fashion-mnist", tmp_path)
    assert len(list(tmp_path.glob("*.gz"))) == 4


# -- augmentation ----------------------------------------------------------------------------------


def test_a_crop_is_the_padded_image_read_at_the_drawn_offset():
    from dfedrw.peer.learning.data import augment_batch

    x = torch.arange(2 * 3 * 3, dtype=torch.float32).reshape(2, 9) + 1  # two 1x3x3 images, 1..9 and 10..18
    generator = torch.Generator().manual_seed(7)
    rows, cols = torch.randint(0, 3, (2,), generator=generator), torch.randint(0, 3, (2,), generator=generator)
    out = augment_batch(x, (1, 3, 3), "crop", 1, torch.Generator().manual_seed(7)).reshape(2, 3, 3)
    for i in range(2):
        padded = torch.nn.functional.pad(x[i].reshape(3, 3), (1, 1, 1, 1))
        assert torch.equal(out[i], padded[rows[i] : rows[i] + 3, cols[i] : cols[i] + 3])


def test_a_flip_mirrors_the_crop_and_channels_move_together():
    from dfedrw.peer.learning.data import augment_batch

    x = torch.rand(64, 2 * 4 * 5)
    out = augment_batch(x, (2, 4, 5), "crop_flip", 0, torch.Generator().manual_seed(1)).reshape(64, 2, 4, 5)
    images = x.reshape(64, 2, 4, 5)
    flipped = [bool(torch.equal(out[i], images[i].flip(-1))) for i in range(64)]
    kept = [bool(torch.equal(out[i], images[i])) for i in range(64)]
    assert all(f != k for f, k in zip(flipped, kept, strict=True))  # padding 0: each image as it is or mirrored
    assert 16 < sum(flipped) < 48
    assert torch.equal(augment_batch(x, (2, 4, 5), "none", 4, torch.Generator()), x)


def test_augmentation_is_seeded_and_checked():
    from dfedrw.peer.learning.data import augment_batch

    x = torch.rand(8, 3 * 32 * 32)
    a = augment_batch(x, (3, 32, 32), "crop_flip", 4, torch.Generator().manual_seed(3))
    b = augment_batch(x, (3, 32, 32), "crop_flip", 4, torch.Generator().manual_seed(3))
    c = augment_batch(x, (3, 32, 32), "crop_flip", 4, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    with pytest.raises(ValueError, match="needs images"):
        augment_batch(torch.rand(2, 6), (6,), "crop", 1, torch.Generator())
    with pytest.raises(ValueError, match="'rotate' is not valid; choose one of: none, crop, crop_flip"):
        augment_batch(x, (3, 32, 32), "rotate", 1, torch.Generator())


class FlatRows:
    """A data set of flat rows: no image shape."""

    num_features, num_classes, train_size = 6, 2, 4

    def load(self):
        return (np.zeros((4, 6), np.float32), np.array([0, 1, 0, 1])), (np.zeros((2, 6), np.float32), np.array([0, 1]))


def test_augment_needs_an_image_data_set():
    from dfedrw.peer.config.scenario import ScenarioError, load_scenario

    assert load_scenario(None, ["data.augment=crop_flip"]).data.augment == "crop_flip"  # digits: 1x8x8
    with pytest.raises(ScenarioError, match=r"data.augment='crop' needs images; data.name='tests.unit.test_data:FlatRows' declares input_shape = \(6,\)"):
        load_scenario(None, ["data.name=tests.unit.test_data:FlatRows", "data.augment=crop"])


def test_the_engines_augment_each_clients_minibatches(small_scenario, tmp_path):
    """Augmentation changes what a client trains on, in both engines alike (their parity is
    tests/integration/test_engine_parity.py's momentum-epochs case)."""
    from dfedrw.engines.together import run_together
    from dfedrw.engines.run import BatchedRun
    from dfedrw.peer.results.records import read_rounds

    losses = {}
    for augment in ("none", "crop_flip"):
        scenario = small_scenario("engine.name=batched", "rounds=3", "topology.byzantine=0", "attack.name=none", f"data.augment={augment}")
        run_together([BatchedRun(scenario, tmp_path / augment)])
        losses[augment] = [r["train_loss"] for r in read_rounds(tmp_path / augment, 0)]
    assert losses["none"][0] != losses["crop_flip"][0]
