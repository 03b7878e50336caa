"""The functions of a module as the lint reads them: their parameters and, for methods, the instance state they
read. check-grad decides from these which KL functions it can call alone (klaudit.audit.discover)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from klaudit.lint.roles import is_coefficient_name
from klaudit.lint.syntax import dotted, mentions, params, position_cut, statement_nodes, string_key, string_value, walk


@dataclass(frozen=True)
class Parameter:
    """One parameter: its name, its annotation as written ("" without one) and whether it has a default."""

    name: str
    annotation: str = ""
    defaulted: bool = False


@dataclass(frozen=True)
class Signature:
    """A top-level function or a method of a top-level class: the parameters a caller passes (a method's
    `self`/`cls` left out) and the instance attributes it and the methods it calls on `self` read, other
    than KL coefficients and the class's own attributes (an instance whose __init__ did not run lacks them)."""

    qualname: str
    parameters: tuple[Parameter, ...]
    state: tuple[str, ...] = ()
    # each read of that state as the attribute chain below `self` (`config.kl_penalty` for self.config.kl_penalty)
    chains: tuple[str, ...] = ()
    # the attribute chains read below its parameters (`config.kl_penalty`), and the parameters also used bare
    parameter_chains: tuple[str, ...] = ()
    bare: tuple[str, ...] = ()


def signatures(tree: cst.Module) -> Iterator[Signature]:
    """The signature of every top-level function and method of a top-level class, in source order."""
    for stmt in tree.body:
        if isinstance(stmt, cst.FunctionDef):
            yield Signature(stmt.name.value, _parameters(stmt, method=False), (), (), *parameter_reads(stmt))
        elif isinstance(stmt, cst.ClassDef):
            methods = {item.name.value: item for item in stmt.body.body if isinstance(item, cst.FunctionDef)}
            attributes = _class_attributes(stmt)
            for item in methods.values():
                static = _is_static(item)
                state, chains = ((), ()) if static else _state_read(item, methods, attributes)
                yield Signature(f"{stmt.name.value}.{item.name.value}", _parameters(item, method=not static), state,
                                chains, *parameter_reads(item))


def _parameters(func: cst.FunctionDef, method: bool) -> tuple[Parameter, ...]:
    listed = tuple(Parameter(p.name.value, dotted(p.annotation.annotation) if p.annotation else "", p.default is not None)
                   for p in params(func))
    return listed[1:] if method and listed else listed


def _is_static(func: cst.FunctionDef) -> bool:
    return any(dotted(decorator.decorator) == "staticmethod" for decorator in func.decorators)


def _class_attributes(classdef: cst.ClassDef) -> set[str]:
    """Names the class body assigns (`beta = 0.1`, `mode: str = "k1"`): an instance has them without __init__."""
    names = set()
    for line in classdef.body.body:
        for small in line.body if isinstance(line, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Assign):
                names |= {t.target.value for t in small.targets if isinstance(t.target, cst.Name)}
            elif isinstance(small, cst.AnnAssign) and small.value is not None and isinstance(small.target, cst.Name):
                names.add(small.target.value)
    return names


