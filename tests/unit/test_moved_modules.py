"""Modules that moved to another room stay importable by their old names, with a warning, as the
very module under its new name (a registry in one exists once)."""

import importlib
import sys
import warnings

import pytest

from dfedrw.peer.moved import MOVED_MODULES


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_a_moved_module_imports_by_its_old_name_with_a_warning_as_the_same_module(old):
    # Arrange: forget the old name, should an earlier import have bound it
    sys.modules.pop(old, None)
    new = importlib.import_module(MOVED_MODULES[old])

    # Act
    with pytest.warns(DeprecationWarning, match=f"module {old} moved to {MOVED_MODULES[old]}; import it from there"):
        module = importlib.import_module(old)

    # Assert
    assert module is new
    assert module.__name__ == MOVED_MODULES[old]
    assert module.__spec__.name == MOVED_MODULES[old]


def test_a_moved_packages_submodules_follow_it_and_are_loaded_once():
    from dfedrw.peer.learning.datasets import registry

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("dfedrw.peer.datasets.registry")

    assert old is registry
    assert old.DATASET_REGISTRY is registry.DATASET_REGISTRY


def test_a_module_that_never_existed_is_still_missing():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dfedrw.peer.no_such_module")
