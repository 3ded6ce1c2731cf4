"""The house's rules, checked on the source: no import cycles, no import of a higher wing, no
file over 400 lines.

Imports are read with `ast`, not by importing, so a module-level, a function-level and a
`TYPE_CHECKING` import all count: each is a dependency a reader has to follow. `from pkg import
name` counts as importing the submodule `pkg.name` when there is one, and as importing the
package (its `__init__`) otherwise. Each test lists every violation at once.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400

PACKAGES = ("optimizers", "reference_model", "profiler", "reports", "app")
"""Lowest first: a package may import its own modules or a lower package's, never a higher one's."""

PROFILER_WINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("profiler", "profiler.settings", "profiler.store", "profiler.metrics", "profiler.plugins",
                "profiler.text", "profiler.config")),
    ("instruments", ("profiler.instruments",)),
    ("traces", ("profiler.traces",)),
    ("analysis", ("profiler.analysis",)),
    ("advice", ("profiler.advice",)),
    ("compare", ("profiler.compare",)),
    ("capture", ("profiler.capture",)),
    ("experiments", ("profiler.experiments",)),
    ("top", ("profiler.cli", "profiler.api", "profiler.run", "profiler.integrations")),
)
"""The wings of `profiler`, lowest first. A prefix names a module and, for a package, everything
inside it; `profiler` alone is the package's `__init__`. The top may import anything."""


def module_files(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Every module of `packages` by dotted name (a package's `__init__.py` by the package's)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
              known: set[str]) -> set[str]:
    """The modules of `known` that one import statement in `module` imports."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    if node.level:
        # Relative: level 1 is the module's own package (the module itself for an __init__).
        base = module.split(".")
        drop = node.level - 1 if is_package else node.level
        base = base[:len(base) - drop] if drop else base
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    found = set()
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        found.add(sub if sub in known else source)
    return found & known


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of `modules` it imports anywhere in its file."""
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(node, name, is_package, known)
        graph[name] = edges - {name}
    return graph


def _strong_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _shortest_cycle(graph: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    """The shortest path start -> ... -> start inside one component (breadth first)."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & within):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if w not in parents:
                    parents[w] = v
                    following.append(w)
        frontier = following
    return [start]


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """One line per import cycle: a shortest loop through it, and all its modules when there are more."""
    lines = []
    for component in _strong_components(graph):
        loop = _shortest_cycle(graph, component[0], set(component))
        line = " -> ".join(loop)
        if len(component) > len(loop) - 1:
            line += f"  (the cycle's {len(component)} modules: {', '.join(component)})"
        lines.append(line)
    return lines


def _rank(module: str) -> tuple[int, int]:
    """(package, wing) position, lowest first; wing -1 outside profiler or for an unplaced module."""
    package = PACKAGES.index(module.split(".")[0])
    if package != PACKAGES.index("profiler"):
        return package, 0
    for wing, (_, prefixes) in enumerate(PROFILER_WINGS):
        for prefix in prefixes:
            if module == prefix or (prefix != "profiler" and module.startswith(prefix + ".")):
                return package, wing
    return package, -1


def _place(module: str) -> str:
    package, wing = _rank(module)
    return PROFILER_WINGS[wing][0] if PACKAGES[package] == "profiler" else PACKAGES[package]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """One line per import of a higher package or wing, and per profiler module in no wing."""
    lines = [f"{m} is in no wing of profiler: add it to PROFILER_WINGS"
             for m in sorted(graph) if _rank(m)[1] == -1]
    for module in sorted(graph):
        for target in sorted(graph[module]):
            if -1 not in (_rank(module)[1], _rank(target)[1]) and _rank(target) > _rank(module):
                lines.append(f"{module} ({_place(module)}) imports {target} ({_place(target)})")
    return lines


def long_files(modules: dict[str, Path]) -> list[str]:
    lines = []
    for path in sorted(modules.values()):
        count = len(path.read_text().splitlines())
        if count > MAX_LINES:
            lines.append(f"{path.relative_to(ROOT)}: {count} lines")
    return lines


def _fail_listing(what: str, found: list[str]) -> None:
    assert not found, f"{len(found)} {what}:\n  " + "\n  ".join(found)


def test_no_import_cycles() -> None:
    _fail_listing("import cycles", cycles(import_graph(module_files())))


def test_no_import_of_a_higher_wing() -> None:
    _fail_listing(f"imports of a higher package or wing (order: {' < '.join(PACKAGES)}; in profiler: "
                  f"{' < '.join(w for w, _ in PROFILER_WINGS)})",
                  upward_imports(import_graph(module_files())))


def test_no_file_over_400_lines() -> None:
    _fail_listing(f"files over {MAX_LINES} lines", long_files(module_files()))
