"""The driver's side of ``dfedrw sweep --ray`` that needs no cluster: its one-line refusals, the
files a task returns written only inside their run folder, the nodes kept in sweep.json."""

from __future__ import annotations

import json
import sys

import pytest

from dfedrw.experiments.grid import SweepError, load_grid
from dfedrw.experiments.sweep_plan import plan_sweep
from dfedrw.experiments.sweep_record import previous_nodes, sweep_record
from dfedrw.experiments.sweep_ray import RayCluster, batch_memory, check_fits, ray_batches, write_files


def _plan(tmp_path, lines: str):
    grid = tmp_path / "grid.toml"
    grid.write_text(lines)
    return plan_sweep(load_grid(grid), tmp_path / "out")


SMALL = 'set = ["rounds=5", "data.name=digits"]\n[axes]\nseed = [1, 2, 3]\n'


def test_without_ray_the_flag_fails_in_one_line_that_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(SweepError, match=r"^--ray needs Ray, which is not installed: pip install 'dfedrw\[ray\]'$"):
        RayCluster.connect("127.0.0.1:6379")


def test_a_batch_no_node_can_hold_is_refused_with_its_size_and_the_largest_node(tmp_path):
    plan = _plan(tmp_path, SMALL)
    batches = ray_batches(list(plan.runs.values()), 1, 16)
    assert [len(b) for b in batches] == [3]
    needs = batch_memory(batches[0])
    check_fits(batches, RayCluster("h:1", cpus=2, node_memory=needs, nodes=2))  # fits exactly
    with pytest.raises(SweepError) as refused:
        check_fits(batches, RayCluster("h:1", cpus=2, node_memory=needs - 1, nodes=2))
    message = str(refused.value)
    assert "\n" not in message and "a batch of 3 run(s)" in message and "or a smaller batch (--batch)" in message
    assert f"{needs / 1e9:.2f} GB" in message
    with pytest.raises(SweepError, match="offers no CPU"):
        check_fits(batches, RayCluster("h:1", cpus=0, node_memory=1 << 40, nodes=1))


def test_runs_of_client_processes_are_refused_on_ray(tmp_path):
    plan = _plan(tmp_path, 'set = ["rounds=5", "engine.name=clients", "network.transport=inproc"]\n[axes]\nseed = [1]\n')
    with pytest.raises(SweepError, match=r"--ray runs the batched engine; 1 run\(s\) name another engine"):
        ray_batches(list(plan.runs.values()), 2, 16)


def test_files_a_task_returns_are_written_inside_their_run_folder_only(tmp_path):
    folder = tmp_path / "runs" / "a-1"
    write_files(folder, {"summary.json": b"{}", "peers/0.jsonl": b"x\n", "logs/": b""})
    assert (folder / "summary.json").read_bytes() == b"{}" and (folder / "peers" / "0.jsonl").read_bytes() == b"x\n"
    assert (folder / "logs").is_dir() and not any((folder / "logs").iterdir())
    for bad in ("../b/summary.json", "/etc/passwd", "peers/../../escape"):
        with pytest.raises(SweepError, match="outside its run folder"):
            write_files(folder, {bad: b"no"})
    assert not (tmp_path / "runs" / "b").exists() and not (tmp_path / "escape").exists()


def test_the_node_of_each_run_is_kept_in_sweep_json_across_sittings(tmp_path):
    plan = _plan(tmp_path, SMALL)
    first = next(iter(plan.runs.values()))
    node = {"node_id": "abc", "address": "10.0.0.2", "host": "n2"}
    record = sweep_record(plan, {first.key: "done"}, [], {first.key: node})
    entry = record["runs"][f"runs/{first.name}"]
    assert entry["node"] == node and all("node" not in e for name, e in record["runs"].items() if name != f"runs/{first.name}")
    plan.out_dir.mkdir(parents=True)
    (plan.out_dir / "sweep.json").write_text(json.dumps(record))
    assert previous_nodes(plan) == {first.key: node}


def _mnist_source(folder):
    from dfedrw.peer.learning.datasets import dataset_of

    return dataset_of("mnist", (), str(folder))


def test_a_data_set_digest_follows_its_contents_not_its_files_and_arrays_given_stand_for_missing_files(tmp_path, monkeypatch):
    import shutil

    from dfedrw.peer.learning import datacache
    from tests.support.datafiles import write_image_idx

    monkeypatch.setenv(datacache.CACHE_ENV, str(tmp_path / "cache"))
    datacache.clear_stored()
    try:
        here = write_image_idx(tmp_path / "a", seed=1)
        copy = tmp_path / "b"
        shutil.copytree(here, copy)
        other = write_image_idx(tmp_path / "c", seed=2)
        a, b, c = (_mnist_source(f) for f in (here, copy, other))
        assert datacache.content_digest(a) == datacache.content_digest(b) != datacache.content_digest(c)
        arrays, scale, classes = datacache.stored_arrays(a)
        shutil.rmtree(copy)  # a node without the files
        datacache.clear_stored()
        with pytest.raises(RuntimeError):
            datacache.verify_stored(b)
        datacache.provide(b, {k: v.copy() for k, v in arrays.items()}, scale, classes)
        assert datacache.provided(b) and datacache.content_digest(b) == datacache.content_digest(a)
        stored = datacache.verify_stored(b)
        assert stored.folder is None and (stored.train.images == arrays["train_x"]).all()
        datacache.clear_stored()
        assert not datacache.provided(b)
    finally:
        datacache.clear_stored()
