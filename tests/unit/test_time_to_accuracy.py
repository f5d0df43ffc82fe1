"""scripts/time_to_accuracy.py: per cell of an exported sweep, the seconds and MB until the
honest mean first reached an accuracy, per seed (hand-made folder)."""

import json

from tests.support.scripts import load_script


def load():
    return load_script("time_to_accuracy")


def test_each_seed_gets_the_first_evaluation_at_the_target_and_a_dash_when_it_never_got_there(tmp_path, capsys):
    points = []
    for seed, accuracy in (("43", [50.0, 66.0, 70.0]), ("44", [40.0, 60.0, 64.9])):
        run = tmp_path / "runs" / seed
        run.mkdir(parents=True)
        curves = {"accuracy": [[9, accuracy[0]], [19, accuracy[1]], [29, accuracy[2]]], "seconds": [[9, 1.0], [19, 2.5], [29, 4.0]], "bytes_sent": [[9, 1e6], [19, 2e6], [29, 3e6]]}
        (run / "record.json").write_text(json.dumps({"version": 1, "curves": curves}))
        (run / "summary.json").write_text(json.dumps({"honest_mean_accuracy": accuracy[2], "honest_mean_seconds": 4.0, "honest_mean_bytes_sent": 3e6}))
        points.append({"labels": {"seed": seed, "graph": "ER"}, "run": f"runs/{seed}"})
    (tmp_path / "sweep.json").write_text(json.dumps({"axes": ["seed", "graph"], "points": points}))
    assert load().main([str(tmp_path), "--target", "65"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| graph | accuracy % | seconds | MB sent | seconds to 65 % | MB to 65 % |"
    assert lines[2] == "| ER | 67.45 | 4.00 | 3.00 | 2.5 / — | 2.00 / — |"


def test_a_folder_that_is_no_exported_sweep_is_refused(tmp_path, capsys):
    assert load().main([str(tmp_path)]) == 2
    assert "no sweep.json" in capsys.readouterr().err
