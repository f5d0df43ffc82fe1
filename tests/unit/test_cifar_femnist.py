"""CIFAR-10/100 (binary version, folder or .tar.gz) and FEMNIST (LEAF JSON) read from small
files in their real formats: values to the byte, labels, scale, the cache, and the one-line
messages for what is missing or damaged; and every set's input shape."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import numpy as np
import pytest
import torch

from dfedrw.peer.learning.data import DatasetUnavailable
from dfedrw.peer.learning.datacache import stored_dataset, verify_stored
from dfedrw.peer.learning.datasets import CIFAR10, CIFAR100, build_dataset, input_shape_of, load_grouped_splits, load_splits
from tests.support.datafiles import leaf_writer, tar_gz, write_cifar, write_leaf

CIFAR10_FILES = CIFAR10.train_files + CIFAR10.test_files
CIFAR100_FILES = CIFAR100.train_files + CIFAR100.test_files
CIFAR10_HINT = "put the CIFAR-10 binary version (cifar-10-binary.tar.gz, or its cifar-10-batches-bin/ folder) in data.dir"


def official(monkeypatch, cls, archive):
    """Let ``archive`` pass as the published one (its MD5 made the class's)."""
    monkeypatch.setattr(cls, "archive_md5", hashlib.md5(archive.read_bytes()).hexdigest())


def cifar10_archive(folder, records=None, extra=None):
    members = {f"cifar-10-batches-bin/{name}": r.tobytes() for name, r in (records or {}).items()}
    return tar_gz(folder / "cifar-10-binary.tar.gz", {**members, **(extra or {})})


# -- CIFAR-10 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["folder", "subfolder", "archive"])
def test_cifar10_rows_are_the_records_bytes_in_file_order(tmp_path, fresh_cache, monkeypatch, layout):
    # Prepare: 3 records per file, in data.dir itself, in its usual subfolder, or as the archive
    data = tmp_path / "data"
    where = {"folder": data, "subfolder": data / "cifar-10-batches-bin", "archive": tmp_path / "staging"}[layout]
    records = write_cifar(where, CIFAR10_FILES, (10,))
    if layout == "archive":
        data.mkdir()
        official(monkeypatch, CIFAR10, cifar10_archive(data, records))
    source = build_dataset("cifar10", None, data)
    train_records = np.concatenate([records[name] for name in CIFAR10.train_files])

    # Execute
    arrays, scale = source.pixels()
    train, test = load_splits(source)
    stored = stored_dataset(source)

    # Assert: the pixel bytes as they stand (channel-major), the label byte, scale 255
    assert scale == 255.0 and arrays["train_x"].dtype == np.uint8 and "train_groups" not in arrays
    assert np.array_equal(arrays["train_x"], train_records[:, 1:])
    assert np.array_equal(arrays["train_y"], train_records[:, 0])
    assert np.array_equal(arrays["test_x"], records["test_batch.bin"][:, 1:])
    assert np.array_equal(arrays["test_y"], records["test_batch.bin"][:, 0])
    assert torch.equal(train.x, torch.from_numpy(train_records[:, 1:].astype(np.float32) / np.float32(255)))
    assert train.y.dtype == torch.int64 and train.num_classes == 10 and len(test) == 3
    assert stored.folder is not None and np.array_equal(stored.train.images, arrays["train_x"]) and stored.train.groups is None
    assert torch.equal(stored.train.dataset().x, train.x) and torch.equal(stored.test.dataset().y, test.y)


def test_cifar10_features_are_red_green_blue_planes_row_major(tmp_path):
    # Prepare: one record made from an image [channel, row, column] whose every value says where it is
    image = np.zeros((3, 32, 32), dtype=np.uint8)
    image[0, 1, 0], image[1, 0, 0], image[2, 31, 31], image[0, 0, 2] = 11, 22, 33, 44
    record = np.concatenate([[7], image.reshape(-1)]).astype(np.uint8)
    write_cifar(tmp_path, CIFAR10_FILES, (10,), count=1)
    (tmp_path / "data_batch_1.bin").write_bytes(record.tobytes())

    # Execute
    arrays, _ = build_dataset("cifar10", None, tmp_path).pixels()

    # Assert
    first = arrays["train_x"][0]
    assert first[32] == 11 and first[1024] == 22 and first[3071] == 33 and first[2] == 44
    assert np.array_equal(first.reshape(input_shape_of(CIFAR10())), image) and arrays["train_y"][0] == 7


def test_cifar_source_names_the_files_with_their_sizes(tmp_path):
    write_cifar(tmp_path, CIFAR10_FILES, (10,))
    description = build_dataset("cifar10", None, tmp_path).source()
    assert description["name"] == "cifar10" and description["folder"] == str(tmp_path.resolve())
    assert sorted(description["files"]) == sorted(CIFAR10_FILES)
    assert all(size == 3 * 3073 for size, _ in description["files"].values())


@pytest.mark.parametrize(
    "data_dir, message",
    [
        (None, f"cifar10: no data directory given; {CIFAR10_HINT}"),
        ("absent", "cifar10: data directory {tmp}/absent does not exist; " + CIFAR10_HINT),
        ("empty", "cifar10: data_batch_1.bin not found in {tmp}/empty; " + CIFAR10_HINT),
        ("partial", "cifar10: data_batch_3.bin not found in {tmp}/partial/cifar-10-batches-bin; " + CIFAR10_HINT),
    ],
)
def test_a_missing_cifar_folder_or_file_is_one_line_saying_what_to_put_where(tmp_path, data_dir, message):
    # Prepare
    (tmp_path / "empty").mkdir()
    files = tuple(name for name in CIFAR10_FILES if name != "data_batch_3.bin")
    write_cifar(tmp_path / "partial" / "cifar-10-batches-bin", files, (10,))
    source = build_dataset("cifar10", None, tmp_path / data_dir if data_dir else None)

    # Execute / Assert: before anything is read, and when read
    for step in (source.check, source.pixels):
        with pytest.raises(DatasetUnavailable) as err:
            step()
        assert str(err.value) == message.format(tmp=tmp_path) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncated", r"data_batch_2\.bin: 9218 bytes is not a whole number of 3073-byte records \(truncated\?\)"),
        ("empty", r"data_batch_2\.bin: 0 bytes is not a whole number of 3073-byte records"),
        ("label", r"data_batch_2\.bin: record 1 has label byte 0 = 10; it must lie in 0\.\.9"),
    ],
)
def test_a_damaged_cifar_file_is_a_value_error_naming_it(tmp_path, damage, message):
    # Prepare
    records = write_cifar(tmp_path, CIFAR10_FILES, (10,))
    data = bytearray(records["data_batch_2.bin"].tobytes())
    if damage == "truncated":
        data = data[:-1]
    elif damage == "empty":
        data = bytearray()
    else:
        data[3073] = 10
    (tmp_path / "data_batch_2.bin").write_bytes(bytes(data))

    # Execute / Assert
    with pytest.raises(ValueError, match=message):
        build_dataset("cifar10", None, tmp_path).pixels()


