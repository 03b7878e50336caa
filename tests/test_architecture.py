"""The package's module graph: no import cycle (lazy imports inside functions count), and the lint
wing never reaches the audit wing, which needs torch; and no class longer than a reader can hold."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "klaudit"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` blocks: imports for annotations, never run."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skipped


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _type_checking_only(tree)
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("klaudit"):
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    targets.add(submodule if submodule in modules else node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name in modules)
        graph[name] = targets - {name}
    return graph


def test_there_is_no_import_cycle():
    try:
        tuple(TopologicalSorter(import_graph()).static_order())
    except CycleError as error:
        raise AssertionError(f"import cycle: {' -> '.join(error.args[1])}") from None


def test_the_cycle_check_sees_lazy_imports():
    graph = import_graph()
    assert "klaudit.audit.runner" in graph["klaudit.cli"]  # imported inside the check-grad command only


def test_the_lint_never_reaches_the_audit_wing():
    graph = import_graph()
    reached, todo = set(), ["klaudit.lint.engine", "klaudit.lint.checks"]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(graph.get(name, ()))
    assert not {name for name in reached if name.startswith("klaudit.audit")}


MAX_CLASS_LINES = 250  # a class a reader can hold (issue 10): a larger one is split into parts with one job each


def test_no_class_is_longer_than_a_reader_can_hold():
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_CLASS_LINES:
                long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    assert not long, long
