import json

import pytest

from dfedrw.experiments.cli import main
from dfedrw.peer.config.scenario import dump_scenario
from dfedrw.peer.results.records import RoundLog, check_fresh_out_dir, read_rounds, summarize, write_json_atomic


def write_peer(out, k, role, acc, gacc, weights_per_round, completed=True):
    log = RoundLog(out, k)
    for r, w in enumerate(weights_per_round):
        log.write({"round": r, "weights": {str(s): v for s, v in w.items()}})
    log.close()
    if completed:
        write_json_atomic(out / "peers" / f"{k}.json", {"completed": True, "accuracy": acc, "global_accuracy": gacc, "rejected_messages": 0})


def test_summary_statistics_hand_computed(tmp_path):
    # honest 0, 1, 2; Byzantine 3. Client 2 crashed after one round.
    write_peer(tmp_path, 0, "honest", 80.0, 70.0, [{0: 0.5, 1: 0.3, 3: 0.2}, {0: 1.0}])
    write_peer(tmp_path, 1, "honest", 90.0, 74.0, [{1: 0.9, 3: 0.1}, {1: 1.0, 3: 0.0}])
    write_peer(tmp_path, 2, "honest", None, None, [{2: 1.0}], completed=False)
    write_peer(tmp_path, 3, "byzantine", None, None, [{}, {}])
    s = summarize(
        tmp_path,
        roles={0: "honest", 1: "honest", 2: "honest", 3: "byzantine"},
        pids={0: 10, 1: 11, 2: 12, 3: 13},
        exit_codes={0: 0, 1: 0, 2: -9, 3: 0},
        rounds=2,
        wall_seconds=1.5,
    )
    assert s["honest_mean_accuracy"] == pytest.approx(85.0)
    assert s["accuracy_variance"] == pytest.approx(25.0)  # population variance of 80, 90
    assert s["honest_mean_global_accuracy"] == pytest.approx(72.0)
    assert s["global_accuracy_variance"] == pytest.approx(4.0)
    assert s["worst_accuracy"] == 80.0
    # shares per honest client-round: 0.2, 0.0, 0.1, 0.0, and client 2's one round 0.0
    assert s["byzantine_weight_share"] == pytest.approx(0.3 / 5)
    assert s["failed_peers"] == [2]
    assert s["peers"]["2"]["rounds_done"] == 1 and s["peers"]["2"]["exit_code"] == -9
    assert s["peers"]["0"]["pid"] == 10


def test_no_byzantine_gives_null_share(tmp_path):
    write_peer(tmp_path, 0, "honest", 50.0, 50.0, [{0: 1.0}])
    s = summarize(tmp_path, roles={0: "honest"}, pids={0: 1}, exit_codes={0: 0}, rounds=1, wall_seconds=0)
    assert s["byzantine_weight_share"] is None and s["accuracy_variance"] == 0.0


def test_torn_last_line_is_skipped(tmp_path):
    write_peer(tmp_path, 0, "honest", 1.0, 1.0, [{0: 1.0}, {0: 1.0}])
    with (tmp_path / "peers" / "0.jsonl").open("a") as f:
        f.write('{"round": 2, "wei')
    assert [r["round"] for r in read_rounds(tmp_path, 0)] == [0, 1]
    json.loads((tmp_path / "peers" / "0.json").read_text())


def test_a_client_that_ended_alone_is_listed_as_isolated(tmp_path):
    # client 0 heard from 1 throughout; client 1 lost everyone for its last rounds.
    write_peer(tmp_path, 0, "honest", 80.0, 80.0, [{0: 0.5, 1: 0.5}] * 20)
    write_peer(tmp_path, 1, "honest", 60.0, 60.0, [{1: 0.5, 0: 0.5}] * 10 + [{1: 1.0}] * 10)
    s = summarize(tmp_path, roles={0: "honest", 1: "honest"}, pids={0: 1, 1: 2}, exit_codes={0: 0, 1: 0}, rounds=20, wall_seconds=0)
    assert s["isolated_peers"] == [1] and s["failed_peers"] == []


