import pytest

from dfedrw.peer.config import load_scenario


@pytest.fixture
def small_scenario():
    """A fast scenario on digits: callers add overrides."""

    def make(*overrides: str):
        return load_scenario(None, ["rounds=20", "eval.every=0", "network.round_timeout=5", *overrides])

    return make
