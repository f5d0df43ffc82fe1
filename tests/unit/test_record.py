"""experiments.record: the compact per-run record and `dfedrw export`."""

import json
import math
from pathlib import Path

import pytest

from dfedrw.experiments.cli import main
from dfedrw.experiments.record import RecordError, build_record, export_sweep, read_record, run_record, write_record
from dfedrw.experiments.report import write_report
from tests.support.reports import BYZ_SPEC, byz_peers, byz_rounds, make_byzantine, write_run


def with_scenarios(root):
    """Give every run folder of a hand-made sweep the scenario.toml a real run has."""
    for folder in (root / "runs").iterdir():
        (folder / "scenario.toml").write_text(f'# {folder.name}\nseed = 43\n')
    return root


def test_record_hand_computed_and_written_compactly(tmp_path):
    folder = write_run(tmp_path, "r", {}, byz_peers(80.0, byzantine=True), byz_rounds(80.0))

    record = write_record(folder)

    assert record["curves"]["global_accuracy"] == [[1, 70.0], [3, 80.0]]
    assert record["curves"]["accuracy"] == [[1, 0.0]]
    assert record["weights"]["receivers"] == [0, 1] and record["weights"]["senders"] == [0, 1, 2]
    # client 0 over 4 rounds: self 0.5+1+0.5+1, client 1 only in round 2, client 2 only in round 0;
    # client 1 never heard from 0 or 2 (not neighbours): null, not 0
    assert record["weights"]["matrix"] == [[0.75, 0.125, 0.125], [None, 1.0, None]]
    text = (folder / "record.json").read_text()
    assert "\n" not in text.rstrip("\n") and json.loads(text) == record
    assert read_record(folder) == record


def test_run_record_prefers_the_file_and_rebuilds_without_it(tmp_path):
    folder = write_run(tmp_path, "r", {}, byz_peers(80.0, byzantine=False), byz_rounds(80.0))
    summary = json.loads((folder / "summary.json").read_text())
    built = run_record(folder, summary)
    assert not (folder / "record.json").exists()  # reading never writes

    (folder / "record.json").write_text(json.dumps({**built, "curves": {"accuracy": [[5, 1.0]]}}))
    assert run_record(folder, summary)["curves"] == {"accuracy": [[5, 1.0]]}
    (folder / "record.json").write_text(json.dumps({**built, "version": 99}))
    assert run_record(folder, summary) == built  # another version is ignored, not misread
    (folder / "record.json").write_text("{torn")
    assert run_record(folder, summary) == built


def test_a_crashed_clients_torn_last_line_is_skipped(tmp_path):
    folder = write_run(tmp_path, "r", {}, byz_peers(80.0, byzantine=False), byz_rounds(80.0))
    with (folder / "peers" / "1.jsonl").open("a") as fh:
        fh.write('{"round": 4, "weights": {"1": 0.')
    record = build_record(folder, json.loads((folder / "summary.json").read_text()))
    assert record["weights"]["matrix"][1] == [None, 1.0]


def test_export_reports_exactly_like_the_sweep_and_leaves_out_unfinished_runs(tmp_path):
    src = with_scenarios(make_byzantine(tmp_path / "s", {**BYZ_SPEC}))
    sweep = json.loads((src / "sweep.json").read_text())
    sweep["grid"] = str(tmp_path / "somewhere" / "grid.toml")  # an absolute path from another machine
    (src / "sweep.json").write_text(json.dumps(sweep))
    unfinished = src / sweep["points"][0]["run"]
    (unfinished / "summary.json").unlink()
    (src / "runs" / "stray-folder").mkdir()  # not a point of the sweep: not exported

    runs = sorted({p["run"] for p in sweep["points"]})
    finished = [r for r in runs if (src / r / "summary.json").exists()]
    assert 0 < len(finished) < len(runs) - 1

    exported, left_out = export_sweep(src, tmp_path / "e")

    assert exported == len(finished)
    assert f"{sweep['points'][0]['run']} (no summary.json)" in left_out and len(left_out) == len(runs) - len(finished)
    out = tmp_path / "e"
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(r.split("/")[1] for r in finished)
    for folder in (out / "runs").iterdir():
        assert sorted(p.name for p in folder.iterdir()) == ["record.json", "scenario.toml", "summary.json"]
    assert json.loads((out / "sweep.json").read_text())["grid"] == "grid.toml"
    a = {p.relative_to(tmp_path / "a"): p.read_bytes() for p in write_report([src], tmp_path / "a")}
    b = {p.relative_to(tmp_path / "b"): p.read_bytes() for p in write_report([out], tmp_path / "b")}
    assert any(str(p).startswith("plots/weights_") for p in a)
    # identical, except that the export cannot tell a run never started from one that did not finish
    assert b[Path("table.md")] == a[Path("table.md")].replace(b"(no summary.json)", b"(not started)")
    assert {p: v for p, v in a.items() if p.name != "table.md"} == {p: v for p, v in b.items() if p.name != "table.md"}


