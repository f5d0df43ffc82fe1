"""The data cache (peer.datacache): the same values as load_dataset, built once, mapped,
checked, rebuilt when damaged, held in memory where nothing can be written."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from dfedrw.peer import datacache
from dfedrw.peer.datacache import CACHE_ENV, clear_stored
from dfedrw.peer.datacache import stored_dataset as stored_source
from dfedrw.peer.datacache import verify_stored as verify_source
from dfedrw.peer.datasets import build_dataset, load_dataset
from tests.helpers import write_idx_dataset


def stored_dataset(name, data_dir=None):
    return stored_source(build_dataset(name, None, data_dir))


def verify_stored(name, data_dir=None):
    return verify_source(build_dataset(name, None, data_dir))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    clear_stored()
    yield tmp_path / "cache"
    clear_stored()


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
def test_stored_rows_are_load_datasets_values_to_the_bit(cache, idx_dir, name):
    # Prepare
    folder = None if name == "digits" else idx_dir
    train, test = load_dataset(name, folder)

    # Execute
    stored = stored_dataset(name, folder)

    # Assert
    assert stored.folder is not None and stored.folder.parent == cache / "data"
    assert isinstance(stored.train.images, np.memmap) and not stored.train.images.flags.writeable
    assert_same(stored.train.dataset(), train)
    assert_same(stored.test.dataset(), test)
    rows = [3, 0, 7, 7]
    assert_same(stored.train.subset(rows), train.subset(rows))
    assert torch.equal(stored.train.y, train.y)


def test_an_entry_is_built_once_and_mapped_by_later_processes(cache, idx_dir):
    # Prepare
    first = stored_dataset("mnist", idx_dir)
    manifest = (first.folder / "manifest.json").stat().st_mtime_ns
    clear_stored()  # as a new process would

    # Execute
    second = stored_dataset("mnist", idx_dir)

    # Assert
    assert second.folder == first.folder
    assert (first.folder / "manifest.json").stat().st_mtime_ns == manifest
    assert [p.name for p in (cache / "data").iterdir()] == [first.folder.name]  # no temporary left


def test_replaced_source_files_get_a_new_entry(cache, idx_dir):
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
def test_a_damaged_entry_is_found_and_built_again(cache, idx_dir, damage):
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


def test_an_entry_is_hashed_once_per_process_until_its_files_change(cache, idx_dir, monkeypatch):
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


def test_a_size_mismatch_is_caught_without_hashing(cache, idx_dir):
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


def test_two_builders_at_once_leave_one_complete_entry(cache, idx_dir):
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
    from dfedrw.peer.assembly import clients_data
    from dfedrw.peer.plan import scenario_topology

    scenario = small_scenario("topology.honest=5", f"data.partition={partition}")
    topology = scenario_topology(scenario)
    ids = sorted(topology.honest())
    full, lean = clients_data(scenario, topology, ids), clients_data(scenario, topology, ids, shards=False)
    for k in ids:
        assert len(lean[k].train.y) == 0 and torch.equal(lean[k].train_index, full[k].train_index)
        assert_same(lean[k].aux, full[k].aux)
        assert torch.equal(lean[k].local_test_index, full[k].local_test_index)
        assert torch.equal(full[k].train.x, datacache.training_set(build_dataset("digits", None, None)).x[full[k].train_index])
