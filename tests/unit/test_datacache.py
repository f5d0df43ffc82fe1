"""The data cache (peer.learning.datacache): the same values as load_dataset, built once, mapped,
checked, rebuilt when damaged, held in memory where nothing can be written."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import torch

from dfedrw.peer.learning import datacache
from dfedrw.peer.learning.datacache import CACHE_ENV, clear_stored
from dfedrw.peer.learning.datacache import stored_dataset as stored_source
from dfedrw.peer.learning.datacache import verify_stored as verify_source
from dfedrw.peer.learning.datasets import build_dataset, load_dataset
from tests.support.datafiles import write_idx_dataset


def stored_dataset(name, data_dir=None):
    return stored_source(build_dataset(name, None, data_dir))


def verify_stored(name, data_dir=None):
    return verify_source(build_dataset(name, None, data_dir))


@pytest.fixture
def idx_dir(tmp_path):
    folder = tmp_path / "mnist"
    folder.mkdir()
    write_idx_dataset(folder, compress=True)
    return folder


def assert_same(a, b):
    assert a.x.dtype == b.x.dtype == torch.float32 and torch.equal(a.x, b.x)
    assert a.y.dtype == b.y.dtype == torch.int64 and torch.equal(a.y, b.y)
    assert a.num_classes == b.num_classes


@pytest.mark.parametrize("name", ["digits", "mnist"])
def test_stored_rows_are_load_datasets_values_to_the_bit(fresh_cache, idx_dir, name):
    # Prepare
    folder = None if name == "digits" else idx_dir
    train, test = load_dataset(name, folder)

    # Execute
    stored = stored_dataset(name, folder)

    # Assert
    assert stored.folder is not None and stored.folder.parent == fresh_cache / "data"
    assert isinstance(stored.train.images, np.memmap) and not stored.train.images.flags.writeable
    assert_same(stored.train.dataset(), train)
    assert_same(stored.test.dataset(), test)
    rows = [3, 0, 7, 7]
    assert_same(stored.train.subset(rows), train.subset(rows))
    assert torch.equal(stored.train.y, train.y)


@pytest.mark.parametrize("name", ["digits", "mnist"])
def test_training_pixels_gathered_then_converted_are_load_datasets_values_to_the_bit(fresh_cache, idx_dir, name):
    from dfedrw.peer.learning.datacache import training_pixels

    folder = None if name == "digits" else idx_dir
    train, _ = load_dataset(name, folder)
    pixels = training_pixels(build_dataset(name, None, folder))
    assert pixels.x.dtype == torch.uint8 and pixels.scale is not None
    rows = torch.tensor([5, 1, 1, len(train.y) - 1])
    assert_same(type(train)(x=pixels.features(pixels.x[rows]), y=pixels.y[rows], num_classes=train.num_classes), train.subset(rows.tolist()))
    assert torch.equal(pixels.features(pixels.x), train.x)


def test_training_pixels_of_a_set_held_in_memory_are_its_features(tmp_path, monkeypatch):
    from dfedrw.peer.learning import datacache

    monkeypatch.setattr(datacache, "_cacheable", lambda source: False)
    clear_stored()
    pixels = datacache.training_pixels(build_dataset("digits", None, None))
    train, _ = load_dataset("digits", None)
    assert pixels.scale is None and pixels.x.dtype == torch.float32
    assert torch.equal(pixels.features(pixels.x[:7]), train.x[:7])
    clear_stored()


def test_an_entry_is_built_once_and_mapped_by_later_processes(fresh_cache, idx_dir):
    # Prepare
    first = stored_dataset("mnist", idx_dir)
    manifest = (first.folder / "manifest.json").stat().st_mtime_ns
    clear_stored()  # as a new process would

    # Execute
    second = stored_dataset("mnist", idx_dir)

    # Assert
    assert second.folder == first.folder
    assert (first.folder / "manifest.json").stat().st_mtime_ns == manifest
    assert [p.name for p in (fresh_cache / "data").iterdir()] == [first.folder.name]  # no temporary left


def test_replaced_source_files_get_a_new_entry(fresh_cache, idx_dir):
    # Prepare
    old = stored_dataset("mnist", idx_dir)
    clear_stored()
    path = next(idx_dir.glob("train-images*"))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))

    # Execute
    new = stored_dataset("mnist", idx_dir)

    # Assert
    assert new.folder != old.folder


@pytest.mark.parametrize("damage", ["flip", "truncate", "manifest"])
def test_a_damaged_entry_is_found_and_built_again(fresh_cache, idx_dir, damage):
    # Prepare
    train, _ = load_dataset("mnist", idx_dir)
    folder = stored_dataset("mnist", idx_dir).folder
    clear_stored()
    data = bytearray((folder / "train_x.u8").read_bytes())
    if damage == "flip":
        data[5] ^= 0xFF
        (folder / "train_x.u8").write_bytes(bytes(data))
    elif damage == "truncate":
        (folder / "train_x.u8").write_bytes(bytes(data[:-1]))
    else:
        (folder / "manifest.json").write_text("{")

    # Execute
    stored = verify_stored("mnist", idx_dir)

    # Assert
    assert_same(stored.train.dataset(), train)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["files"]["train_x"]["shape"] == [12, 784]


def test_an_entry_is_hashed_once_per_process_until_its_files_change(fresh_cache, idx_dir, monkeypatch):
    # Prepare: count the files hashed
    hashed = []
    digest = datacache._digest
    monkeypatch.setattr(datacache, "_digest", lambda path: hashed.append(path.name) or digest(path))
    train, _ = load_dataset("mnist", idx_dir)
    folder = verify_stored("mnist", idx_dir).folder  # built: its files hashed as they are written
    hashed.clear()

    # Execute: a batch of runs verifies its data set once per run
    verify_stored("mnist", idx_dir)
    verify_stored("mnist", idx_dir)
    first = list(hashed)
    data = bytearray((folder / "train_x.u8").read_bytes())
    data[5] ^= 0xFF
    (folder / "train_x.u8").write_bytes(bytes(data))
    os.utime(folder / "train_x.u8", ns=(1, 1))  # another modification time, as a rewrite gives
    stored = verify_stored("mnist", idx_dir)

    # Assert: checked once, then again when a file changed (and the damage found)
    assert sorted(first) == ["test_x.u8", "test_y.u8", "train_x.u8", "train_y.u8"]
    assert len(hashed) > len(first)
    assert_same(stored.train.dataset(), train)


def test_a_size_mismatch_is_caught_without_hashing(fresh_cache, idx_dir):
    # Prepare: a truncated file, opened by a process that does not verify digests
    train, _ = load_dataset("mnist", idx_dir)
    folder = stored_dataset("mnist", idx_dir).folder
    clear_stored()
    (folder / "test_y.u8").write_bytes(b"")

    # Execute
    stored = stored_dataset("mnist", idx_dir)

    # Assert
    assert_same(stored.train.dataset(), train)
    assert (folder / "test_y.u8").stat().st_size == 5


def test_two_builders_at_once_leave_one_complete_entry(fresh_cache, idx_dir):
    # Prepare: another process finished the same entry first
    source = build_dataset("mnist", None, idx_dir)
    (arrays, scale), classes = source.pixels(), source.num_classes
    folder, description = datacache._entry(source)
    datacache._write(folder, arrays, scale, classes, description)

    # Execute
    datacache._write(folder, arrays, scale, classes, description)

    # Assert
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]
    assert datacache._open(folder) is not None


def test_without_a_writable_cache_the_arrays_stay_in_memory(tmp_path, monkeypatch, idx_dir):
    # Prepare: the cache root is a file, so no folder can be made under it
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(blocker))
    clear_stored()
    train, test = load_dataset("mnist", idx_dir)

    # Execute
    stored = stored_dataset("mnist", idx_dir)
    clear_stored()

    # Assert
    assert stored.folder is None
    assert_same(stored.train.dataset(), train)
    assert_same(stored.test.dataset(), test)


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert datacache.cache_root() == tmp_path / "xdg" / "dfedrw"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert datacache.cache_root() == tmp_path / "mine"


@pytest.mark.parametrize("partition", ["iid", "dirichlet:0.5"])
def test_clients_data_without_shards_gives_the_same_aux_sets_and_rows(small_scenario, partition):
    """What the batched engine takes (shards=False): no shard converted, every other set the
    same values as a client's own."""
    from dfedrw.peer.wiring.assembly import clients_data
    from dfedrw.peer.wiring.plan import scenario_topology

    scenario = small_scenario("topology.honest=5", f"data.partition={partition}")
    topology = scenario_topology(scenario)
    ids = sorted(topology.honest())
    full, lean = clients_data(scenario, topology, ids), clients_data(scenario, topology, ids, shards=False)
    for k in ids:
        assert len(lean[k].train.y) == 0 and torch.equal(lean[k].train_index, full[k].train_index)
        assert_same(lean[k].aux, full[k].aux)
        assert torch.equal(lean[k].local_test_index, full[k].local_test_index)
        assert torch.equal(full[k].train.x, datacache.training_set(build_dataset("digits", None, None)).x[full[k].train_index])