def test_export_replaces_an_earlier_export_and_refuses_bad_folders(tmp_path, capsys):
    src = with_scenarios(make_byzantine(tmp_path / "s", {**BYZ_SPEC}))
    dest = tmp_path / "e"
    export_sweep(src, dest)
    stale = dest / "runs" / "gone-0000"  # a run of an earlier export that this one lacks
    stale.mkdir()
    (stale / "summary.json").write_text("{}")
    export_sweep(src, dest)
    assert not stale.exists() and not (tmp_path / "e.exporting").exists()

    with pytest.raises(RecordError, match="is the sweep folder"):
        export_sweep(src, src)
    with pytest.raises(RecordError, match="is inside the sweep folder"):
        export_sweep(src, src / "runs")
    with pytest.raises(RecordError, match="holds the sweep folder"):
        export_sweep(src, tmp_path)
    mine = tmp_path / "mine"  # a folder of the user's
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    raw = tmp_path / "raw"  # a sweep's own folder: its runs hold the clients' raw files
    (raw / "runs" / "r" / "peers").mkdir(parents=True)
    (raw / "sweep.json").write_text("{}")
    for folder in (mine, raw):
        with pytest.raises(RecordError, match="holds more than an earlier export"):
            export_sweep(src, folder)
    assert (mine / "notes.txt").exists() and (raw / "runs" / "r" / "peers").exists()  # left as they were
    (tmp_path / "afile").write_text("x")
    with pytest.raises(RecordError, match="is not a folder"):
        export_sweep(src, tmp_path / "afile")
    with pytest.raises(RecordError, match="no sweep.json"):
        export_sweep(tmp_path, tmp_path / "x")
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "no sweep.json" in err and len(err.strip().splitlines()) == 1


def test_weights_matrix_nan_roundtrip(tmp_path):
    from dfedrw.experiments.record import weights

    folder = write_run(tmp_path, "r", {}, byz_peers(80.0, byzantine=True), byz_rounds(80.0))
    receivers, senders, matrix = weights(write_record(folder))
    assert receivers == [0, 1] and senders == [0, 1, 2]
    assert math.isnan(matrix[1, 0]) and matrix[0, 0] == 0.75


def test_a_damaged_record_of_an_exported_run_is_refused_not_plotted_without_its_curve(tmp_path):
    # Prepare: an export (no round logs) with one run's record.json torn
    src = with_scenarios(make_byzantine(tmp_path / "s", {**BYZ_SPEC}))
    export_sweep(src, tmp_path / "e")
    damaged = next((tmp_path / "e" / "runs").iterdir())
    (damaged / "record.json").write_text("{garbage")

    # Execute, Assert
    with pytest.raises(RecordError, match=rf"{damaged.name}: record.json is missing, unreadable.*export the run again"):
        write_report([tmp_path / "e"], tmp_path / "report")


@pytest.mark.parametrize("text", ["[]", '{"points": 3}', "\xd8\x00"])
def test_a_sweep_json_of_the_wrong_shape_is_one_line(text, tmp_path, capsys):
    # Prepare
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "sweep.json").write_text(text, encoding="latin-1")

    # Execute
    code = main(["report", str(tmp_path / "s"), "--out", str(tmp_path / "r")])

    # Assert
    err = capsys.readouterr().err
    assert code == 2 and "sweep.json" in err and len(err.strip().splitlines()) == 1


def test_every_run_writes_the_record_a_rebuild_from_its_round_logs_gives(small_scenario, tmp_path):
    """collect_summary writes record.json from the read that builds the summary: the bytes
    write_record writes from the round logs afterwards."""
    from dfedrw.engines.together import run_together
    from dfedrw.engines.run import BatchedRun

    scenario = small_scenario("topology.honest=4", "topology.byzantine=1", "attack.name=gaussian", "eval.every=5", "engine.name=batched")
    summary = run_together([BatchedRun(scenario, tmp_path)])[0]
    written = (tmp_path / "record.json").read_bytes()
    record = json.loads(written)
    honest = sorted(int(k) for k, p in summary["peers"].items() if p["role"] == "honest")
    assert record["weights"]["receivers"] == honest and record["weights"]["senders"] == list(range(5))
    assert [r for r, _ in record["curves"]["global_accuracy"]] == [4, 9, 14, 19]
    (tmp_path / "record.json").unlink()
    write_record(tmp_path)
    assert (tmp_path / "record.json").read_bytes() == written