def test_what_the_network_did_to_honest_clients_is_said_not_hidden_behind_ok(tmp_path):
    # Prepare: 100 rounds. Client 0 alone in 2 of them (over 1 %), client 1 in 1 (not over);
    # client 0's server shut out honest client 1 twice and Byzantine client 2 once.
    write_peer(tmp_path, 0, "honest", 80.0, 80.0, [{0: 0.5, 1: 0.5}] * 98 + [{0: 1.0}] * 2)
    write_peer(tmp_path, 1, "honest", 82.0, 82.0, [{1: 1.0}] + [{1: 0.5, 0: 0.5}] * 99)
    write_peer(tmp_path, 2, "byzantine", None, None, [{}] * 100)
    final = json.loads((tmp_path / "peers" / "0.json").read_text())
    write_json_atomic(tmp_path / "peers" / "0.json", {**final, "shut_out": {"1": 2, "2": 1}, "held_back": {"rounds": 3, "seconds": 1.5}})

    # Execute
    s = summarize(tmp_path, roles={0: "honest", 1: "honest", 2: "byzantine"}, pids={}, exit_codes={}, rounds=100, wall_seconds=1.0)

    # Assert
    assert s["alone_peers"] == {"0": 0.02} and s["honest_senders_shut_out"] == {"0": {"1": 2}}
    assert s["peers"]["0"]["rounds_alone"] == 2 and s["peers"]["1"]["rounds_alone"] == 1
    assert s["peers"]["0"]["held_back"] == {"rounds": 3, "seconds": 1.5} and "held_back" not in s["peers"]["1"]
    assert s["peers"]["0"]["notes"] == ["alone 2% of rounds", "shut out honest 1"] and "notes" not in s["peers"]["1"]
    assert s["warnings"] == [
        "honest clients aggregated their own model only in more than 1% of their rounds: 0 (2%)",
        "honest senders were shut out for sending past their rate bound: 1 by 0",
    ]
    # The launcher's table and closing line say it too.
    from rich.console import Console

    from dfedrw.launch.local import print_summary

    console = Console(record=True, width=200)
    print_summary(s, console)
    text = console.export_text()
    assert "ok, alone 2% of rounds; shut out honest 1" in text
    assert "failed none; alone 0 (2%); honest shut out 1 by 0; 100 rounds in 1.0 s" in text
    assert "warning: honest senders were shut out for sending past their rate bound: 1 by 0" in text


def test_a_healthy_run_has_no_warnings(tmp_path):
    write_peer(tmp_path, 0, "honest", 80.0, 80.0, [{0: 0.5, 1: 0.5}] * 10)
    write_peer(tmp_path, 1, "honest", 80.0, 80.0, [{0: 0.5, 1: 0.5}] * 10)
    s = summarize(tmp_path, roles={0: "honest", 1: "honest"}, pids={}, exit_codes={}, rounds=10, wall_seconds=0)
    assert s["warnings"] == [] and s["alone_peers"] == {} and s["honest_senders_shut_out"] == {}


# -- one run per results folder ------------------------------------------------------------------
def test_a_client_started_again_moves_the_earlier_round_log_aside(tmp_path):
    write_peer(tmp_path, 0, "honest", None, None, [{0: 1.0}, {0: 1.0}, {0: 1.0}], completed=False)
    write_peer(tmp_path, 0, "honest", None, None, [{0: 0.5}], completed=False)
    write_peer(tmp_path, 0, "honest", None, None, [{0: 0.25}, {0: 0.25}], completed=False)

    assert [r["weights"] for r in read_rounds(tmp_path, 0)] == [{"0": 0.25}, {"0": 0.25}]
    peers = tmp_path / "peers"
    assert len((peers / "0.jsonl.1").read_text().splitlines()) == 3
    assert len((peers / "0.jsonl.2").read_text().splitlines()) == 1


def test_a_fresh_or_empty_folder_is_accepted(tmp_path):
    check_fresh_out_dir(tmp_path / "missing", range(3))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(NotADirectoryError, match="--out .*afile is not a folder"):
        check_fresh_out_dir(tmp_path / "afile", range(3))
    (tmp_path / "peers").mkdir()
    (tmp_path / "peers" / "0.jsonl").write_text("")  # opened, nothing written yet
    check_fresh_out_dir(tmp_path, range(3))

    log = RoundLog(tmp_path, 0)  # and a run there writes its round log over the empty one
    log.write({"round": 0, "weights": {}})
    log.close()
    assert [r["round"] for r in read_rounds(tmp_path, 0)] == [0] and not (tmp_path / "peers" / "0.jsonl.1").exists()


