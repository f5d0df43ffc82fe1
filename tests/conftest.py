import os
import sys

import pytest

from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.learning.datacache import CACHE_ENV, clear_stored
from tests.support.sweeps import FAKE_RUN


@pytest.fixture(scope="session", autouse=True)
def _data_cache(tmp_path_factory):
    """The data cache of this test session (client processes inherit it): tests never write
    into the user's cache folder."""
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("data-cache"))
    yield
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A data cache of the test's own (``tmp_path / "cache"``, returned), empty, and forgotten by
    this process before and after the test, as by a new process."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    clear_stored()
    yield tmp_path / "cache"
    clear_stored()


@pytest.fixture
def small_scenario():
    """A fast scenario on digits: callers add overrides."""

    def make(*overrides: str):
        return load_scenario(None, ["rounds=20", "eval.every=0", "network.round_timeout=5", *overrides])

    return make


@pytest.fixture
def fake_run(tmp_path, monkeypatch):
    """The sweep's child processes replaced by a stand-in script (tests.support.sweeps.FAKE_RUN);
    returns a function listing the run folders it was called for."""
    from dfedrw.experiments import sweep

    script = tmp_path / "fake_run.py"
    script.write_text(FAKE_RUN)
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    monkeypatch.setattr(sweep, "child_command", lambda request, folder: [sys.executable, str(script), str(request), str(folder)])
    monkeypatch.setattr(
        sweep, "batch_command",
        lambda runs: [sys.executable, str(script), *(str(x) for r in runs for x in (r.folder / sweep.REQUEST_FILE, r.folder))],
    )
    # Batches as subprocesses running the stand-in, not forked from a server of the real engine.
    monkeypatch.setattr(sweep, "batch_server", lambda env: None)
    return lambda: calls.read_text().split()


def pytest_collection_modifyitems(config, items):
    """Every test of tests/multiprocess/ and tests/e2e/ starts real client processes (or jobs,
    or namespaces): it must carry the ``slow`` marker, so that the default selection starts
    none. A test there without it fails the collection, naming it."""
    unmarked = [
        item.nodeid for item in items
        if item.nodeid.startswith(("tests/multiprocess/", "tests/e2e/")) and item.get_closest_marker("slow") is None
    ]
    if unmarked:
        raise pytest.UsageError(f"tests that start processes must be marked slow: {', '.join(unmarked)}")
