"""No import cycle between the package's files.

Every import that runs counts: module level and inside functions alike, since a late import inside a
function only hides a cycle until that function is called. Imports under `if TYPE_CHECKING:` are left out
because they never run. `from pkg import name` is an edge to `pkg.name` when that is a module, else to
`pkg`; a package `__init__` importing its own submodules is an edge like any other.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import lossguard

PACKAGE_ROOT = Path(lossguard.__file__).parent
SRC_ROOT = PACKAGE_ROOT.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE_ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: all of them but those in an `if TYPE_CHECKING:` body."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:  # the `else:` of a TYPE_CHECKING test is what runs
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The package's own module that `name` lands in (`lossguard.a.b.c` -> `lossguard.a.b` if c is not one)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _absolute(name, node, is_package)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                owner = _owner(target, modules)
                if owner is not None and owner != name:
                    graph[name].add(owner)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The shortest cycle through each module that is on one, each cycle once, so every file of a tangle
    shows up in some chain."""
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for start in sorted(graph):
        cycle = _shortest_cycle_through(start, graph)
        if cycle and frozenset(cycle) not in seen:
            seen.add(frozenset(cycle))
            found.append(cycle)
    return found


def _shortest_cycle_through(start: str, graph: dict[str, set[str]]) -> list[str]:
    """Breadth first from `start` back to itself; [] when no path returns."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        next_frontier = []
        for node in frontier:
            for successor in sorted(graph[node]):
                if successor == start:
                    return paths[node] + [start]
                if successor not in paths:
                    paths[successor] = paths[node] + [successor]
                    next_frontier.append(successor)
        frontier = next_frontier
    return []


def _file(module: str, modules: dict[str, Path]) -> str:
    return str(modules[module].relative_to(SRC_ROOT))


def test_resolution_reads_from_imports_as_submodules() -> None:
    graph = import_graph()
    # `from lossguard.sources import patterns as P` names a module: the edge goes to it, not to the package
    assert "lossguard.sources.patterns" in graph["lossguard.sources.scan"]
    assert "lossguard.sources" not in graph["lossguard.sources.scan"]
    assert "lossguard.core.records" in graph["lossguard.sources.gather"]  # `from lossguard.core.records import ...`


def test_cycle_finder_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c", "a"]]


def test_importing_the_detector_registry_alone_registers_every_detector() -> None:
    """`registered()` imports nothing: the registry relies on the package `__init__` that Python runs
    before it. A fresh interpreter shows that this alone gives every detector."""
    import lossguard.detectors  # noqa: F401  (the in-process count, every detector module loaded)
    from lossguard.detectors.registry import registered

    script = "from lossguard.detectors.registry import registered; print(len(registered()))"
    fresh = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONPATH": str(SRC_ROOT)})
    assert int(fresh.stdout) == len(registered()) > 10


def test_no_import_cycle_between_files() -> None:
    modules = _modules()
    found = cycles(import_graph())
    chains = [" -> ".join(_file(module, modules) for module in cycle) for cycle in found]
    print("\n".join(chains))
    assert not chains, "import cycles:\n" + "\n".join(chains)
