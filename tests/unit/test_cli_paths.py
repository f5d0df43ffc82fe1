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
        assert code == 2 and "Traceback" not in err and last.startswith("dfedrw: ") and str(tmp_path) in last, (command, err)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--listen-port", "99999", "--peer", "1=127.0.0.1:7001"], "--listen-port 99999: must be in 0..65535"),
        (["--listen-port", "-5", "--peer", "1=127.0.0.1:7001"], "--listen-port -5: must be in 0..65535"),
        (["--rendezvous", "garbage"], "--rendezvous 'garbage': expected tcp://HOST:PORT"),
        (["--rendezvous", "tcp://127.0.0.1:70000"], "expected tcp://HOST:PORT"),
        (["--peer", "2=127.0.0.1:abc"], "bad --peer '2=127.0.0.1:abc'"),
        (["--peer", "2=:17002"], "bad --peer '2=:17002'"),
        (["--peer", "2=no such host:17002"], "bad --peer '2=no such host:17002'"),
    ],
)
def test_a_hand_started_clients_bad_address_is_refused_before_it_starts(flags, message, tmp_path):
    # Execute
    with pytest.raises(SystemExit) as exit_:
        main(["peer", "--scenario", "s.toml", "--id", "0", "--out", str(tmp_path / "out"), *flags])

    # Assert
    assert message in str(exit_.value.code) and not (tmp_path / "out").exists()


def test_well_formed_addresses_pass():
    from dfedrw.peer.client.rendezvous import host_port

    assert host_port("hostA:7000") == ("hostA", 7000) and host_port("[::1]:7000") == ("::1", 7000)
    assert host_port("client-3:50051") == ("client-3", 50051) and host_port("host:0") is None


def test_the_torchrun_entry_point_outside_torchrun_says_how_to_start_it(monkeypatch):
    # Prepare
    from dfedrw.launch.torchrun import main as torchrun_main

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)

    # Execute
    with pytest.raises(SystemExit) as exit_:
        torchrun_main(["--scenario", "s.toml"])

    # Assert
    assert "RANK and WORLD_SIZE are not set: start it under torchrun" in str(exit_.value.code)

