"""`dfedrw run` and `dfedrw sweep` set their own SIGINT/SIGTERM handling, whatever they inherit."""

import signal
from types import SimpleNamespace

import pytest

from dfedrw.experiments import cli


@pytest.fixture
def sigint_ignored():
    saved = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    # As a background job of a non-interactive shell starts.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGINT, saved[0])
    signal.signal(signal.SIGTERM, saved[1])


def _handlers_when_called(monkeypatch, module, name, result):
    seen = {}

    def fake(*args, **kwargs):
        seen["int"] = signal.getsignal(signal.SIGINT)
        seen["term"] = signal.getsignal(signal.SIGTERM)
        return result

    monkeypatch.setattr(module, name, fake)
    return seen


def _assert_both_interrupt(seen):
    assert seen["int"] is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        seen["term"](signal.SIGTERM, None)


def test_run_installs_handlers_before_starting_clients(sigint_ignored, monkeypatch, tmp_path):
    import dfedrw.launch.local
    from dfedrw import launch
    import dfedrw.launch.runner
    from dfedrw import launch
    summary = {"interrupted": True}
    seen = _handlers_when_called(monkeypatch, launch.runner, "run_scenario", (tmp_path, summary))
    monkeypatch.setattr(launch.local, "print_summary", lambda *a: None)
    assert cli.main(["run", "--set", "rounds=1"]) == 130
    _assert_both_interrupt(seen)


def test_sweep_installs_handlers_before_starting_runs(sigint_ignored, monkeypatch, tmp_path):
    import dfedrw.experiments.sweep
    from dfedrw import experiments
    seen = _handlers_when_called(monkeypatch, experiments.sweep, "run_sweep", SimpleNamespace(exit_code=0))
    assert cli.main(["sweep", str(tmp_path / "grid.toml"), "--dry-run"]) == 0
    _assert_both_interrupt(seen)
