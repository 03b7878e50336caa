"""Whether a framework copy's launch module can be imported at all: a launch that fails on import trains nothing,
so its flags are not judged.

Only what can be decided from the copy's own files is read: the module-level imports of the launched module, and
of every module of the copy they reach, in the copy's own package (`openrlhf.trainer.ppo_utils`, relative
imports), not those inside a function, an `if` or a `try` (optional, or guarded). A module of that chain that
Python rejects (the KL000 of `klaudit lint`), or a name imported from a module of the copy that neither defines
it nor holds a submodule of that name, stops the import; but not a name imported beside two or more of the
package's modules and nothing else, a module left out of the commit (`_left_out_module`).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from klaudit.text import read_text


@functools.lru_cache(maxsize=64)  # asked for each launch script of a project
def import_failure(copy: Path, module: str) -> str | None:
    """Why the module file `module` (`openrlhf/cli/train_ppo_ray.py`) of the framework copy at `copy` cannot be
    imported: the first module of its import chain Python rejects, or a name imported that the copy does not
    define; None where nothing stops it."""
    package = module.split("/")[0]
    pending = [*_packages_above(copy, Path(module)), copy / module]
    seen: set[Path] = set()
    while pending:
        file = pending.pop(0)
        if file in seen or not file.is_file():
            continue
        seen.add(file)
        tree = _parsed(file)
        if isinstance(tree, str):
            return f"{file.relative_to(copy).as_posix()}:{tree}"
        for statement in tree.body if tree is not None else ():  # None: syntax of a newer Python, undecided
            reached = _imported(copy, file, statement, package)
            if isinstance(reached, str):
                return reached
            pending += reached
    return None


def _imported(copy: Path, file: Path, statement: ast.stmt, package: str) -> list[Path] | str:
    """The module files of the copy that a module-level import of `file` runs, or why it fails."""
    if isinstance(statement, ast.Import):
        return [module for alias in statement.names if alias.name.split(".")[0] == package
                for module in _chain(copy, Path(*alias.name.split(".")))]
    if not isinstance(statement, ast.ImportFrom):
        return []
    if statement.level:
        base = file.relative_to(copy).parent
        for _ in range(statement.level - 1):
            base = base.parent
        target = base.joinpath(*statement.module.split(".")) if statement.module else base
    elif statement.module and statement.module.split(".")[0] == package:
        target = Path(*statement.module.split("."))
    else:
        return []
    modules = _chain(copy, target)
    source = _module_file(copy, target)
    if source is None:
        return modules
    tree = _parsed(source)
    tree = tree if isinstance(tree, ast.Module) else None  # a module that does not compile fails where it is run
    for alias in statement.names:
        if alias.name == "*":
            continue  # binds what the module has: nothing to miss
        submodule = _module_file(copy, target / alias.name)
        if submodule is not None:
            modules += [submodule]
        elif tree is not None and not _defines(tree, alias.name) and not _left_out_module(copy, target, tree, statement):
            where = file.relative_to(copy).as_posix()
            return (f"{where}:{statement.lineno} imports {alias.name} from {'.'.join(target.parts)}, which does not "
                    f"define it")
    return modules


def _left_out_module(copy: Path, target: Path, tree: ast.Module, statement: ast.ImportFrom) -> bool:
    """Whether a name the package `target` does not define is one of its modules left out of the commit: the statement
    imports at least two of its modules and, besides, only names it does not define (Reasoning-Table's `from
    verl.utils.reward_score import wikisql, wikitq, ..., gsm8k`, without gsm8k.py). The author's checkout holds
    it, so a launch of the project's own runs there."""
    modules = [_module_file(copy, target / alias.name) is not None for alias in statement.names]
    return (copy / target / "__init__.py").is_file() and sum(modules) >= 2 and not any(
        _defines(tree, alias.name) for alias, module in zip(statement.names, modules) if not module)


def _chain(copy: Path, target: Path) -> list[Path]:
    """The files importing the module `target` runs: each package's `__init__.py` above it, then its own."""
    found = _module_file(copy, target)
    return [*_packages_above(copy, target), *([found] if found is not None else [])]


def _packages_above(copy: Path, target: Path) -> list[Path]:
    return [copy / parent / "__init__.py" for parent in reversed(target.parents) if parent.parts]


def _module_file(copy: Path, target: Path) -> Path | None:
    """`target.py` or `target/__init__.py` under the copy, where one is."""
    for candidate in (copy / target.with_suffix(".py"), copy / target / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=1024)
def _parsed(file: Path) -> ast.Module | str | None:
    """The module's syntax tree; where Python rejects it (as `klaudit lint`'s KL000 does), the line and why; None
    where it cannot be read or holds syntax of a newer Python."""
    source = read_text(file)
    if source is None:
        return None
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        from klaudit.lint.parsing import syntax_finding  # here: klaudit.config imports this package

        refused = syntax_finding(str(file), source)
        return f"{refused.line} does not compile ({refused.message})" if refused is not None else None


def _defines(tree: ast.Module, name: str) -> bool:
    """Whether a module binds `name` at module level (in any block of it, not in a function), or may bind any name
    (`from x import *`, a module `__getattr__`)."""
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        statement = pending.pop()
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if statement.name in (name, "__getattr__"):
                return True
            continue
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            for alias in statement.names:
                if alias.name == "*" or (alias.asname or alias.name.split(".")[0]) == name:
                    return True
            continue
        bound = {node.id for node in ast.walk(statement) if isinstance(node, ast.Name)
                 and isinstance(node.ctx, ast.Store)}
        if name in bound:
            return True
        for field in ("body", "orelse", "finalbody", "handlers"):
            for inner in getattr(statement, field, []) or []:
                pending += inner.body if isinstance(inner, ast.ExceptHandler) else [inner]
    return False
