"""Paths that are not what a command needs are one line and exit status 2, never a traceback
or a write somewhere else: an empty folder flag, a folder given for a file, a file for a folder."""

import pytest

from dfedrw.experiments.cli import main


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--out", ""], ["sweep", "grid.toml", "--out", ""], ["report", "x", "--out", ""], ["export", "x", "--out", ""],
        ["certs", "--out", ""], ["compose", "--out", ""], ["peer", "--scenario", "s.toml", "--id", "0", "--out", ""],
        ["run", "--tensorboard", ""], ["run", "--certs", ""],
    ],
)
def test_an_empty_folder_flag_is_refused_before_anything_is_written(command, tmp_path, monkeypatch, capsys):
    # Prepare: an empty --out would have meant this folder
    monkeypatch.chdir(tmp_path)

    # Execute
    with pytest.raises(SystemExit) as exit_:
        main(command)

    # Assert
    assert exit_.value.code == 2 and "an empty path" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_folder_given_as_the_scenario_or_a_file_as_the_results_folder_is_one_line(tmp_path, capsys):
    # Prepare
    (tmp_path / "afile").write_text("x")
    commands = [
        ["run", str(tmp_path), "--engine", "batched"],
        ["sweep", str(tmp_path)],
        ["run", "--engine", "batched", "--set", "rounds=1", "--set", "eval.every=0", "--out", str(tmp_path / "afile")],
        ["list", "--readme", str(tmp_path / "missing.md")],
    ]

    for command in commands:
        # Execute
        code = main(command)

        # Assert
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert code == 2 and "Traceback" not in err and last.startswith("dfedrw: [Errno") and str(tmp_path) in last, (command, err)