# -- natural groups ------------------------------------------------------------------------------


@pytest.fixture
def leaf_dir(tmp_path):
    """LEAF FEMNIST files of 6 writers (2..7 training rows each, 1 test row)."""
    from tests.support.datafiles import leaf_writer, write_leaf

    folder = tmp_path / "femnist"
    writers = {f"f{i:04d}_00": leaf_writer(2 + i, seed=i) for i in range(6)}
    write_leaf(folder, {"train/a.json": writers, "test/a.json": {w: leaf_writer(1, seed=10 + i) for i, w in enumerate(writers)}})
    return folder


def test_groups_are_stored_as_int32_beside_the_pixels_and_listed_in_the_manifest(fresh_cache, leaf_dir):
    # Prepare
    source = build_dataset("femnist", None, leaf_dir)
    arrays, _ = source.pixels()

    # Execute
    stored = stored_source(source)

    # Assert
    manifest = json.loads((stored.folder / "manifest.json").read_text())
    assert manifest["format"] == 1 and sorted(manifest["files"]) == ["test_x", "test_y", "train_groups", "train_x", "train_y"]
    raw = (stored.folder / "train_groups.i32").read_bytes()
    assert raw == arrays["train_groups"].astype("<i4").tobytes()
    assert manifest["files"]["train_groups"] == {"shape": [27], "sha256": hashlib.sha256(raw).hexdigest()}
    assert isinstance(stored.train.groups, np.memmap) and np.array_equal(stored.train.groups, arrays["train_groups"])
    assert stored.train_groups is stored.train.groups and stored.test.groups is None


