"""The layering of the packages: the import contracts of pyproject.toml ([tool.importlinter]:
layers, forbidden imports, no cycle between sibling modules) as `lint-imports` checks them,
what a light module may import when it runs, and the import cycles those contracts cannot see."""

import os
import re
import subprocess
import sys
from pathlib import Path

import grimp
import networkx as nx
from importlinter.api import read_configuration

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"


def test_the_scenario_plan_imports_neither_torch_nor_grpc():
    code = "import dfedrw.peer.wiring.plan, sys; print('torch' in sys.modules, 'grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def lint_imports(config: Path) -> subprocess.CompletedProcess:
    """`lint-imports` of this interpreter's environment on ``config``. The environment is
    passed on as it is, so that the packages checked are the ones this test process imports."""
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(lint), "--no-cache", "--no-logo", "--config", str(config)], cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )


def test_import_contracts_hold():
    """Every contract of [tool.importlinter] is checked and kept."""
    contracts = read_configuration(str(PYPROJECT))["contracts_options"]
    out = lint_imports(PYPROJECT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert re.search(rf"Contracts: {len(contracts)} kept, 0 broken\.", out.stdout), out.stdout[-2000:]


def module_graph() -> nx.DiGraph:
    """importer -> imported between the modules of the root packages of [tool.importlinter]
    (packages are modules too: a package's ``__init__``). Imports inside functions count: they
    run when the function does and tie the modules together just the same; so do imports under
    ``if TYPE_CHECKING:``."""
    packages = read_configuration(str(PYPROJECT))["session_options"]["root_packages"]
    imports = grimp.build_graph(*packages, exclude_type_checking_imports=False, cache_dir=None)
    graph = nx.DiGraph()
    graph.add_nodes_from(imports.modules)
    graph.add_edges_from((m, imported) for m in imports.modules for imported in imports.find_modules_directly_imported_by(m))
    return graph


def cycles(graph: nx.DiGraph) -> list[list[str]]:
    """The groups of modules that import each other round in a circle (the strongly connected
    components of more than one module), each sorted."""
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def test_no_import_cycle_between_modules():
    """No module imports itself back through others. The acyclic_siblings contract compares
    the sibling modules of each package; a cycle through a package's ``__init__`` and a module
    below it has no two siblings in it, and is found here. Imports under ``if TYPE_CHECKING:``
    count, as in the contracts: a type named across modules ties them as an import does."""
    assert cycles(module_graph()) == []


def test_no_module_of_the_package_is_longer_than_500_lines():
    """One module, one job: a module past 500 lines holds more than one and is split."""
    packages = [REPO / name for name in ("peer", "engines", "launch", "experiments", "topologies")]
    long = {
        str(path.relative_to(REPO)): n
        for package in packages for path in package.rglob("*.py")
        if "pb" not in path.relative_to(package).parts and (n := len(path.read_text().splitlines())) > 500
    }
    assert long == {}
