"""Whether a project's calls of a settings class give one of its fields a value that may exceed 1.

A count a trainer reads as a setting (`self.args.num_iterations`) is settled at the default its class gives it
(`num_iterations: int = field(default=1)`) only where no run sets it otherwise. A YAML file is one way to set it; a
call of the class with the field as a keyword is another (eth-lre/PedagogicalRL's
`ClassroomGRPOConfig(num_iterations=cfg.train.mu)`, with `mu: 2` in its Hydra configuration): each generation then
feeds two optimizer steps, and the second trains on an older policy's samples.

Read with Python's own parser from each file whose text names one of the classes, never importing it. A value
counts unless it is the literal 0 or 1, or reads an option or YAML key the project gives as 0 or 1
(`num_epochs=args.epochs` of `--epochs` defaulting to 1); a parameter handed on under a name (`num_epochs=num_epochs`)
counts with the default of the enclosing function's parameter, and as more than 1 where it has none.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator

from klaudit.frameworks.kwargs_dicts import last_name
from klaudit.frameworks.options import Options, resolve
from klaudit.lint.project import Project, python_files
from klaudit.lint.syntax import python_ast

_AT_MOST_ONE = ("0", "1")


def passed_in_project(project: Project, name: str, classes: Collection[str]) -> bool:
    """Whether some Python file of `project` calls one of `classes` with the field `name` as a keyword whose value
    may be more than 1 (`passes_field`), read once per field and classes."""
    key = ("field passed", name, frozenset(classes))
    return bool(classes) and project.remembered(key, lambda: any(
        passes_field(text, name, classes, project.options, path)
        for path in python_files(project)
        if (text := project.raw_text(path)) and name in text and any(c in text for c in classes)))


def passes_field(text: str, name: str, classes: Collection[str], options: Options | None = None,
                 path: str = "") -> bool:
    """Whether the module `text` (the file at `path`) calls one of `classes` (`Config(...)`, `settings.Config(...)`)
    with `name=` given a value that may be more than 1. A module Python rejects passes nothing."""
    try:
        tree = python_ast(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    for value in _given(tree, text, name, set(classes)):
        if value is None:
            return True
        if value in _AT_MOST_ONE:
            continue
        resolved = resolve(value, {}, options, path) if options is not None else None
        if resolved is None or resolved.value not in _AT_MOST_ONE:
            return True
    return False


def _given(tree: ast.Module, text: str, name: str, classes: set[str]) -> Iterator[str | None]:
    """The text of each value the calls of `classes` give `name`; a parameter handed on under a name gives its
    default in the enclosing function (None where it has none)."""
    def visit(node: ast.AST, defaults: dict[str, str | None]) -> Iterator[str | None]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defaults = {**defaults, **_parameter_defaults(node, text)}
        if isinstance(node, ast.Call) and last_name(node.func) in classes:
            for keyword in node.keywords:
                if keyword.arg == name:
                    value = keyword.value
                    if isinstance(value, ast.Name) and value.id in defaults:
                        yield defaults[value.id]
                    else:
                        yield ast.get_source_segment(text, value)
        for child in ast.iter_child_nodes(node):
            yield from visit(child, defaults)

    return visit(tree, {})


def _parameter_defaults(func: ast.FunctionDef | ast.AsyncFunctionDef, text: str) -> dict[str, str | None]:
    """Each parameter of `func` with the text of its default (None where it has none)."""
    positional = [*func.args.posonlyargs, *func.args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(func.args.defaults)) + list(func.args.defaults)
    pairs = [*zip(positional, defaults), *zip(func.args.kwonlyargs, func.args.kw_defaults)]
    return {arg.arg: ast.get_source_segment(text, default) if default is not None else None for arg, default in pairs}