class _Reads(cst.CSTVisitor):
    """The attribute chains read (not assigned) below the names `bases` in a function body, each the longest it
    belongs to (`self.config.kl_penalty`; a dict's keys read as attributes: `config.get("kl_penalty", "kl")` and
    `config["kl_penalty"]` read config.kl_penalty), and the names of `bases` used bare (passed on, rebound; a
    truthiness test, `if config`, `config is None`, or a key's, `"kl_penalty" in config`, is no use of the value)."""

    def __init__(self, bases: set[str]) -> None:
        self.bases = bases
        self.chains: dict[str, None] = {}
        self.bare: dict[str, None] = {}
        self.assigned: set[int] = set()
        self._inner: set[int] = set()  # attributes and names inside a chain already recorded

    def visit_Assign(self, node: cst.Assign) -> None:
        self.assigned |= {id(target.target) for target in node.targets}

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.assigned.add(id(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.assigned.add(id(node.target))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if id(node) in self._inner:
            return
        chain, inner = dotted(node), node
        while isinstance(inner.value, cst.Attribute):
            inner = inner.value
            self._inner.add(id(inner))
        if isinstance(inner.value, cst.Name) and inner.value.value in self.bases:
            self._inner.add(id(inner.value))
            if chain and id(node) in self.assigned:
                chain = chain.rsplit(".", 1)[0]  # `self.stats.count = 1` reads self.stats
            if chain and "." in chain and id(inner) not in self.assigned:
                self.chains[chain] = None

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "get" and node.args \
                and isinstance(node.args[0].value, cst.SimpleString) and self._read_key(func.value):
            key = string_value(node.args[0].value)
            if isinstance(key, str) and key.isidentifier():
                self._inner.add(id(func))
                self._record_key(func.value, key)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        key = string_key(node)
        if key is not None and key.isidentifier() and self._read_key(node.value) and id(node) not in self.assigned:
            self._record_key(node.value, key)

    def _read_key(self, node: cst.BaseExpression) -> bool:
        """Whether `node` is one of `bases` or an attribute chain below one (a dict whose keys are read)."""
        chain = dotted(node)
        return bool(chain) and chain.split(".")[0] in self.bases

    def _record_key(self, node: cst.BaseExpression, key: str) -> None:
        inner = node
        while isinstance(inner, cst.Attribute):
            self._inner.add(id(inner))
            inner = inner.value
        self._inner.add(id(inner))
        self.chains[f"{dotted(node)}.{key}"] = None

    def visit_If(self, node: cst.If) -> None:
        self._tested(node.test)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._tested(node.test)

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        self._tested(node.left)
        self._tested(node.right)

    def visit_UnaryOperation(self, node: cst.UnaryOperation) -> None:
        if isinstance(node.operator, cst.Not):
            self._tested(node.expression)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if len(node.comparisons) != 1:
            return
        operator, right = node.comparisons[0].operator, node.comparisons[0].comparator
        if isinstance(operator, (cst.Is, cst.IsNot)) and isinstance(right, cst.Name) and right.value == "None":
            self._tested(node.left)
        elif isinstance(operator, (cst.In, cst.NotIn)) and isinstance(node.left, cst.SimpleString):
            self._tested(right)  # `"temperature" in config`: a key looked up, not the value used

    def _tested(self, node: cst.BaseExpression) -> None:
        """A base name tested for truth or None (`if config`, `config is not None`): not a use of its value."""
        if isinstance(node, cst.Name) and node.value in self.bases:
            self._inner.add(id(node))

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.bases and id(node) not in self._inner:
            self.bare[node.value] = None


def _state_read(method: cst.FunctionDef, methods: dict[str, cst.FunctionDef],
                attributes: set[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The instance attributes `method` and the `self` methods it calls read, and the chains they are read by."""
    read: dict[str, None] = {}
    chains: dict[str, None] = {}
    pending, visited = [method], set()
    while pending:
        func = pending.pop()
        if id(func) in visited:
            continue
        visited.add(id(func))
        reads = _Reads({"self"})
        func.body.visit(reads)
        below = [chain.partition(".")[2] for chain in reads.chains]  # `config.kl_penalty` of self.config.kl_penalty
        for name in dict.fromkeys(chain.split(".")[0] for chain in below):
            if name in methods:
                pending.append(methods[name])
            elif name not in attributes and not is_coefficient_name(name):
                read[name] = None
        chains.update((chain, None) for chain in below if chain.split(".")[0] in read)
    return tuple(read), tuple(chains)


def parameter_reads(func: cst.FunctionDef) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The attribute chains `func` reads below its parameters (`config.kl_penalty`), and the parameters it also
    uses bare (passed on whole, rebound)."""
    reads = _Reads({param.name.value for param in params(func)} - {"self", "cls"})
    func.body.visit(reads)
    return tuple(reads.chains), tuple(reads.bare)


@dataclass(frozen=True)
class InputReads:
    """What a function's code says of its tensor parameters beyond their names. `shifted`: the parameters it reads
    only with one end of one axis cut off, with that end and axis (`syntax.position_cut`), so a caller passes them one
    position longer than the tokens scored (causal-LM logits `[B, T + 1, V]`, ids `[B, T + 1]`). `filled`: the
    parameters defaulting to None that it computes from its other parameters when not given (`if probs is None: probs
    = softmax(logits)`)."""

    shifted: tuple[tuple[str, str, int], ...] = ()
    filled: tuple[str, ...] = ()


def input_reads(func: cst.FunctionDef) -> InputReads:
    """How `func` reads its parameters (see InputReads)."""
    return InputReads(_shifted(func), filled_parameters(func))


def _shifted(func: cst.FunctionDef) -> tuple[tuple[str, str, int], ...]:
    """The parameters `func` reads only with one end of one axis cut off, the end and the axis (syntax.position_cut).
    A statement of the body that rebinds a parameter to its cut (`mask = mask[..., 1:].float()`) ends it: the later
    reads of that name are of the cut value."""
    cuts: dict[str, set[tuple[str, int] | None]] = {param.name.value: set() for param in params(func)}
    open_names = set(cuts)  # the parameters not yet rebound by a statement of the body
    for statement in func.body.body if isinstance(func.body, cst.IndentedBlock) else (func.body,):
        rebound = _rebound(statement) & open_names
        not_whole: set[int] = set()
        for node in walk(statement):
            if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and node.value.value in open_names:
                cut = position_cut(node)
                if cut is not None:
                    cuts[node.value.value].add(cut)
                    not_whole.add(id(node.value))
            elif isinstance(node, cst.Attribute):
                not_whole.add(id(node.attr))  # `outputs.logits` names no parameter
            elif isinstance(node, cst.Arg) and node.keyword is not None:
                not_whole.add(id(node.keyword))
            elif isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Name) and node.target.value in rebound:
                not_whole.add(id(node.target))
        for node in walk(statement):
            if isinstance(node, cst.Name) and node.value in open_names and id(node) not in not_whole:
                cuts[node.value].add(None)  # read whole, or rebound elsewhere: its length is the tokens'
        open_names -= rebound
    return tuple((name, *cut) for name, ends in cuts.items() if len(ends) == 1 for cut in ends if cut is not None)


def _rebound(statement: cst.BaseStatement | cst.BaseSuite) -> set[str]:
    """The names a simple statement `name = ...` assigns (a compound statement's assignments may not run)."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return set()
    return {target.target.value for small in statement.body if isinstance(small, cst.Assign)
            for target in small.targets if isinstance(target.target, cst.Name)}


def filled_parameters(func: cst.FunctionDef) -> tuple[str, ...]:
    """The parameters defaulting to None that `func` assigns under `if name is None:` from a value reading another of
    its parameters (`if probs is None: probs = softmax(logits)`)."""
    names = [param.name.value for param in params(func)]
    optional = {param.name.value for param in params(func)
                if isinstance(param.default, cst.Name) and param.default.value == "None"}
    filled: dict[str, None] = {}
    for node in statement_nodes(func.body) if optional else ():
        if not isinstance(node, cst.If):
            continue
        name = _tested_for_none(node.test)
        if name in optional and name not in filled and any(
                isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name
                                                      for t in small.targets)
                and any(mentions(small.value, other) for other in names if other != name) for small in walk(node.body)):
            filled[name] = None
    return tuple(filled)


def _tested_for_none(test: cst.BaseExpression) -> str | None:
    """`name` of a test `name is None`."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(test.left, cst.Name)):
        return None
    (comparison,) = test.comparisons
    is_none = (isinstance(comparison.operator, cst.Is) and isinstance(comparison.comparator, cst.Name)
               and comparison.comparator.value == "None")
    return test.left.value if is_none else None
