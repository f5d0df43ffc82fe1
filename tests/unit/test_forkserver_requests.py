"""The fork server's request checks and the command lines that start it early (no process here)."""

from __future__ import annotations

import pytest

from dfedrw.launch.forkserver import _checked, may_fork_clients

GOOD = {"tag": 1, "argv": ["--id", "3"], "env": {"A": "b"}, "log": "/tmp/x.log", "cwd": "/tmp"}


def test_a_well_formed_request_passes():
    _checked(GOOD)
    _checked({**GOOD, "entry": "batched"})


@pytest.mark.parametrize(
    "bad",
    [
        [], "run", {**GOOD, "tag": "1"}, {**GOOD, "argv": "--id 3"}, {**GOOD, "argv": ["--id", 3]},
        {**GOOD, "env": {"A": 1}}, {**GOOD, "env": [["A", "b"]]}, {**GOOD, "log": None}, {k: v for k, v in GOOD.items() if k != "cwd"},
        {**GOOD, "entry": "os.system"}, {**GOOD, "entry": None}, {**GOOD, "entry": ["peer"]},
    ],
)
def test_a_malformed_request_is_refused(bad):
    with pytest.raises(ValueError, match="a request is"):
        _checked(bad)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run"], True),
        (["-v", "run", "s.toml", "--set", "rounds=5"], True),
        (["run", "--start", "fork"], True),
        (["run", "--start", "spawn"], False),
        (["run", "--start=spawn"], False),
        (["run", "--engine", "batched"], False),
        (["run", "--engine=batched"], False),
        (["run", "--set", "engine.name=batched", "--set", "rounds=1"], False),
        (["run", "--set=engine.name = \"batched\""], False),
        (["run", "--set", "engine.name=batched", "--engine", "clients"], True),
        (["run", "--set", "engine.name=clients"], True),
        (["run", "missing.toml"], True),
        (["sweep", "grid.toml"], False),
        (["peer", "--id", "1"], False),
        ([], False),
    ],
)
def test_which_command_lines_start_the_fork_server_early(argv, expected):
    assert may_fork_clients(argv) is expected


@pytest.mark.parametrize(("text", "extra", "expected"), [
    ('[engine]\nname = "batched"\n', [], False),
    ('[engine]\nname = "batched"\n', ["--set", "engine.name=clients"], True),
    ('[engine]\nname = "clients"\n', [], True),
    ("rounds = 3\n", [], True),
    ("not toml [", [], True),
    ("zz = " + "[" * 5000 + "]" * 5000 + "\n", [], True),
])
def test_a_scenario_file_that_names_the_batched_engine_starts_no_fork_server(tmp_path, text, extra, expected):
    scenario = tmp_path / "s.toml"
    scenario.write_text(text)
    assert may_fork_clients(["run", str(scenario), "--out", "x", *extra]) is expected
