"""Functions as values: closures, `functools.partial`, dispatch tables, callable objects.

A `Callee` is what a name holds when it holds a function of the linted tree: the function, the
module and class it belongs to, the enclosing variables a nested function reads (its closure),
and the arguments `functools.partial` bound ahead of the call. The flow analysis interprets a call
of a callee like a call of the function by name, with the bound arguments first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import libcst as cst


@dataclass(frozen=True)
class Callee:
    """A function of the linted tree held as a value."""

    module: Any  # klaudit.lint.modules.Module
    func: cst.FunctionDef
    cls: Optional[str] = None
    closure: tuple = ()  # ((enclosing variable, facts), ...), sorted by name
    bound: tuple = ()  # facts of the positional arguments bound by functools.partial
    bound_keywords: tuple = ()  # ((parameter, facts), ...) bound by functools.partial


_FREE_NAMES: dict = {}


def free_names(func: cst.FunctionDef) -> frozenset:
    """The names a function's body mentions (a superset of the enclosing variables it reads)."""
    key = id(func)
    if key not in _FREE_NAMES:
        found: set = set()

        class Names(cst.CSTVisitor):
            def visit_Name(self, node: cst.Name) -> None:
                found.add(node.value)

        func.body.visit(Names())
        for param in (*func.params.posonly_params, *func.params.params, *func.params.kwonly_params):
            if param.default is not None:
                param.default.visit(Names())
        _FREE_NAMES[key] = (func, frozenset(found))  # the node is kept so that its id stays its own
    return _FREE_NAMES[key][1]


def closure_of(func: cst.FunctionDef, env: dict) -> tuple:
    """The enclosing variables (and `x.attr` paths under them) that `func` may read, with their facts."""
    names = free_names(func)
    return tuple(sorted((key, value) for key, value in env.items() if key.split(".")[0] in names))