@pytest.mark.parametrize(
    "summary, what",
    [({"interrupted": True}, "an interrupted run"), ({"interrupted": False}, "a finished run"), (None, "a finished run")],
)
def test_a_folder_with_a_summary_is_refused_and_says_which_kind(tmp_path, summary, what):
    path = tmp_path / "summary.json"
    path.write_text("{not json" if summary is None else json.dumps(summary))

    with pytest.raises(FileExistsError, match=f"already holds {what}"):
        check_fresh_out_dir(tmp_path, range(3))


def test_a_folder_with_round_logs_of_a_killed_run_is_refused(tmp_path):
    write_peer(tmp_path, 2, "honest", None, None, [{2: 1.0}], completed=False)

    with pytest.raises(FileExistsError, match=r"earlier run that did not finish \(2\.jsonl\)"):
        check_fresh_out_dir(tmp_path, range(3))
    check_fresh_out_dir(tmp_path, [0, 1])  # a torchrun rank checks only its own log


def test_dfedrw_run_refuses_a_reused_folder_before_starting_anything(small_scenario, tmp_path, capsys):
    scenario_path = tmp_path / "s.toml"
    dump_scenario(small_scenario("network.transport=inproc"), scenario_path)
    out = tmp_path / "run"
    write_peer(out, 1, "honest", None, None, [{1: 1.0}], completed=False)

    assert main(["run", str(scenario_path), "--out", str(out)]) == 2
    assert "earlier run that did not finish" in capsys.readouterr().err
    assert not (out / "summary.json").exists()
    assert sorted(p.name for p in (out / "peers").iterdir()) == ["1.jsonl"]


def test_a_round_log_flushes_each_record_or_at_most_every_flush_seconds(tmp_path, monkeypatch):
    import dfedrw.peer.results.records as results

    clock = [100.0]
    monkeypatch.setattr(results.time, "monotonic", lambda: clock[0])
    eager, lazy = RoundLog(tmp_path / "a", 0), RoundLog(tmp_path / "b", 0, flush_seconds=1.0)
    for r in range(3):
        eager.write({"round": r})
        lazy.write({"round": r})
        clock[0] += 0.4
    assert [x["round"] for x in read_rounds(tmp_path / "a", 0)] == [0, 1, 2]
    assert read_rounds(tmp_path / "b", 0) == []  # 0.8 s after it opened: nothing flushed yet
    lazy.write({"round": 3})  # 1.2 s: this one flushes what it holds
    assert [x["round"] for x in read_rounds(tmp_path / "b", 0)] == [0, 1, 2, 3]
    lazy.write({"round": 4})
    lazy.close()
    eager.close()
    assert [x["round"] for x in read_rounds(tmp_path / "b", 0)] == [0, 1, 2, 3, 4]


def test_a_final_record_or_round_line_that_is_not_a_record_counts_as_none(tmp_path):
    # Prepare: honest 0 and 1 finished; client 2 (Byzantine: under compose it writes its own
    # folder as it likes) left a final file of garbage and round lines that are not records
    write_peer(tmp_path, 0, "honest", 80.0, 70.0, [{0: 0.5, 2: 0.5}])
    write_peer(tmp_path, 1, "honest", 60.0, 50.0, [{1: 1.0}])
    (tmp_path / "peers" / "2.json").write_bytes(b"\xd8{garbage")
    (tmp_path / "peers" / "2.jsonl").write_text('[1, 2]\n"text"\n{"round": 0, "weights": {}}\n')

    # Execute
    roles = {0: "honest", 1: "honest", 2: "byzantine"}
    summary = summarize(tmp_path, roles=roles, pids=dict.fromkeys(roles, 1), exit_codes=dict.fromkeys(roles, 0), rounds=1, wall_seconds=0)

    # Assert
    assert summary["failed_peers"] == [2] and summary["peers"]["2"]["rounds_done"] == 1
    assert summary["honest_mean_accuracy"] == pytest.approx(70.0) and summary["byzantine_weight_share"] == pytest.approx(0.25)