def test_an_entry_without_groups_is_as_it_was(fresh_cache, idx_dir):
    stored = stored_dataset("mnist", idx_dir)
    manifest = json.loads((stored.folder / "manifest.json").read_text())
    assert sorted(p.name for p in stored.folder.iterdir()) == ["manifest.json", "test_x.u8", "test_y.u8", "train_x.u8", "train_y.u8"]
    assert list(manifest) == ["format", "scale", "num_classes", "files", "source"] and manifest["format"] == 1
    assert list(manifest["files"]) == ["train_x", "train_y", "test_x", "test_y"]
    assert list(manifest["source"]) == ["name", "folder", "files"]  # the key of an IDX entry: the same as before
    assert stored.train.groups is None and stored.train_groups is None


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_groups_file_is_found_and_built_again(fresh_cache, leaf_dir, damage):
    # Prepare
    source = build_dataset("femnist", None, leaf_dir)
    groups = np.array(stored_source(source).train.groups)
    folder = stored_source(source).folder
    clear_stored()
    data = bytearray((folder / "train_groups.i32").read_bytes())
    if damage == "flip":
        data[4] ^= 0x01
    else:
        data = data[:-4]
    (folder / "train_groups.i32").write_bytes(bytes(data))
    os.utime(folder / "train_groups.i32", ns=(1, 1))

    # Execute
    opened = datacache._open(folder)
    stored = verify_source(source)

    # Assert: a short file is not even opened; a flipped one fails its digest; both rebuilt
    assert (opened is None) == (damage == "truncate")
    assert np.array_equal(stored.train.groups, groups)
    assert (folder / "train_groups.i32").read_bytes() == groups.astype("<i4").tobytes()


