"""The variables that stand for ``dfedrw peer``'s flags (``DFEDRW_LISTEN_PORT``,
``DFEDRW_TENSORBOARD``, ...) set a client started by hand, and the ``--tensorboard`` default of
every command; a launcher does not pass them on to the clients or runs it starts with their
flags."""

from pathlib import Path

import pytest

from dfedrw.experiments.cli import add_commands
from dfedrw.experiments.sweep import _child_env
from dfedrw.launch.cli import build_parser
from dfedrw.launch.forkserver import client_env
from dfedrw.peer.cli import FLAG_VARIABLES, without_flag_variables


@pytest.fixture
def flag_variables(monkeypatch, tmp_path):
    """Every flag variable set, as a shell left over from starting a client by hand would have it."""
    for name in FLAG_VARIABLES:
        monkeypatch.setenv(name, "7000" if name in ("DFEDRW_LISTEN_PORT", "DFEDRW_ID") else str(tmp_path / name.lower()))
    monkeypatch.setenv("DFEDRW_CACHE_DIR", str(tmp_path / "cache"))


def test_only_the_flag_variables_are_taken_out():
    # Prepare
    environ = {"PATH": "/bin", "DFEDRW_CACHE_DIR": "c", "DFEDRW_LISTEN_PORT": "7000", "DFEDRW_TENSORBOARD": "tb", "OMP_NUM_THREADS": "2"}

    # Execute
    out = without_flag_variables(environ)

    # Assert
    assert out == {"PATH": "/bin", "DFEDRW_CACHE_DIR": "c", "OMP_NUM_THREADS": "2"}


@pytest.mark.usefixtures("flag_variables")
def test_a_launchers_clients_and_a_sweeps_runs_get_none_of_them():
    # Execute
    envs = {"clients": client_env(), "runs": _child_env()}

    # Assert
    for env in envs.values():
        assert not set(FLAG_VARIABLES) & set(env)
        assert env["DFEDRW_CACHE_DIR"].endswith("cache")  # other variables pass
    assert envs["clients"]["DFEDRW_PARENT_PID"]


@pytest.mark.usefixtures("flag_variables")
@pytest.mark.parametrize("command", [["run"], ["sweep", "grid.toml"], ["peer"]])
def test_the_tensorboard_flag_of_every_command_defaults_to_the_variable(command, tmp_path):
    # Execute
    args = build_parser(more=add_commands).parse_args(command)
    given = build_parser(more=add_commands).parse_args([*command, "--tensorboard", str(tmp_path / "given")])

    # Assert
    assert args.tensorboard == Path(tmp_path / "dfedrw_tensorboard")
    assert given.tensorboard == tmp_path / "given"


def test_without_the_variable_no_tensorboard_folder(monkeypatch):
    # Prepare
    monkeypatch.delenv("DFEDRW_TENSORBOARD", raising=False)

    # Execute
    args = build_parser(more=add_commands).parse_args(["run"])

    # Assert
    assert args.tensorboard is None