def test_the_record_builder_takes_each_receiver_once_in_order():
    from dfedrw.peer.results.records import RecordBuilder

    builder = RecordBuilder([0, 2], [0, 1, 2])
    builder.add(2, [{"round": 0, "weights": {"2": 1.0}}])
    with pytest.raises(ValueError, match="out of order"):
        builder.add(0, [])
    with pytest.raises(ValueError, match="out of order"):
        builder.add(2, [])


def test_a_batched_runs_summary_comes_from_what_its_logs_kept_and_equals_one_read_back(small_scenario, tmp_path, monkeypatch):
    """The batched engine builds summary.json and record.json from each round log's digest, kept
    as the records were written, without reading the logs back: the same bytes as a summary
    built from the files afterwards."""
    from dfedrw.peer.results import collect
    from dfedrw.engines.together import run_together
    from dfedrw.engines.run import BatchedRun
    from dfedrw.peer.results import records as results

    scenario = small_scenario("topology.honest=4", "topology.byzantine=1", "attack.name=gaussian", "eval.every=5", "engine.name=batched")

    def no_reading(*args, **kwargs):
        raise AssertionError("the round logs were read back")

    with monkeypatch.context() as patch:
        patch.setattr(results, "read_rounds", no_reading)
        summary = run_together([BatchedRun(scenario, tmp_path)])[0]
    written = {name: (tmp_path / name).read_bytes() for name in ("summary.json", "record.json")}
    assert summary["byzantine_weight_share"] is not None and all(p["rounds_done"] == scenario.rounds for p in summary["peers"].values())
    # What the engine adds: how it ran (and, on a GPU, the layout's timing and what it held there).
    keep = ("interrupted", "launcher_pid", "transport", "tls", "device", "layout", "layout_choice")
    keep += tuple(key for key in ("layout_seconds", "cuda_max_allocated_mib", "cuda_max_reserved_mib") if key in summary)
    rebuilt = collect.collect_summary(
        tmp_path, scenario, pids={int(k): p["pid"] for k, p in summary["peers"].items()},
        exit_codes={int(k): p["exit_code"] for k, p in summary["peers"].items()}, wall_seconds=summary["wall_seconds"],
        extra={key: summary[key] for key in keep},
    )
    assert rebuilt == summary
    assert {name: (tmp_path / name).read_bytes() for name in written} == written


def test_a_round_digest_is_what_summarize_reads_of_the_records():
    from dfedrw.peer.results.records import RoundDigest

    records = [
        {"round": 0, "weights": {"0": 0.5, "3": 0.5}},
        {"round": 1, "weights": {"0": 0.25, "1": 0.25, "3": 0.5}, "accuracy": 50.0, "global_accuracy": 40.0},
        {"round": 2, "weights": {"0": 1.0}},
    ]
    digest = RoundDigest.of(records, byzantine=[3])
    assert digest.rounds == 3
    assert digest.byzantine_shares == [0.5, 0.5, 0]
    assert digest.weight_sums == {0: 1.75, 3: 1.0, 1: 0.25}
    assert digest.curves == {"accuracy": [(1, 50.0)], "global_accuracy": [(1, 40.0)], "attack_success": [], "seconds": [], "bytes_sent": []}
    assert digest.isolated()  # the last tenth of its rounds (one) weighed only itself
    assert not RoundDigest.of(records[:2]).isolated() and not RoundDigest().isolated()


def test_records_with_seconds_give_accuracy_against_time_and_bytes():
    from dfedrw.peer.results.records import RecordBuilder, RoundDigest

    def log(seconds, sent):
        return [
            {"round": 0, "weights": {}, "bytes_sent": sent, "seconds": seconds},
            {"round": 1, "weights": {}, "bytes_sent": sent, "seconds": 2 * seconds, "accuracy": 50.0},
            {"round": 2, "weights": {}, "bytes_sent": sent, "seconds": 3 * seconds, "accuracy": 60.0},
        ]

    digest = RoundDigest.of(log(1.5, 100))
    # At each evaluation round: the seconds of that round's end, the bytes sent through it.
    assert digest.curves["seconds"] == [(1, 3.0), (2, 4.5)] and digest.curves["bytes_sent"] == [(1, 200.0), (2, 300.0)]
    assert (digest.seconds, digest.bytes_sent) == (4.5, 300)
    builder = RecordBuilder([0, 1], [0, 1])
    builder.add(0, log(1.0, 100))
    builder.add(1, log(2.0, 300))
    curves = builder.result()["curves"]
    assert curves["seconds"] == [[1, 3.0], [2, 4.5]] and curves["bytes_sent"] == [[1, 400.0], [2, 600.0]]
    # Records without seconds (a batched run without a clock) have neither curve, as before.
    plain = RecordBuilder([0], [0])
    plain.add(0, [{"round": 1, "weights": {}, "bytes_sent": 0, "accuracy": 50.0}])
    assert set(plain.result()["curves"]) == {"accuracy", "global_accuracy"}
