"""The layering of the packages (pyproject.toml, [tool.importlinter]): what a light module may
import, no import cycles, and the import contracts."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_scenario_plan_imports_neither_torch_nor_grpc():
    code = "import dfedrw.peer.plan, sys; print('torch' in sys.modules, 'grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


PACKAGES = ("dfedrw.peer", "dfedrw.launch", "dfedrw.experiments", "dfedrw.topologies")


def _cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[module] = min(low[module], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycle_between_modules():
    """No module of the four packages imports itself back through others. Imports inside
    functions count, since they run when the function does and tie the modules together just the
    same; so do imports under ``if TYPE_CHECKING:``, since a type named across modules ties them
    as well (the contracts of pyproject.toml count them too)."""
    import grimp

    sys.path.insert(0, str(REPO))
    try:
        graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False, cache_dir=None)
    finally:
        sys.path.remove(str(REPO))
    assert _cycles(graph) == []


def test_import_contracts_hold():
    """The contracts of [tool.importlinter] in pyproject.toml (layers, forbidden imports, no
    cycles between sibling modules), as `lint-imports` checks them."""
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run(
        [str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout
