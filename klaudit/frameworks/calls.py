"""Framework configuration objects built in Python (`GRPOConfig(beta=0.04, ...)`, or a class deriving
from it with `beta: float = 0.04`): their keywords and field defaults as settings, with the position of
each, read from the module's syntax tree (the code is never run).

They are read from Python's own tree (`ast`, already parsed for the syntax check): LibCST's
positions would regenerate the whole module's code, which costs more than parsing it (half the lint
of TRL's grpo_trainer.py). LibCST's tree is read only where Python cannot read the text (newer syntax)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from klaudit.frameworks.settings import Setting
from klaudit.lint.syntax import dotted, python_ast, string_value


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


@dataclass(frozen=True)
class ConfigCall:
    """One call of a configuration class: its name, where it is, and its keywords."""

    name: str
    where: Setting  # the called name's position (value unused)
    settings: Mapping[str, Setting]


@dataclass(frozen=True)
class ConfigClass:
    """A class deriving from a configuration class: its bases and the defaults its fields give."""

    name: str
    bases: tuple[str, ...]
    fields: Mapping[str, Setting]  # the keys given a default in the class body
    path: str


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


def read_configs(source: str, class_names: Iterable[str], keys: Iterable[str], path: str = "",
                 module: cst.Module | None = None) -> tuple[list[ConfigCall], list[ConfigClass]]:
    """The calls of the classes named in `class_names` and the classes deriving from them (or
    redefining them) in `source` (`module`: its LibCST tree, if already parsed). After `**kwargs` every
    key of `keys` not given by name is unknown (a Setting with value None)."""
    names, keys = frozenset(class_names), tuple(keys)
    found = _python_configs(source, names, keys, path)
    if found is not None:
        return found
    reader = _Reader(names, keys, path)
    MetadataWrapper(module or cst.parse_module(source), unsafe_skip_copy=True).visit(reader)
    return reader.calls, reader.definitions


_NEWLINE = re.compile(r"\r\n?|\n")  # line ends as Python's tokenizer and LibCST count them


def _python_configs(source: str, names: Collection[str], keys: tuple[str, ...],
                    path: str) -> tuple[list[ConfigCall], list[ConfigClass]] | None:
    """What `_Reader` finds, read from Python's tree of `source`; None when Python cannot read it.
    Python counts columns in UTF-8 bytes and normalises identifiers (NFKC), LibCST counts characters
    and keeps the text: both are converted to LibCST's terms."""
    try:
        tree = python_ast(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    lines = [line.encode("utf-8") for line in _NEWLINE.split(source)]

    def column(line: int, offset: int) -> int:  # 1-based, in characters
        return len(lines[line - 1][:offset].decode("utf-8", errors="replace")) + 1

    def text(node: ast.expr) -> str:  # as written
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        if first == last:
            return lines[first][node.col_offset:node.end_col_offset].decode("utf-8", errors="replace")
        parts = [lines[first][node.col_offset:], *lines[first + 1:last], lines[last][:node.end_col_offset]]
        return "\n".join(part.decode("utf-8", errors="replace") for part in parts)

    def setting(node: ast.expr | ast.stmt | ast.keyword, value: str | None, name_length: int) -> Setting:
        start = column(node.lineno, node.col_offset)
        end = (column(node.lineno, node.end_col_offset or 0) if node.end_lineno == node.lineno
               else start + name_length)
        return Setting(value, node.lineno, start, end)

    calls, definitions = [], []  # definitions: ((line, column), class)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _called_name(node.func, names, text)
            if name is None:
                continue
            settings = {keyword.arg: setting(keyword, _python_literal(keyword.value, text), len(keyword.arg))
                        for keyword in node.keywords if keyword.arg is not None}
            where = setting(node.func, None, len(name))
            if any(keyword.arg is None for keyword in node.keywords):  # any key not named may come from the mapping
                unknown = Setting(None, where.line, where.column, where.column)
                settings = {**{key: unknown for key in keys}, **settings}
            calls.append(ConfigCall(name, where, settings))
        elif isinstance(node, ast.ClassDef):
            bases = tuple(_last_name(base) for base in node.bases)
            if node.name not in names and not set(bases) & set(names):
                continue
            fields: dict[str, Setting] = {}
            for statement in node.body:
                target, value = _assigned(statement)
                if isinstance(target, ast.Name) and target.id in keys and value is not None:
                    fields[target.id] = setting(statement, _python_default(value, text), len(target.id))
            definitions.append(((node.lineno, node.col_offset), ConfigClass(node.name, bases, fields, path)))
    # in the order of the source, as LibCST visits them
    return (sorted(calls, key=lambda call: (call.where.line, call.where.column)),
            [definition for _, definition in sorted(definitions, key=lambda pair: pair[0])])


def _assigned(statement: ast.stmt) -> tuple[ast.expr | None, ast.expr | None]:
    """(target, value) of `name: T = value` or of a one-target `name = value`; (None, None) otherwise."""
    if isinstance(statement, ast.AnnAssign):
        return statement.target, statement.value
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        return statement.targets[0], statement.value
    return None, None


def _last_name(node: ast.expr) -> str:
    """`GRPOConfig` of `trl.GRPOConfig`; "" for anything else."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _python_default(node: ast.expr, text: Callable[[ast.expr], str]) -> str | None:
    """`_field_default` of the same text: `0.04` or `field(default=0.04, ...)`; None when computed."""
    if isinstance(node, ast.Call) and _last_name(node.func) == "field":
        default = next((keyword.value for keyword in node.keywords if keyword.arg == "default"), None)
        return None if default is None else _python_literal(default, text)
    return _python_literal(node, text)


def _called_name(func: ast.expr, names: Collection[str], text: Callable[[ast.expr], str]) -> str | None:
    """The name of `names` a call's target ends in (`GRPOConfig` of `trl.GRPOConfig`), as written."""
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name is None or name not in names:
        return None
    return name if text(func).endswith(name) else None  # an identifier Python normalised: not this name


def _python_literal(node: ast.expr, text: Callable[[ast.expr], str]) -> str | None:
    """`_literal` of the LibCST node for the same text: a string of one literal (implicitly joined
    strings and f-strings are computed), a number as written without underscores, True/False/None,
    or a negated literal."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _python_literal(node.operand, text)
        return None if inner is None else "-" + inner
    if not isinstance(node, ast.Constant) or node.value is Ellipsis or isinstance(node.value, complex):
        return None
    written = text(node)
    if isinstance(node.value, (str, bytes)):
        strings = [t for t in tokenize.generate_tokens(io.StringIO(f"({written})").readline) if t.type == tokenize.STRING]
        return str(node.value) if len(strings) == 1 else None
    if isinstance(node.value, bool) or node.value is None:
        return str(node.value)
    return written.replace("_", "")
