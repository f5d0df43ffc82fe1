import os

import pytest

from dfedrw.peer.config import load_scenario
from dfedrw.peer.datacache import CACHE_ENV


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
def small_scenario():
    """A fast scenario on digits: callers add overrides."""

    def make(*overrides: str):
        return load_scenario(None, ["rounds=20", "eval.every=0", "network.round_timeout=5", *overrides])

    return make