def test_more_training_records_than_cifar_has_are_refused(tmp_path, fresh_cache):
    write_cifar(tmp_path, CIFAR10_FILES, (10,), count=10_001)
    source = build_dataset("cifar10", None, tmp_path)
    with pytest.raises(ValueError, match=r"data set cifar10: pixels\(\) gave 50005 training rows, more than the set declares \(train_size = 50000\)"):
        stored_dataset(source)
    with pytest.raises(ValueError, match=r"data set cifar10: load\(\) gave 50005 training rows, more than the set declares \(train_size = 50000\)"):
        load_splits(source)


# -- the archive ---------------------------------------------------------------------------------


def test_an_archive_that_is_not_the_published_one_says_so(tmp_path):
    # Prepare: a well-formed archive, but not the official bytes
    records = write_cifar(tmp_path / "staging", CIFAR10_FILES, (10,))
    archive = cifar10_archive(tmp_path, records)
    got = hashlib.md5(archive.read_bytes()).hexdigest()
    source = build_dataset("cifar10", None, tmp_path)

    # Execute / Assert: found without reading it, refused when read
    source.check()
    with pytest.raises(ValueError) as err:
        source.pixels()
    assert str(err.value) == (
        f"cifar10: {archive} has MD5 {got}, the published cifar-10-binary.tar.gz has c32a1d4ab5d03f1284b67883e8d87530: damaged or "
        "not the official archive (download it again, or put the cifar-10-batches-bin/ folder it holds in data.dir)"
    )


