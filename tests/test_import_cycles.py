"""No import cycle in optimizers/ or reference_model/, counting imports inside functions and under
TYPE_CHECKING: the catalog imports the switches, and no switch imports it back."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("optimizers", "reference_model")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """First-party modules `path` imports anywhere in it (`from pkg import module` names the module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                out.add(submodule if submodule in modules else node.module)
    return out & modules.keys()


def test_no_import_cycle_counting_function_level_and_type_checking_imports() -> None:
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as error:
        raise AssertionError(f"import cycle: {' -> '.join(error.args[1])}") from None
    assert not [name for name, imported in graph.items() if "optimizers.catalog" in imported
                and name.startswith("optimizers.") and name != "optimizers"]