def test_clients_data_deals_writers_to_clients_with_natural(fresh_cache, leaf_dir, small_scenario):
    from dfedrw.peer.wiring.assembly import clients_data
    from dfedrw.peer.wiring.plan import scenario_topology

    # Prepare
    scenario = small_scenario("data.name=femnist", f"data.dir='{leaf_dir}'", "data.partition=natural", "topology.honest=3", "topology.byzantine=0")
    topology = scenario_topology(scenario)
    groups = stored_source(build_dataset("femnist", None, leaf_dir)).train.groups

    # Execute
    data = clients_data(scenario, topology, [0, 1, 2])

    # Assert: 27 rows of 6 writers (2..7 rows) dealt 9 / 9 / 9, no writer split
    writers = [set(groups[d.train_index.numpy()].tolist()) for d in data.values()]
    assert [len(d.train) for d in data.values()] == [9, 9, 9]
    assert sorted(w for ws in writers for w in ws) == list(range(6))


def test_natural_on_a_set_without_groups_is_refused_naming_the_sets_that_have_them(small_scenario):
    from dfedrw.peer.config.checks import ScenarioError

    with pytest.raises(ScenarioError, match=r"^data.partition='natural' needs a data set with natural groups \(femnist\); digits has none$"):
        small_scenario("data.partition=natural")


PLUGIN_SETS = '''
import numpy as np

class Grouped:
    num_features, num_classes, train_size = 3, 2, 12
    def load(self):
        x = np.arange(36, dtype=np.float32).reshape(12, 3)
        y = np.arange(12) % 2
        return (x, y, np.arange(12) // 3), (x[:4], y[:4])

class Plain(Grouped):
    def load(self):
        (x, y, _), test = super().load()
        return (x, y), test
'''


def test_a_plugin_set_held_in_memory_may_give_groups(tmp_path, monkeypatch, small_scenario):
    from dfedrw.peer.wiring.assembly import clients_data
    from dfedrw.peer.wiring.plan import scenario_topology

    # Prepare
    (tmp_path / "grouped_sets.py").write_text(PLUGIN_SETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    clear_stored()
    grouped = small_scenario("data.name='grouped_sets:Grouped'", "data.partition=natural", "topology.honest=2", "topology.byzantine=0")
    plain = small_scenario("data.name='grouped_sets:Plain'", "data.partition=natural", "topology.honest=2", "topology.byzantine=0")

    # Execute
    data = clients_data(grouped, scenario_topology(grouped), [0, 1])

    # Assert: 4 groups of 3 rows, 2 to each client; a set whose load() gives none is refused when loaded
    assert stored_source(build_dataset("grouped_sets:Grouped")).train_groups.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert sorted(len(d.train) for d in data.values()) == [6, 6]
    held = [set((d.train_index.numpy() // 3).tolist()) for d in data.values()]
    assert [len(h) for h in held] == [2, 2] and held[0] | held[1] == {0, 1, 2, 3}
    with pytest.raises(ValueError, match=r"^data.partition='natural' needs a data set with natural groups \(femnist\); Plain has none$"):
        clients_data(plain, scenario_topology(plain), [0])
    clear_stored()


def test_pixels_with_bad_groups_or_too_many_rows_are_refused(fresh_cache, leaf_dir, monkeypatch):
    from dfedrw.peer.learning.datasets import FEMNIST

    source = build_dataset("femnist", None, leaf_dir)
    pixels = FEMNIST.pixels
    monkeypatch.setattr(FEMNIST, "pixels", lambda self: ({**pixels(self)[0], "train_groups": np.zeros(3, np.int32)}, 255.0))
    with pytest.raises(ValueError, match=r"data set femnist: train_groups must hold one group per training row \(27\), got shape \(3,\)"):
        stored_source(source)
    monkeypatch.setattr(FEMNIST, "train_size", 20)
    with pytest.raises(ValueError, match=r"data set femnist: pixels\(\) gave 27 training rows, more than the set declares \(train_size = 20\)"):
        stored_source(build_dataset("femnist", {"max_writers": 6}, leaf_dir))