def test_archive_members_are_taken_by_exact_name_only(tmp_path, monkeypatch):
    # Prepare: the first batch only under names outside the archive's folder, or as a link
    records = write_cifar(tmp_path / "staging", CIFAR10_FILES, (10,))
    kept = {name: r for name, r in records.items() if name != "data_batch_1.bin"}
    elsewhere = {"../cifar-10-batches-bin/data_batch_1.bin": records["data_batch_1.bin"].tobytes(), "data_batch_1.bin": b"x"}
    official(monkeypatch, CIFAR10, cifar10_archive(tmp_path, kept, elsewhere))

    # Execute / Assert
    with pytest.raises(ValueError, match=r"cifar-10-binary\.tar\.gz: no member cifar-10-batches-bin/data_batch_1\.bin"):
        build_dataset("cifar10", None, tmp_path).pixels()
    assert not (tmp_path.parent / "cifar-10-batches-bin").exists()


def test_an_archive_member_that_is_a_link_is_refused(tmp_path, monkeypatch):
    # Prepare
    records = write_cifar(tmp_path / "staging", CIFAR10_FILES, (10,))
    archive = tmp_path / "cifar-10-binary.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, r in records.items():
            if name == "test_batch.bin":
                link = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
                link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(link)
            else:
                info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
                info.size = r.size
                tar.addfile(info, io.BytesIO(r.tobytes()))
    official(monkeypatch, CIFAR10, archive)

    # Execute / Assert
    with pytest.raises(ValueError, match=r"member cifar-10-batches-bin/test_batch\.bin is not one regular file"):
        build_dataset("cifar10", None, tmp_path).pixels()


def test_a_truncated_archive_is_a_value_error_naming_it(tmp_path, monkeypatch):
    # Prepare
    records = write_cifar(tmp_path / "staging", CIFAR10_FILES, (10,))
    archive = cifar10_archive(tmp_path, records)
    archive.write_bytes(archive.read_bytes()[:-200])
    official(monkeypatch, CIFAR10, archive)

    # Execute / Assert
    with pytest.raises(ValueError, match=rf"{archive}: not a readable \.tar\.gz archive"):
        build_dataset("cifar10", None, tmp_path).pixels()


# -- CIFAR-100 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["subfolder", "archive"])
def test_cifar100_takes_the_fine_or_the_coarse_label_byte(tmp_path, fresh_cache, monkeypatch, layout):
    # Prepare: records with a coarse byte (0..19), then a fine byte (0..99)
    folder = tmp_path / ("data" if layout == "archive" else "data/cifar-100-binary")
    records = write_cifar(folder, CIFAR100_FILES, (20, 100), count=5)
    if layout == "archive":
        members = {f"cifar-100-binary/{name}": r.tobytes() for name, r in records.items()}
        members["cifar-100-binary/fine_label_names.txt"] = b"apple\n"
        official(monkeypatch, CIFAR100, tar_gz(tmp_path / "data" / "cifar-100-binary.tar.gz", members))
        for name in CIFAR100_FILES:
            (folder / name).unlink()

    # Execute
    fine = build_dataset("cifar100", None, tmp_path / "data")
    coarse = build_dataset("cifar100", {"labels": "coarse"}, tmp_path / "data")
    fine_train, _ = load_splits(fine)
    coarse_stored = stored_dataset(coarse)

    # Assert
    assert (fine.num_classes, coarse.num_classes) == (100, 20)
    assert np.array_equal(fine_train.y.numpy(), records["train.bin"][:, 1])
    assert np.array_equal(coarse_stored.train.labels, records["train.bin"][:, 0])
    assert np.array_equal(coarse_stored.test.labels, records["test.bin"][:, 0])
    assert np.array_equal(coarse_stored.train.images, records["train.bin"][:, 2:])
    assert stored_dataset(fine).folder != coarse_stored.folder  # the setting is part of the entry's key


def test_cifar100_checks_both_label_bytes_and_its_setting(tmp_path):
    records = write_cifar(tmp_path, CIFAR100_FILES, (20, 100))
    records["test.bin"][2, 0] = 20  # a coarse byte out of range, even when fine labels are used
    (tmp_path / "test.bin").write_bytes(records["test.bin"].tobytes())
    with pytest.raises(ValueError, match=r"test\.bin: record 2 has label byte 0 = 20; it must lie in 0\.\.19"):
        build_dataset("cifar100", None, tmp_path).pixels()
    with pytest.raises(ValueError, match=r"cifar100: labels must be one of \['fine', 'coarse'\], got 'superclass'"):
        build_dataset("cifar100", {"labels": "superclass"}, tmp_path)


# -- FEMNIST -------------------------------------------------------------------------------------


