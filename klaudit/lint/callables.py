"""Functions as values: closures, `functools.partial`, dispatch tables, callable objects.

A `Callee` is what a name holds when it holds a function of the linted tree: the function, the
module and class it belongs to, the enclosing variables a nested function reads (its closure),
and the arguments `functools.partial` bound ahead of the call. The flow analysis interprets a call
of a callee like a call of the function by name, with the bound arguments first.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import libcst as cst

from klaudit.lint import roles
from klaudit.lint.containers import record_fields
from klaudit.lint.facts import Fact, replace
from klaudit.lint.flowstate import FlowState
from klaudit.lint.project import names_loss_helper
from klaudit.lint.syntax import dotted, int_literal, params, string_value

# Every Callee, by its fields: a Callee equal to one that exists is that one (see Callee).
_CALLEES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class Callee:
    """A function of the linted tree held as a value.

    A closure holds the callees defined before it in the enclosing function, each with its own
    closure: as a tree the value grows exponentially with the number of nested functions, though as
    a graph it shares them. So each callee is made once per distinct value (equal ones are the same
    object) and keeps its hash: hashing and comparing cost the size of one closure, not of the tree."""

    module: Any  # klaudit.lint.modules.Module
    func: cst.FunctionDef
    cls: str | None = None
    closure: tuple = ()  # ((enclosing variable, facts), ...), sorted by name
    bound: tuple = ()  # facts of the positional arguments bound by functools.partial
    bound_keywords: tuple = ()  # ((parameter, facts), ...) bound by functools.partial
    built: Any = None  # (module path, the statement that built it) of a callable object: where its settings are chosen

    def __new__(cls_, module: Any, func: cst.FunctionDef, cls: str | None = None, closure: tuple = (),
                bound: tuple = (), bound_keywords: tuple = (), built: Any = None) -> Callee:
        key = (module, func, cls, closure, bound, bound_keywords, built)
        found = _CALLEES.get(key)
        if found is None:
            found = _CALLEES[key] = super().__new__(cls_)
        return found

    def _fields(self) -> tuple:
        return (self.module, self.func, self.cls, self.closure, self.bound, self.bound_keywords, self.built)

    def __hash__(self) -> int:
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(self._fields())
            object.__setattr__(self, "_hash", cached)
        return cached

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Callee) or hash(self) != hash(other):
            return False
        return self._fields() == other._fields()


def closure_of(env: dict) -> tuple:
    """The enclosing variables a nested function can read: the whole environment where it is defined
    (those it does not mention are never looked up), in a hashable, deterministic order."""
    return tuple(sorted(env.items(), key=lambda item: item[0]))


# calls that hand their one tensor argument back unchanged in meaning: format conversions and
# remote-object fetches (`TensorData.from_torch(x)`, `ray.get(ref)`, `np.asarray(x)`)
PASS_THROUGH = frozenset({"from_torch", "to_torch", "from_numpy", "as_tensor", "asarray", "get", "wait_for"})
PASS_THROUGH_RECEIVERS = frozenset({"ray"} | {module.split(".")[0] for module in roles.ARRAY_MODULES})


def callees_among(facts: tuple) -> list:
    """The facts, among what a call target holds, that hold a function of the tree (each once)."""
    return list(dict.fromkeys(f for f in facts if f.callee is not None))


class CallableFlow(FlowState):
    """Calls of functions held as values, for klaudit.lint.flow.FunctionRun: closures, partials,
    dispatch tables (`{"k1": f1, "k3": f3}[name](...)`), module-level registries, callable objects
    (`self.kl_estimator = KLEstimator(...)` then `self.kl_estimator(...)` through `__call__`)."""

    def callable_values(self, func: cst.BaseExpression) -> list:
        """The facts holding a callee that a call target may hold; empty when it is no value the analysis knows."""
        return callees_among(self.held_by(func))

    def held_by(self, func: cst.BaseExpression) -> tuple:
        """The facts a call target holds: a name's, `self.x`'s (set in any method of the class), a call's;
        a function of the tree among them is called as such, a library loss object (`torch.nn.KLDivLoss(...)`)
        as its library function."""
        if type(func) is cst.Name:  # type(): see klaudit.lint.syntax
            facts = self.env.get(func.value)
            if facts is None:
                facts = self.module_value(func.value, called=True)
        elif type(func) is cst.Attribute and type(func.value) is cst.Name and func.value.value == "self":
            facts = self.env.get(dotted(func))
            if facts is None and self.cls is not None and self.analyzer.method_of(self.module, self.cls, func.attr.value) is None:
                assigned = self.analyzer.self_values(self.module, self.cls).get(func.attr.value)
                facts = tuple(f for rhs in assigned for f in self.expr(rhs)) if assigned is not None else tuple(
                    Fact(role="function", callee=Callee(*found))
                    for found in self.analyzer.inherited_functions(self.module, self.cls, func.attr.value))
        elif type(func) is cst.Subscript or type(func) is cst.Call:
            facts = self.expr(func)
        else:
            facts = ()
        return facts or ()

    def module_value(self, name: str, called: bool = False) -> tuple:
        """A module-level name used as a value (or `called`): a function of the module, or a module-level constant."""
        if name in self.module.functions:
            return (Fact(role="function", callee=Callee(self.module, self.module.functions[name])),)
        if name in self.module.registries:  # a dict its decorators fill: the table of what they registered
            return (Fact(role="dict", items=tuple((key, (Fact(role="function", callee=Callee(self.module, func)),))
                                                  for key, func in self.module.registries[name])),)
        if name in self.module.constants:
            return self.expr(self.module.constants[name])
        # an imported name is followed only when it speaks of KL or a loss, or, stored as a value (`self.agg =
        # seq_mean_token_mean`), of a reduction: parsing modules is the costly part, and a call is followed
        # where its arguments make it worth it
        relevant = name in self.module.imports and (roles.might_contain_kl(name) or "loss" in name.lower()
                                                    or not called and names_loss_helper(name))
        resolved = self.analyzer.resolve(self.module, cst.Name(name), None) if relevant else None
        if resolved is not None:
            module, func, cls = resolved
            return (Fact(role="function", callee=Callee(module, func, cls)),)
        return ()

    def partial(self, node: cst.Call) -> tuple:
        """functools.partial(f, *args, **kwargs): f with those arguments bound ahead of the call."""
        positional, keywords = self.args(node)
        if not positional:
            return ()
        bound = tuple(self.expr(arg) for arg in positional[1:])
        bound_keywords = tuple(sorted((name, self.expr(arg)) for name, arg in keywords.items()))
        return tuple(replace(held, callee=replace(held.callee, bound=held.callee.bound + bound,
                                                   bound_keywords=held.callee.bound_keywords + bound_keywords))
                     for held in self.callable_values(positional[0]))

    def instance(self, module, classdef: cst.ClassDef, node: cst.Call) -> tuple:
        """An object built by calling a class of the tree: a record of its fields, callable through
        `__call__` (or `forward`, for a torch module) when the class defines one."""
        positional, keywords = self.args(node)
        value = self.build_record(record_fields(classdef), positional, keywords)
        methods = {item.name.value: item for item in classdef.body.body if isinstance(item, cst.FunctionDef)}
        method = methods.get("__call__") or methods.get("forward")
        if method is None:
            return value
        # `self.x = x` in __init__: the method reads the constructor's argument (or the default it leaves) as self.x
        arguments = dict(value[0].items)
        init = methods.get("__init__")
        spread = any(a.star == "**" for a in node.args)
        for param in params(init)[1:] if init is not None else ():
            if param.name.value not in arguments and param.default is not None:
                arguments[param.name.value] = left_default(param, spread, self.expr)
        state = tuple(sorted((f"self.{attr}", arguments[rhs[0].value])
                             for attr, rhs in self_assignments([methods["__init__"]] if "__init__" in methods else []).items()
                             if len(rhs) == 1 and isinstance(rhs[0], cst.Name) and rhs[0].value in arguments))
        return tuple(replace(f, callee=Callee(module, method, classdef.name.value, closure=state,
                                              built=(self.module.path, self.here(node)))) for f in value)


def self_assignments(methods: list) -> dict:
    """{attribute: [right-hand sides]} of the `self.attribute = value` statements of `methods`
    (statements at any depth of their blocks; expressions are not searched). An annotated one built
    by a factory (`self.kl: KLPenalty = instantiate(cfg.kl)`) also holds what calling its class gives."""
    found: dict = {}

    def walk(body) -> None:
        for stmt in getattr(body, "body", ()):
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Assign):
                        for target in small.targets:
                            if attr := _self_attribute(target.target):
                                found.setdefault(attr, []).append(small.value)
                    elif isinstance(small, cst.AnnAssign) and small.value is not None \
                            and (attr := _self_attribute(small.target)):
                        found.setdefault(attr, []).extend(_annotated(small))
            elif not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                compound(stmt)

    def compound(stmt) -> None:
        for part in (stmt, getattr(stmt, "orelse", None), getattr(stmt, "finalbody", None), *getattr(stmt, "handlers", ())):
            if isinstance(part, cst.If) and part is not stmt:
                compound(part)  # an `elif`, with the branches after it
            elif isinstance(inner := getattr(part, "body", None), cst.BaseSuite):
                walk(inner)

    for method in methods:
        walk(method.body)
    return found


def _self_attribute(target: cst.BaseExpression) -> str:
    """`x` for the target `self.x`, else ""."""
    if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self":
        return target.attr.value
    return ""


def _annotated(assign: cst.AnnAssign) -> list:
    """The values an annotated `self.x: C = value` holds: `value`, and `C()` when a factory builds it."""
    cls = assign.annotation.annotation
    built_by_factory = (isinstance(cls, cst.Name) and cls.value[:1].isupper() and isinstance(assign.value, cst.Call)
                        and not (isinstance(assign.value.func, cst.Name) and assign.value.func.value == cls.value))
    return [assign.value, cst.Call(func=cls)] if built_by_factory else [assign.value]


def left_default(param: cst.Param, spread: bool, expr: Callable[[cst.BaseExpression], tuple]) -> tuple:
    """What a parameter the caller leaves holds: its default (a string, a bool, a name or a number, `dim=-1`
    too), unless a spread dict (`f(x, **options)`) may set it."""
    default = param.default
    if spread and isinstance(default, cst.Name) and default.value == "None":
        return ()  # maybe set by the spread dict: `if x is None:` decides nothing
    if isinstance(default, cst.SimpleString):
        text = string_value(default) if not spread else None
        return (Fact(role="str", text=text if isinstance(text, str) else None, name=param.name.value),)
    if isinstance(default, cst.Name) and default.value in ("True", "False"):
        return (Fact(role="bool", text=None if spread else default.value, name=param.name.value),)
    if isinstance(default, (cst.Name, cst.Integer, cst.Float)) or default is not None and int_literal(default) is not None:
        return expr(default)
    return ()
