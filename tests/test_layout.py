"""The package's shape: no import cycle (imports under ``if TYPE_CHECKING:`` included), no module over 400 lines, and
the pure packages (``asp``, ``local_sgd``) free of Lightning and of the strategy's runtime."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "lightning_hetero"
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, modules: set[str]) -> set[str]:
    """Every module of ``modules`` that ``path`` imports, anywhere in the file (``TYPE_CHECKING`` blocks too)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*kept, base] if base else kept)
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names)
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: imported(path, modules) - {name} for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as the modules along it, or ``None``."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)) is not None:
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_graph_has_no_cycle_even_for_the_type_checker():
    assert find_cycle(import_graph()) is None


def top_level_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


@pytest.mark.parametrize("package", ["asp", "local_sgd"])
def test_the_pure_packages_import_neither_lightning_nor_the_strategy(package):
    graph = import_graph()
    for path in (PACKAGE / package).rglob("*.py"):
        assert "lightning" not in top_level_imports(path), path
        assert not {dep for dep in reached(graph, module_name(path)) if dep.startswith("lightning_hetero.async_ps")}, (
            path
        )


@pytest.mark.parametrize("strategy", ["lightning_hetero.elastic.strategy", "lightning_hetero.elastic.sync_strategy"])
def test_the_elastic_strategies_load_neither_the_parameter_server_nor_async_ps(strategy):
    reach = reached(import_graph(), strategy)
    assert not {name for name in reach if name.startswith(("lightning_hetero.asp", "lightning_hetero.async_ps"))}
    if strategy.endswith(".strategy"):
        assert "lightning_hetero.local_sgd.rounds" in reach


def test_no_module_is_over_400_lines():
    sizes = {module_name(path): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    long = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert long == {}
