"""The KL functions of a file that check-grad can audit, found statically (the file is never imported).

A function is a KL function when the lint's flow analysis sees it return a KL term or put one into a
loss or reward (`klaudit.lint.query.kl_functions`), or when its parameters name both the policy's and
the reference's log-probs or logits (a wrapper whose body the lint cannot read, such as a compiled
extension's). It can be audited alone when every parameter without a default binds by its name or
annotation (`bind.role_from_name`) or is a switch the code compares with string literals, one of
them binds to the policy, and, for a method, when it and the
methods of its class it calls read no instance attribute but KL coefficients (a bare instance reads
those as 1). The others, typically a whole training step that needs models and an optimizer, are
listed with what they lack so that the user can audit their KL helper instead.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from klaudit.audit.bind import Role, role_from_name, switch_literals_of
from klaudit.lint.roles import is_coefficient_name

_POLICY_ROLES = (Role.LOGPROBS, Role.LOGITS, Role.LOG_RATIO)
_REFERENCE_ROLES = (Role.REF_LOGPROBS, Role.REF_LOGITS)
_SCALAR_ANNOTATIONS = ("str", "bool", "float", "int")


class DiscoveryError(ValueError):
    """A file that cannot be read or parsed; the message is one line."""


@dataclass
class Discovery:
    """The auditable KL functions of a file (qualified names, in source order) and one line for each
    KL function that cannot be called alone."""

    auditable: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def discover_kl_functions(path: str) -> Discovery:
    """Discovery of `path` (DiscoveryError when it does not read or parse)."""
    from klaudit.lint.query import kl_functions

    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    except (OSError, UnicodeDecodeError) as error:
        raise DiscoveryError(f"{path}: cannot read: {error}") from None
    except SyntaxError as error:
        raise DiscoveryError(f"{path}:{error.lineno}: syntax error: {error.msg}") from None
    seen_by_lint = set(kl_functions(path))
    discovery = Discovery()
    for qualname, node, cls in _functions(tree):
        parameters = _parameters(node, cls)
        roles = [role_from_name(name) for name in parameters]
        by_signature = any(r in _POLICY_ROLES for r in roles) and any(r in _REFERENCE_ROLES for r in roles)
        if qualname not in seen_by_lint and not by_signature:
            continue
        lacks = []
        if not any(role in _POLICY_ROLES for role in roles):
            lacks.append("no parameter takes the policy log-probs or logits")
        unbound = [name for name in _unbindable(node, parameters) if name not in switch_literals_of(node, tree)]
        if unbound:
            lacks.append(f"{_listed(unbound)} {'does' if len(unbound) == 1 else 'do'} not bind by name")
        state = _state_read(node, cls) if cls is not None else []
        if state:
            lacks.append(f"it reads instance state {_listed('self.' + name for name in state)}")
        if lacks:
            advice = ("audit the KL helper it calls instead" if state else
                      f"name it with ::{qualname} and say what its parameters are with --bind PARAM=ROLE")
            discovery.skipped.append(f"{path}::{qualname} computes a KL term but cannot be called alone "
                                     f"({'; '.join(lacks)}): {advice}")
        else:
            discovery.auditable.append(qualname)
    return discovery


def _listed(names, shown: int = 4) -> str:
    names = list(names)
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _functions(tree: ast.Module):
    """(qualified name, def node, class node or None) for top-level functions and methods."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node, None
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item, node


def _is_static(node: ast.AST) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)


def _parameters(node: ast.AST, cls: ast.ClassDef | None) -> list[str]:
    arguments = node.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    return names[1:] if cls is not None and not _is_static(node) and names else names


def _unbindable(node: ast.AST, parameters: list[str]) -> list[str]:
    """Parameters without a default that neither their name nor their annotation binds."""
    arguments = node.args
    positional = arguments.posonlyargs + arguments.args
    defaulted = {a.arg for a in positional[len(positional) - len(arguments.defaults):]}
    defaulted |= {a.arg for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None}
    annotations = {a.arg: ast.unparse(a.annotation) for a in positional + arguments.kwonlyargs if a.annotation}
    return [name for name in parameters if name not in defaulted and role_from_name(name) is None
            and annotations.get(name) not in _SCALAR_ANNOTATIONS]


def _state_read(method: ast.AST, cls: ast.ClassDef) -> list[str]:
    """Instance attributes, other than KL coefficients and methods, that `method` and the methods it
    calls on `self` read (an instance whose __init__ did not run lacks them)."""
    methods = {item.name: item for item in cls.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    class_attributes = {target.id for item in cls.body if isinstance(item, (ast.Assign, ast.AnnAssign))
                        for target in (item.targets if isinstance(item, ast.Assign) else [item.target])
                        if isinstance(target, ast.Name) and (isinstance(item, ast.Assign) or item.value)}
    read: dict[str, None] = {}
    pending, visited = [method], set()
    while pending:
        node = pending.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        for child in ast.walk(node):
            if not (isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name)
                    and child.value.id == "self" and isinstance(child.ctx, ast.Load)):
                continue
            if child.attr in methods:
                pending.append(methods[child.attr])
            elif child.attr not in class_attributes and not is_coefficient_name(child.attr):
                read[child.attr] = None
    return list(read)
