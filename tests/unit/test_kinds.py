"""The one table of extension kinds (peer/kinds/table.py): every registry of the package is in it, and
the places that list the kinds read it."""

import importlib
import pkgutil
from pathlib import Path

from dfedrw.peer.kinds.table import KINDS, by_name
from dfedrw.peer.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dfedrw.peer", "dfedrw.topologies", "dfedrw.launch", "dfedrw.experiments")


def _registries_of_the_package() -> dict[int, tuple[str, Registry]]:
    """Every Registry a module of the package holds at its top level, imported module by module."""
    found: dict[int, tuple[str, Registry]] = {}
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if info.name.rpartition(".")[2] == "__main__":
                continue
            module = importlib.import_module(info.name)
            for attribute, value in vars(module).items():
                if isinstance(value, Registry):
                    found.setdefault(id(value), (f"{info.name}.{attribute}", value))
    return found


def test_every_registry_of_the_package_is_a_kind_of_the_table():
    # Prepare
    declared = {id(k.registry) for k in KINDS}

    # Execute
    found = _registries_of_the_package()

    # Assert
    missing = sorted(where for key, (where, _) in found.items() if key not in declared)
    assert not missing, f"registries not declared in peer/kinds/table.py: {missing}"
    assert declared <= set(found)


def test_the_walk_finds_a_registry_the_table_lacks(monkeypatch):
    # Prepare: a module of the package holding a registry of a kind nobody declared
    from dfedrw.peer.learning import models
    stray = Registry("widget", "dfedrw.widgets")
    monkeypatch.setattr(models, "WIDGET_REGISTRY", stray, raising=False)

    # Execute
    found = _registries_of_the_package()

    # Assert
    assert found[id(stray)][0] == "dfedrw.peer.learning.models.WIDGET_REGISTRY"
    assert id(stray) not in {id(k.registry) for k in KINDS}


def test_each_kind_names_its_registry_and_a_field_of_its_section():
    from dataclasses import fields

    from dfedrw.peer.config.scenario import _SECTIONS

    for kind in KINDS:
        assert kind.registry.kind == kind.name
        section_fields = {f.name for f in fields(_SECTIONS[kind.section])}
        assert {kind.key, kind.field} <= section_fields, kind
    assert len({k.plural for k in KINDS}) == len(KINDS) == len(by_name)


def test_the_places_that_list_the_kinds_read_the_table():
    # Prepare
    from dfedrw.launch.cli import build_parser
    from dfedrw.peer.kinds.catalog import REGISTRIES, SETTINGS_TABLE
    from dfedrw.peer.config.tables import KIND_REGISTRY, table_path

    parser = build_parser()
    listing = next(a for a in parser._subparsers._group_actions[0].choices["list"]._actions if a.dest == "kind")
    page = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")

    # Assert
    assert list(listing.choices) == [k.plural for k in KINDS]
    assert list(REGISTRIES) == list(SETTINGS_TABLE) == [k.plural for k in KINDS]
    assert {n: r for n, r in KIND_REGISTRY.items()} == {k.name: k.registry for k in KINDS}
    assert table_path("peers.2.aggregation", "crs", "softmax") == "peers.2.aggregation.crs_params.softmax"
    assert table_path("data", "dataset", "mylab:Faces") == 'data."mylab:Faces"'
    assert SETTINGS_TABLE["schedules"].format(name="NAME") == "topology.schedule_params.NAME"
    for kind in KINDS:
        assert f"## {kind.title}\n" in page
        assert page.index(f"## {kind.title}\n") < page.index(f"<!-- registry:{kind.plural} -->")
