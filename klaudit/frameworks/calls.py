"""Framework configuration objects built in Python (`GRPOConfig(beta=0.04, ...)`): their keywords as
settings, with the position of each, read from the module's syntax tree (the code is never run).

Python's own syntax tree (`ast`, already built for the syntax check) gives the calls and the positions
of their keywords; LibCST's positions would regenerate the whole module's code, which costs more than
parsing it. LibCST's tree is read only where Python cannot read the text (newer syntax)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Callable, Iterable

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from klaudit.frameworks.settings import Setting
from klaudit.lint.parsing import python_ast
from klaudit.lint.syntax import dotted

_NEWLINE = re.compile(r"\r\n?|\n")  # line ends as Python's tokenizer and LibCST count them


def _literal(node: cst.BaseExpression) -> str | None:
    """The value of a literal keyword argument as a string; None for anything computed."""
    if isinstance(node, cst.SimpleString):
        return str(node.evaluated_value)
    if isinstance(node, (cst.Integer, cst.Float)):
        return node.value.replace("_", "")
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return node.value
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = _literal(node.expression)
        return None if inner is None else "-" + inner
    return None


def config_calls(module: cst.Module, class_names: Iterable[str], keys: Iterable[str],
                 source: str | None = None) -> list[dict[str, Setting]]:
    """One {keyword: Setting} per call of a class named in `class_names`, in `module` parsed from
    `source`. After `**kwargs` every key of `keys` not given by name is unknown (a Setting with value None)."""
    names, keys = set(class_names), tuple(keys)
    calls = _python_calls(source, names) if source is not None else None
    if calls is None:
        calls = _cst_calls(module, names)
    out = []
    for start, settings, double_star in calls:
        if double_star:  # any key not named may come from the mapping
            unknown = Setting(None, start[0], start[1], start[1])
            settings = {**{key: unknown for key in keys}, **settings}
        out.append(settings)
    return out


_Call = tuple[tuple[int, int], dict[str, Setting], bool]  # (line, column) of the call, its keywords, `**`


def _cst_calls(module: cst.Module, names: set[str]) -> list[_Call]:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    calls = []
    for node in positions:
        if not (isinstance(node, cst.Call) and dotted(node.func).rsplit(".", 1)[-1] in names):
            continue
        start = positions[node].start
        settings: dict[str, Setting] = {}
        for arg in node.args:
            if arg.keyword is not None:
                where, end = positions[arg].start, positions[arg].end
                end_column = end.column + 1 if end.line == where.line else where.column + 1 + len(arg.keyword.value)
                settings[arg.keyword.value] = Setting(_literal(arg.value), where.line, where.column + 1, end_column)
        calls.append(((start.line, start.column + 1), settings, any(arg.star == "**" for arg in node.args)))
    return calls


def _python_calls(source: str, names: set[str]) -> list[_Call] | None:
    """The calls as `_cst_calls` finds them, read from Python's tree of `source`; None when Python
    cannot read it. Python counts columns in UTF-8 bytes and normalises identifiers (NFKC), LibCST
    counts characters and keeps the text: both are converted to LibCST's terms."""
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

    calls = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _called_name(node.func, names, text) is not None):
            continue
        settings: dict[str, Setting] = {}
        for keyword in node.keywords:
            if keyword.arg is not None:
                where = (keyword.lineno, column(keyword.lineno, keyword.col_offset))
                end_column = (column(keyword.lineno, keyword.end_col_offset or 0) if keyword.end_lineno == keyword.lineno
                              else where[1] + len(keyword.arg))
                settings[keyword.arg] = Setting(_python_literal(keyword.value, text), *where, end_column)
        calls.append(((node.lineno, column(node.lineno, node.col_offset)), settings,
                      any(keyword.arg is None for keyword in node.keywords)))
    return calls


def _called_name(func: ast.expr, names: set[str], text: Callable[[ast.expr], str]) -> str | None:
    """The name of `names` a call's target ends in (`GRPOConfig` of `trl.GRPOConfig`), as written (`text`)."""
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name not in names:
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
