"""The module a fix rewrites: positions, source lines and blocks of its statements, the roles the
flow analysis recorded at each (klaudit.lint.evidence), and the import every fix adds.

`Refused` says why no mechanical fix is offered; the parts of klaudit.lint.autofix.Builder raise it
wherever what a fix needs is not known, or not known uniquely.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable

import libcst as cst

from klaudit.lint.edits import Edit
from klaudit.lint.evidence import StatementRoles, evidence_of
from klaudit.lint.syntax import python_ast

IMPORT = "import klaudit.estimators"


class Refused(Exception):
    """No mechanical fix here: the message says why."""


class FixSite:
    """A module being fixed, and the site (entry statement, origins of its KL term) being fixed in it."""

    def __init__(self, path: str, module: cst.Module, source: str, analyzer,
                 position_of: Callable[[cst.CSTNode], tuple | None]) -> None:
        self.path = path
        self.module = module
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.evidence = evidence_of(analyzer)
        self.position_of = position_of
        self._tree: ast.Module | None = None
        self._site: tuple = (None, set())  # (the entry statement, the ids of its KL term's origins)

    def _roles(self, statement: cst.CSTNode) -> StatementRoles:
        roles = self.evidence.of(statement)
        if roles is None:
            raise Refused("the analysis recorded no roles for this statement")
        return roles

    def _code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node).strip()

    def _line(self, statement: cst.CSTNode, end: bool = False) -> int:
        where = self.position_of(statement)
        if where is None:
            raise Refused("the statement's position is unknown")
        return where[2] if end else where[0]

    def _replace_statement(self, statement: cst.CSTNode, new: cst.CSTNode) -> Edit:
        where = self.position_of(statement)
        if where is None:
            raise Refused("the statement's position is unknown")
        line, column, end_line, end_column = where
        content = self.module.code_for_node(new)
        if isinstance(new, (cst.Assign, cst.AugAssign, cst.Return, cst.Expr)) and not isinstance(
                new.semicolon, cst.MaybeSentinel):
            content = content.rstrip().removesuffix(";").rstrip()
        return Edit(line, self._char_column(line, column), end_line, self._char_column(end_line, end_column), content)

    def _char_column(self, line: int, byte_column: int) -> int:
        """A 1-based column in characters, from the 1-based byte column Python's parser gives."""
        text = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        return len(text.encode("utf-8")[: byte_column - 1].decode("utf-8", errors="ignore")) + 1

    def _import_edit(self) -> list[Edit]:
        """`import klaudit.estimators`, once: after the module's leading imports (or its docstring)."""
        tree = self._ast()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(alias.name == "klaudit.estimators" and alias.asname is None
                                                    for alias in node.names):
                return []
        after = 0
        for index, node in enumerate(tree.body):
            is_docstring = index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and \
                isinstance(node.value.value, str)
            if is_docstring or isinstance(node, (ast.Import, ast.ImportFrom)):
                after = node.end_lineno or node.lineno
            else:
                break
        line = after + 1
        while after == 0 and line - 1 < len(self.lines) and self.lines[line - 1].startswith("#"):
            line += 1  # after a shebang and an encoding declaration, which must stay first
        if line - 1 >= len(self.lines):
            prefix = "" if not self.lines or self.lines[-1].endswith("\n") else "\n"
            return [Edit(line, 1, line, 1, prefix + IMPORT + "\n")] if prefix else [Edit(line, 1, line, 1, IMPORT + "\n")]
        return [Edit(line, 1, line, 1, IMPORT + "\n")]

    def _block(self, line: int) -> ast.AST | None:
        """The innermost compound statement (function, branch, loop, with, try) around `line`."""
        around = [node for node in ast.walk(self._ast()) if isinstance(node, _COMPOUND)
                  and node.lineno < line <= (node.end_lineno or 0)]
        return max(around, key=lambda node: node.lineno, default=None)

    def _function_of(self, line: int) -> ast.AST | None:
        """The innermost function that holds `line`."""
        around = [node for node in ast.walk(self._ast()) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.lineno <= line <= (node.end_lineno or 0)]
        return max(around, key=lambda node: node.lineno, default=None)

    def _loops(self, line: int) -> list:
        """The loops of the innermost function around `line`, whose bodies hold it."""
        function = self._function_of(line)
        return [node for node in ast.walk(function or self._ast()) if isinstance(node, (ast.For, ast.AsyncFor, ast.While))
                and node.lineno < line <= (node.end_lineno or 0)]

    def _function_end(self, line: int) -> int:
        """The last line of the innermost function that holds `line`."""
        ends = [node.end_lineno or node.lineno for node in ast.walk(self._ast())
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or 0)]
        if not ends:
            raise Refused("the statement is not inside a function")
        return min(ends)

    def _ast(self) -> ast.Module:
        if self._tree is None:
            try:
                self._tree = python_ast(self.source)  # shared with the syntax check
            except (SyntaxError, ValueError, RecursionError) as error:  # newer syntax that only LibCST reads
                raise Refused(f"this Python ({sys.version_info.major}.{sys.version_info.minor}) cannot parse "
                              f"the file to check an edit of it") from error
        return self._tree


_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.If, ast.For, ast.AsyncFor, ast.While, ast.With,
             ast.AsyncWith, ast.Try, ast.Match, ast.ClassDef) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())


def statement_value(statement: cst.CSTNode) -> cst.BaseExpression:
    if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
        return statement.value
    if isinstance(statement, cst.AugAssign) and isinstance(statement.operator, (cst.AddAssign, cst.SubtractAssign)):
        return statement.value
    if isinstance(statement, cst.AnnAssign) and statement.value is not None:
        return statement.value
    if isinstance(statement, cst.Return) and statement.value is not None:
        return statement.value
    raise Refused("klaudit rewrites assignments and returns only")

