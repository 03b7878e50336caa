"""The number every construction of a class gives an attribute its `__init__` copies from an argument.

`self.beta = args.beta` (or `self.beta = beta`) in a trainer's `__init__` holds, in its methods, what the code
that builds the trainer passed: `Trainer(args=Config(beta=0))`, or `args = Config(..., beta=0)` and then
`Trainer(args=args)` in the same function, or `Trainer(beta=0)`, or `Trainer(beta=args.beta)` where every launch
leaves `--beta` at its default of 0.0. Where the project builds the class and every
construction spells the same number, the attribute is that number: a KL term weighted by a coefficient every run
sets to 0 never acts. Nothing is pinned where a construction splats its arguments, leaves the value to a
framework's default or gives one the text does not spell, where the config is changed after it is built, where
the class is handed on as a value, built as `x.Name(...)` or derived from, or where nothing builds it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from klaudit.lint.callables import self_assignments
from klaudit.lint.pinned import written_out
from klaudit.lint.project import Project
from klaudit.lint.syntax import SCOPES, child_nodes, dotted, number_value, walk
from klaudit.lint.update_loops import importers_afar, nearby_modules

# a module that takes the name from an installed framework builds that framework's class, not the project's
_FRAMEWORKS = frozenset(("trl", "verl", "openrlhf", "transformers", "nemo_rl", "areal", "roll"))


def constructed_number(path: str, project: Project, classdef: cst.ClassDef, attr: str) -> cst.BaseExpression | None:
    """The numeric literal every construction of `classdef` (defined in the module at `path`) gives `self.attr`,
    where `__init__` sets it once from a parameter or a field of one; None where that is not known."""
    key = ("constructed", project.key(path), classdef.name.value, attr)
    return project.remembered(key, lambda: _constructed_number(path, project, classdef, attr))


def _constructed_number(path: str, project: Project, classdef: cst.ClassDef, attr: str) -> cst.BaseExpression | None:
    init = next((item for item in classdef.body.body
                 if isinstance(item, cst.FunctionDef) and item.name.value == "__init__"), None)
    if init is None:
        return None
    assigned = self_assignments([init]).get(attr, [])
    if len(assigned) != 1:
        return None
    source = assigned[0]
    if type(source) is cst.Attribute and type(source.value) is cst.Name:
        parameter, field = source.value.value, source.attr.value
    elif type(source) is cst.Name:
        parameter, field = source.value, None
    else:
        return None
    if _rebinds(init, parameter):
        return None
    positional = [p.name.value for p in (*init.params.posonly_params, *init.params.params)][1:]
    defaults = {p.name.value: p.default for p in (*init.params.posonly_params, *init.params.params,
                                                  *init.params.kwonly_params)}
    if parameter not in defaults:
        return None
    found = _constructions(path, project, classdef.name.value)
    if not found:
        return None
    values = []
    for caller, call in found:
        argument = _bound(call, positional, parameter, defaults[parameter])
        value = argument if field is None or argument is None else _config_field(caller, argument, field)
        if value is None or number_value(value) is None:
            return None
        values.append(value)
    return values[0] if len({number_value(value) for value in values}) == 1 else None


def _constructions(path: str, project: Project, name: str) -> list[tuple[cst.CSTNode, cst.Call]] | None:
    """(the function or module around it, the call) of each `name(...)` the module at `path`, the modules near it
    and the modules anywhere that import it or its module write, with the command-line options and configuration
    reads it passes as the values a run gets (klaudit.lint.pinned.written_out: `beta=args.beta` with `--beta`
    defaulting to 0.0 passes 0.0); None where one of them uses the name otherwise
    (derives from it, hands it on, builds `x.name(...)`) or cannot be parsed. A module that imports the name from
    an installed framework builds that class instead."""
    found: list[tuple[cst.CSTNode, cst.Call]] = []
    places = [project.key(path), *nearby_modules(Path(project.key(path)), project, siblings=True),
              *importers_afar(path, name, project)]
    for place in dict.fromkeys(project.key(place) for place in places):
        text = project.raw_text(place)
        if text is None or name not in text:
            continue
        tree = project.parse(Path(place))
        if tree is None:
            return None
        index = _call_index(project, place, tree)
        if name in index.from_frameworks:
            continue
        if name in index.used_otherwise:
            return None
        here = [(caller, written_out(call, tree, project.options, place)) for caller, call in index.own.get(name, [])]
        if len(here) < index.calls[name]:
            return None  # a call in a decorator, a default or a class body: not one the search above sees
        found += here
    return found


@dataclass(frozen=True)
class _CallIndex:
    """What a module does with each name, gathered in one pass over it (a project asks for many names)."""

    own: dict[str, list[tuple[cst.CSTNode, cst.Call]]]  # name -> (function or module, call) of its own `name(...)`
    calls: Counter[str]  # name -> how many calls `name(...)` the module makes, wherever they are
    used_otherwise: frozenset[str]  # names used other than to call, define, import or annotate with
    from_frameworks: frozenset[str]  # names imported from an installed framework

    @classmethod
    def of(cls, tree: cst.Module) -> _CallIndex:
        calls: Counter[str] = Counter()
        accounted: set[int] = set()
        names: list[cst.Name] = []
        from_frameworks: set[str] = set()
        for node in walk(tree):
            if type(node) is cst.Call and type(node.func) is cst.Name:
                calls[node.func.value] += 1
                accounted.add(id(node.func))
            elif type(node) is cst.ClassDef:
                accounted.add(id(node.name))
            elif isinstance(node, (cst.Import, cst.ImportFrom)) and not isinstance(node.names, cst.ImportStar):
                accounted.update(id(part) for alias in node.names for part in walk(alias))
                if _from_a_framework(node):
                    from_frameworks.update(dotted(alias.name) for alias in node.names)
            elif type(node) is cst.Annotation:
                accounted.update(id(part) for part in walk(node))
            elif type(node) is cst.Name:
                names.append(node)
        own: dict[str, list[tuple[cst.CSTNode, cst.Call]]] = {}
        for caller in [node for node in walk(tree) if type(node) is cst.FunctionDef] + [tree]:
            for call in _own(caller, (cst.Call,)):
                if type(call.func) is cst.Name:
                    own.setdefault(call.func.value, []).append((caller, call))
        return cls(own, calls, frozenset(node.value for node in names if id(node) not in accounted),
                   frozenset(from_frameworks))


def _call_index(project: Project, place: str, tree: cst.Module) -> _CallIndex:
    return project.remembered(("construction calls", place), lambda: _CallIndex.of(tree))


def _from_a_framework(node: cst.Import | cst.ImportFrom) -> bool:
    """Whether `node` is `from <installed framework>... import ...`."""
    return type(node) is cst.ImportFrom and not node.relative and node.module is not None \
        and dotted(node.module).split(".")[0] in _FRAMEWORKS


def _own(scope: cst.CSTNode, kinds: tuple[type, ...], unset: str = "") -> list:
    """The nodes of `kinds` in `scope`'s own code (not in the functions and classes it defines, nor, given `unset`,
    under `if unset is None:`)."""
    found: list = []
    stack = [scope.body if type(scope) is cst.FunctionDef else scope]
    while stack:
        for child in child_nodes(stack.pop()):
            if type(child) in SCOPES:
                continue
            if unset and type(child) is cst.If and _is_none_test(child, unset):
                if child.orelse is not None:
                    stack.append(child.orelse)
                continue
            if isinstance(child, kinds):
                found.append(child)
            stack.append(child)
    return found


def _bound(call: cst.Call, positional: list[str], parameter: str,
           default: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """What `call` gives `parameter`: by keyword, by position, or the default it leaves; None where it splats."""
    for index, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is not None and arg.keyword.value == parameter:
            return arg.value
        if arg.keyword is None and index < len(positional) and positional[index] == parameter:
            return arg.value
    return default


def _config_field(scope: cst.CSTNode, argument: cst.BaseExpression, field: str) -> cst.BaseExpression | None:
    """The keyword `field` of the config call `argument` is, or of the one call `scope` assigns to the name
    `argument`, where nothing in `scope` sets `name.field` afterwards; None where the call leaves it out."""
    if type(argument) is cst.Name:
        name = argument.value
        assigned = [stmt.value for stmt in _own(scope, (cst.BaseSmallStatement,)) if type(stmt) is cst.Assign
                    and any(type(t.target) is cst.Name and t.target.value == name for t in stmt.targets)]
        changed = any(type(stmt) in (cst.Assign, cst.AugAssign) and any(
            type(t) is cst.Attribute and type(t.value) is cst.Name and t.value.value == name
            and t.attr.value == field for t in _targets(stmt)) for stmt in _own(scope, (cst.BaseSmallStatement,)))
        if len(assigned) != 1 or changed:
            return None
        argument = assigned[0]
    if type(argument) is not cst.Call or any(arg.star for arg in argument.args):
        return None
    return next((arg.value for arg in argument.args if arg.keyword is not None and arg.keyword.value == field), None)


def _targets(stmt: cst.BaseSmallStatement) -> list[cst.BaseExpression]:
    if type(stmt) is cst.Assign:
        return [t.target for t in stmt.targets]
    return [stmt.target] if type(stmt) is cst.AugAssign else []


def _rebinds(init: cst.FunctionDef, name: str) -> bool:
    """Whether `__init__` assigns the parameter `name` other than under `if name is None:` (which no construction
    that passes a config takes)."""
    return any(type(t) is cst.Name and t.value == name for stmt in _own(init, (cst.BaseSmallStatement,), name)
               for t in _targets(stmt))


def _is_none_test(node: cst.If, name: str) -> bool:
    """Whether `node` is `if name is None:`."""
    test = node.test
    return type(test) is cst.Comparison and type(test.left) is cst.Name and test.left.value == name \
        and len(test.comparisons) == 1 and type(test.comparisons[0].operator) is cst.Is \
        and type(test.comparisons[0].comparator) is cst.Name and test.comparisons[0].comparator.value == "None"
