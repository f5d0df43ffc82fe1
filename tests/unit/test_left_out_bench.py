"""bench/left_out.py on hand-made round records: the rounds an attacker attacked and was a
candidate, those it was left out of, and the bands of the shares."""

import json

from tests.support.scripts import load_bench

bench = load_bench("left_out")


def test_only_the_rounds_the_attacker_attacked_and_was_heard_count():
    byzantine = {5: [{"round": 0, "attack": {"attacking": False}}, {"round": 1, "attack": {}}, {"round": 2}, {"round": 3}]}
    honest = {
        0: [
            {"round": 0, "weights": {"0": 1.0, "5": 0.0}},  # not attacking: not counted
            {"round": 1, "weights": {"0": 1.0, "5": 0.0}},
            {"round": 2, "weights": {"0": 0.5, "5": 0.5}},
            {"round": 3, "weights": {"0": 1.0}},  # not heard: not counted
        ],
        1: [{"round": r, "weights": {"1": 1.0}} for r in range(4)],  # never its neighbour
    }
    assert bench.left_out_shares(honest, byzantine) == {(0, 5): (1, 2)}


def test_bands():
    assert [bench.band(0, 10), bench.band(1, 10), bench.band(8, 10), bench.band(9, 10)] == [
        "under 10 %", "10 to 90 %", "10 to 90 %", "90 % and over",
    ]


def test_a_run_folder_is_tallied(tmp_path):
    run = tmp_path / "run"
    (run / "peers").mkdir(parents=True)
    peers = {"0": {"role": "honest"}, "1": {"role": "honest"}, "5": {"role": "byzantine"}}
    (run / "summary.json").write_text(json.dumps({"peers": peers, "honest_mean_global_accuracy": 50.0}))
    (run / "peers" / "5.jsonl").write_text("".join(json.dumps({"round": r}) + "\n" for r in range(10)))
    for k, left in (("0", 10), ("1", 5)):
        records = [{"round": r, "weights": {k: 1.0, "5": 0.0 if r < left else 0.1}} for r in range(10)]
        (run / "peers" / f"{k}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in records))
    figures = bench.tally([run])
    assert figures["bands"] == {"under 10 %": 0, "10 to 90 %": 1, "90 % and over": 1}
    assert figures["runs"]["run"]["pairs"] == [
        {"client": 0, "attacker": 5, "left_out": 10, "rounds": 10}, {"client": 1, "attacker": 5, "left_out": 5, "rounds": 10},
    ]