def femnist_files(tmp_path):
    """Writers over two train files (not in sorted order) and a test file; returns them."""
    writers = {w: leaf_writer(n, seed=i) for i, (w, n) in enumerate([("f0003_12", 2), ("f0001_40", 3), ("f0002_07", 1), ("f0000_33", 4)])}
    tests = {w: leaf_writer(1, seed=10 + i) for i, w in enumerate(sorted(writers))}
    write_leaf(tmp_path, {
        "train/all_data_0_niid_0_keep_0_train_9.json": {w: writers[w] for w in ("f0003_12", "f0001_40")},
        "train/all_data_1_niid_0_keep_0_train_9.json": {w: writers[w] for w in ("f0002_07", "f0000_33")},
        "test/all_data_0_niid_0_keep_0_test_9.json": tests,
    })
    return writers, tests


def test_femnist_rows_are_the_grey_levels_by_writer_in_sorted_order(tmp_path, fresh_cache):
    # Prepare
    writers, tests = femnist_files(tmp_path)
    order = sorted(writers)
    source = build_dataset("femnist", None, tmp_path)

    # Execute
    arrays, scale = source.pixels()
    train, test, groups = load_grouped_splits(source)
    stored = verify_stored(source)

    # Assert: grey levels to the byte, labels, one group per writer (0.. in sorted order)
    assert scale == 255.0 and arrays["train_x"].dtype == np.uint8
    assert np.array_equal(arrays["train_x"], np.concatenate([writers[w][0] for w in order]))
    assert arrays["train_y"].tolist() == [y for w in order for y in writers[w][1]]
    assert np.array_equal(arrays["test_x"], np.concatenate([tests[w][0] for w in sorted(tests)]))
    assert arrays["train_groups"].tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 3, 3]
    assert groups.dtype == np.int32 and np.array_equal(groups, arrays["train_groups"])
    assert torch.equal(train.x, torch.from_numpy(arrays["train_x"].astype(np.float32) / np.float32(255)))
    assert train.num_classes == 62 and len(test) == 4 and input_shape_of(source) == (1, 28, 28)
    assert stored.folder is not None and stored.train.groups.dtype == np.dtype("<i4")
    assert np.array_equal(stored.train.groups, groups) and stored.test.groups is None
    assert torch.equal(stored.train.dataset().x, train.x)


def test_femnist_max_writers_takes_the_first_writers_of_each_split(tmp_path):
    writers, tests = femnist_files(tmp_path)
    arrays, _ = build_dataset("femnist", {"max_writers": 2}, tmp_path).pixels()
    assert np.array_equal(arrays["train_x"], np.concatenate([writers["f0000_33"][0], writers["f0001_40"][0]]))
    assert arrays["train_groups"].tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert np.array_equal(arrays["test_x"], np.concatenate([tests["f0000_33"][0], tests["f0001_40"][0]]))
    description = build_dataset("femnist", {"max_writers": 2}, tmp_path).source()
    assert description["settings"] == {"max_writers": 2}
    assert sorted(description["files"]) == [
        "test/all_data_0_niid_0_keep_0_test_9.json", "train/all_data_0_niid_0_keep_0_train_9.json", "train/all_data_1_niid_0_keep_0_train_9.json",
    ]


@pytest.mark.parametrize("value", [-1, "2", True, 1.5])
def test_femnist_max_writers_must_be_a_count(value):
    with pytest.raises(ValueError, match="femnist: max_writers must be"):
        build_dataset("femnist", {"max_writers": value}, None)


