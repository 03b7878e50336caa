"""Framework configuration objects built in Python (`GRPOConfig(beta=0.04, ...)`): their keywords as
settings, with the position of each, read from the module's syntax tree (the code is never run)."""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from klaudit.frameworks.settings import Setting
from klaudit.lint.syntax import dotted


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


def config_calls(module: cst.Module, class_names: Iterable[str], keys: Iterable[str]) -> list[dict[str, Setting]]:
    """One {keyword: Setting} per call of a class named in `class_names`. After `**kwargs` every
    key of `keys` not given by name is unknown (a Setting with value None)."""
    names, keys = set(class_names), tuple(keys)
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
        if any(arg.star == "**" for arg in node.args):  # any key not named may come from the mapping
            unknown = Setting(None, start.line, start.column + 1, start.column + 1)
            settings = {**{key: unknown for key in keys}, **settings}
        calls.append(settings)
    return calls
