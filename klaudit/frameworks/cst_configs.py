"""Framework configuration calls and classes read from LibCST's tree, with LibCST's positions: the
fallback of klaudit.frameworks.calls for code Python's own parser cannot read (newer syntax)."""

from __future__ import annotations

from collections.abc import Collection

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from klaudit.frameworks.settings import ConfigCall, ConfigClass, Setting
from klaudit.lint.syntax import dotted, string_value


def _literal(node: cst.BaseExpression) -> str | None:
    """The value of a literal keyword argument as a string; None for anything computed."""
    if isinstance(node, cst.SimpleString):
        return str(string_value(node))
    if isinstance(node, (cst.Integer, cst.Float)):
        return node.value.replace("_", "")
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return node.value
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = _literal(node.expression)
        return None if inner is None else "-" + inner
    return None


def _field_default(node: cst.BaseExpression) -> str | None:
    """A dataclass field's default: `0.04` or `field(default=0.04, ...)`; None when computed."""
    if isinstance(node, cst.Call) and dotted(node.func).rsplit(".", 1)[-1] == "field":
        default = next((arg.value for arg in node.args if arg.keyword is not None and arg.keyword.value == "default"),
                       None)
        return None if default is None else _literal(default)
    return _literal(node)


class _Reader(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, classes: Collection[str], keys: Collection[str], path: str) -> None:
        self.classes, self.keys, self.path = classes, keys, path
        self.calls: list[ConfigCall] = []
        self.definitions: list[ConfigClass] = []

    def _setting(self, node: cst.CSTNode, value: str | None, name_length: int) -> Setting:
        span = self.get_metadata(PositionProvider, node)
        end = span.end.column + 1 if span.end.line == span.start.line else span.start.column + 1 + name_length
        return Setting(value, span.start.line, span.start.column + 1, end)

    def visit_Call(self, node: cst.Call) -> None:
        name = dotted(node.func).rsplit(".", 1)[-1]
        if name not in self.classes:
            return
        settings = {arg.keyword.value: self._setting(arg, _literal(arg.value), len(arg.keyword.value))
                    for arg in node.args if arg.keyword is not None}
        where = self._setting(node.func, None, len(name))
        if any(arg.star == "**" for arg in node.args):  # any key not named may come from the mapping
            unknown = Setting(None, where.line, where.column, where.column)
            settings = {**{key: unknown for key in self.keys}, **settings}
        self.calls.append(ConfigCall(name, where, settings))

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        bases = tuple(dotted(arg.value).rsplit(".", 1)[-1] for arg in node.bases if arg.keyword is None)
        if node.name.value not in self.classes and not set(bases) & set(self.classes):
            return
        fields: dict[str, Setting] = {}
        for line in node.body.body if isinstance(node.body, cst.IndentedBlock) else ():
            for statement in line.body if isinstance(line, cst.SimpleStatementLine) else ():
                target, value = None, None
                if isinstance(statement, cst.AnnAssign) and statement.value is not None:
                    target, value = statement.target, statement.value
                elif isinstance(statement, cst.Assign) and len(statement.targets) == 1:
                    target, value = statement.targets[0].target, statement.value
                if isinstance(target, cst.Name) and target.value in self.keys and value is not None:
                    fields[target.value] = self._setting(statement, _field_default(value), len(target.value))
        self.definitions.append(ConfigClass(node.name.value, bases, fields, self.path))


def libcst_configs(source: str, names: frozenset[str], keys: tuple[str, ...], path: str,
                   module: cst.Module | None) -> tuple[list[ConfigCall], list[ConfigClass]]:
    """klaudit.frameworks.calls.read_configs's answer, read from LibCST's tree (`module`, if parsed)."""
    reader = _Reader(names, keys, path)
    MetadataWrapper(module or cst.parse_module(source), unsafe_skip_copy=True).visit(reader)
    return reader.calls, reader.definitions