@pytest.mark.parametrize(
    "value, message",
    [
        (0.5, r"sample 1 value 7 is 0\.5, not a grey level k/255 in \[0, 1\]"),
        (1.0 + 1e-7, r"sample 1 value 7 is 1\.0000001, not a grey level"),
        (-1 / 255, r"sample 1 value 7 is -0\.00392156862745098, not a grey level"),
        (3 / 255 + 5e-7, None),  # within the tolerance: the level 3
    ],
)
def test_femnist_pixels_must_be_grey_levels_over_255(tmp_path, value, message):
    # Prepare: one pixel of writer f0001 in the second train file changed
    femnist_files(tmp_path)
    path = tmp_path / "train/all_data_0_niid_0_keep_0_train_9.json"
    content = json.loads(path.read_text())
    content["user_data"]["f0001_40"]["x"][1][7] = value
    path.write_text(json.dumps(content))
    source = build_dataset("femnist", None, tmp_path)

    # Execute / Assert
    if message is None:
        assert source.pixels()[0]["train_x"][4 + 1, 7] == 3
        return
    with pytest.raises(ValueError, match=rf"{path}: writer 'f0001_40': {message}"):
        source.pixels()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c["user_data"]["f0001_40"]["y"].__setitem__(0, 62), r"writer 'f0001_40': labels must lie in 0\.\.61, found"),
        (lambda c: c["user_data"]["f0001_40"]["y"].append(1), r"writer 'f0001_40': x must be 4 samples of 784 values"),
        (lambda c: c["user_data"]["f0001_40"]["x"][0].pop(), r"writer 'f0001_40': x and y must be lists"),
        (lambda c: c["num_samples"].__setitem__(0, 9), r"writer 'f0003_12': num_samples says 9, user_data holds 2"),
        (lambda c: c["users"].append("f0009_00"), r"not a LEAF data file \(TypeError: users, num_samples and user_data do not match\)"),
        (lambda c: c.pop("user_data"), r"not a LEAF data file \(KeyError"),
        (lambda c: c["user_data"].update(f0000_33=c["user_data"].pop("f0001_40")) or c["users"].__setitem__(1, "f0000_33"), r"writer 'f0000_33' is also in"),
    ],
)
def test_a_damaged_leaf_file_is_a_value_error_naming_it(tmp_path, change, message):
    femnist_files(tmp_path)
    path = tmp_path / "train/all_data_0_niid_0_keep_0_train_9.json"
    content = json.loads(path.read_text())
    change(content)
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message) as err:
        build_dataset("femnist", None, tmp_path).pixels()
    assert str(path) in str(err.value)


def test_a_missing_leaf_folder_is_one_line_saying_what_to_put_where(tmp_path):
    hint = "set data.dir to the folder holding LEAF's train/ and test/ folders of FEMNIST JSON files (data/femnist/data after its preprocessing)"
    (tmp_path / "train").mkdir()
    for data_dir, message in [
        (None, f"femnist: no data directory given; {hint}"),
        (tmp_path, f"femnist: no .json files in {tmp_path}/train; {hint}"),
    ]:
        with pytest.raises(DatasetUnavailable) as err:
            build_dataset("femnist", None, data_dir).check()
        assert str(err.value) == message
    write_leaf(tmp_path, {"train/a.json": {"f0": leaf_writer(1, 0)}})
    with pytest.raises(DatasetUnavailable, match=rf"femnist: no test/ folder in {tmp_path}; "):
        build_dataset("femnist", None, tmp_path).check()


# -- input shapes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, shape", [("digits", (1, 8, 8)), ("mnist", (1, 28, 28)), ("fashion-mnist", (1, 28, 28)), ("cifar10", (3, 32, 32)),
                    ("cifar100", (3, 32, 32)), ("femnist", (1, 28, 28))],
)
def test_every_built_in_set_declares_its_input_shape(name, shape):
    source = build_dataset(name, None, None)
    assert input_shape_of(source) == shape and int(np.prod(shape)) == source.num_features


class Flat:
    name = "flat"
    num_features, num_classes, train_size = 6, 2, 4


def test_a_set_without_an_input_shape_is_flat_and_a_wrong_one_is_refused():
    assert input_shape_of(Flat()) == (6,)
    for declared, message in [((2, 2), r"input_shape \(2, 2\) holds 4 values, the set declares num_features = 6"),
                              ((2, 0, 3), r"\(2, 0, 3\)"), ((2, 3.0), r"\(2, 3\.0\)"), (6, "6"), ((True, 6), r"\(True, 6\)")]:
        source = Flat()
        source.input_shape = declared
        if "holds" not in message:
            message = "input_shape must be a tuple of positive integers, got " + message
        with pytest.raises(ValueError, match=rf"^data set flat: {message}$"):
            input_shape_of(source)
    source = Flat()
    source.input_shape = (1, 2, 3)
    assert input_shape_of(source) == (1, 2, 3)


def test_dfedrw_list_shows_the_new_sets_with_their_settings():
    from dfedrw.peer.kinds.catalog import list_registered

    text = list_registered("datasets")
    for line in ("  cifar10  (dfedrw.peer.learning.datasets.cifar.CIFAR10)", "  cifar100  (dfedrw.peer.learning.datasets.cifar.CIFAR100)", '      labels: str = "fine"',
                 "  femnist  (dfedrw.peer.learning.datasets.femnist.FEMNIST)", "      max_writers: int = 0"):
        assert line in text.splitlines()
