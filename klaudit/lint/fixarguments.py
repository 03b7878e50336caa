"""The estimator's arguments in a fix: the one expression that holds the policy's, the reference's
and the behaviour policy's log-probs where the KL term enters its sink (or where the estimate was
formed), and the checks that each still means the same tensor where the fix uses it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

import libcst as cst

from klaudit.lint.evidence import BEHAVIOUR, DETACHED_POLICY, MASK, POLICY, REFERENCE, StatementRoles
from klaudit.lint.fixdescent import Descent
from klaudit.lint.fixsite import FixSite, Refused, statement_value
from klaudit.lint.syntax import child_nodes, walk

_WORDS = {POLICY: "policy's log-probs", DETACHED_POLICY: "policy's detached log-probs", REFERENCE: "reference's log-probs", BEHAVIOUR: "behaviour policy's log-probs",
          MASK: "mask"}


class ArgumentFinder(FixSite):
    """The estimator's arguments, for klaudit.lint.autofix.Builder."""

    def _arguments(self, descent: Descent, roles: StatementRoles, off_policy: bool, estimator: str) -> dict:
        found = {POLICY: self._one(descent.term, roles, POLICY), REFERENCE: self._one(descent.term, roles, REFERENCE)}
        if estimator != "k1":
            found["estimator"] = f'"{estimator}"'
        if off_policy:  # the samples' policy: named as the behaviour's, or a detached copy of the policy's
            found["old_logprobs"] = self._one(descent.term, roles, BEHAVIOUR, DETACHED_POLICY)
        return found

    def _one(self, term: cst.CSTNode | None, roles: StatementRoles, role: str, *also: str) -> str:
        """The code of the one expression holding `role` (or one of `also`, the same quantity): inside the
        KL term if it names one (a call's arguments), else the one name of the function that held it
        at this statement in every evaluation, when no other name may have."""
        wanted = {role, *also}
        inside = {self._code(node) for node in walk(term)
                  if roles.expressions.get(id(node)) and roles.expressions[id(node)] <= wanted}
        if len(inside) == 1:
            return inside.pop()
        if len(inside) > 1:
            raise Refused(f"several expressions hold the {_WORDS[role]}: {', '.join(sorted(inside))}")
        formed = self._from_sources(wanted, role)
        if formed is not None:
            return formed
        names = roles.names_with(wanted)
        unsure = sorted(name for name, held in roles.names.items() if held & wanted and not held <= wanted)
        if len(names) == 1 and not unsure:
            return names[0]
        if not names and not unsure:
            raise Refused(f"no expression is known to hold the {_WORDS[role]} here")
        raise Refused(f"several names may hold the {_WORDS[role]}: {', '.join(names + unsure)}")

    def _from_sources(self, wanted: set, role: str) -> str | None:
        """The expression holding `role` where the KL term was formed: at the earliest statement of the
        entry's function that stores it (the estimator's own statement, or the call of a helper that
        computes it), for every origin of the term, the one side-effect-free expression with that role;
        None when there is no such statement. It must mean the same at the entry (_check_still_means)."""
        entry, origins = self._site
        line = self._line(entry)
        function = self._function_of(line)
        found: dict[str, cst.CSTNode] = {}
        for origin in origins:
            stored = [node for node in self.evidence.assignments() if self.position_of(node) is not None
                      and self._line(node) < line and self._function_of(self._line(node)) is function
                      and any(origin in held for held in self._roles(node).kl.values())]
            if not stored:
                return None
            source = min(stored, key=self._line)
            held = self._roles(source).expressions
            codes = {self._code(node): source for node in _outermost(
                statement_value(source), lambda node, held=held: bool(held.get(id(node))) and held[id(node)] <= wanted
                and _pure(node))}
            if len(codes) > 1:
                raise Refused(f"several expressions hold the {_WORDS[role]} where the estimate is formed (line "
                               f"{self._line(source)}): {', '.join(sorted(codes))}")
            found.update(codes)
        if not found:
            return None
        if len(found) > 1:
            raise Refused(f"the {_WORDS[role]} are different expressions where the estimates are formed: "
                           f"{', '.join(sorted(found))}")
        [(code, source)] = found.items()
        self._check_still_means(code, source, entry)
        return code

    def _check_still_means(self, code: str, source: cst.CSTNode, entry: cst.CSTNode) -> None:
        """`code`, read at `source`, must hold the same tensor at `entry`: nothing its names reach is assigned,
        mutated in place or handed to a method of its own between the two (or anywhere in a loop around
        the entry that does not hold the source), and the source is not in a loop the entry is not in."""
        start, end = self._line(source, end=True), self._line(entry)
        source_loops, entry_loops = self._loops(self._line(source)), self._loops(end)
        if not set(map(id, source_loops)) <= set(map(id, entry_loops)):
            raise Refused(f"the estimate is formed in a loop (line {self._line(source)}) that the KL term leaves")
        spans = [(start + 1, end - 1)] + [(loop.lineno, loop.end_lineno or loop.lineno) for loop in entry_loops
                                          if id(loop) not in set(map(id, source_loops))]
        paths, holders = _paths(code)
        for node in ast.walk(self._function_of(end) or self._ast()):
            line = getattr(node, "lineno", 0)
            if not any(low <= line <= high for low, high in spans):
                continue
            changed = _changes(node, paths, holders)
            if changed:
                raise Refused(f"`{changed}` may change at line {line}, between the estimate (line "
                               f"{self._line(source)}) and the KL term's use")

    def _check_unchanged(self, term, arguments: dict, entry: cst.CSTNode, final: cst.CSTNode) -> None:
        """The moved term and the estimator's arguments must mean the same at the later statement."""
        names = {root for code in arguments.values() for root in _roots(code)}
        names |= {root for node in walk(term) if isinstance(node, cst.Name) for root in [node.value]}
        start, end = self._line(entry, end=True), self._line(final)
        for node in ast.walk(self._ast()):
            line = getattr(node, "lineno", 0)
            if start < line < end and isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
                if _ast_root(node) in names:
                    raise Refused(f"`{_ast_root(node)}` is assigned again at line {line}, before the reduction")


def _roots(code: str) -> set[str]:
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError:
        return set()
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def _ast_root(node: ast.AST) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _outermost(node: cst.CSTNode, matches) -> Iterator[cst.CSTNode]:
    """The nodes under `node` that match, without the matching nodes inside them."""
    stack = [node]
    while stack:
        current = stack.pop()
        if matches(current):
            yield current
            continue
        if isinstance(current, (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
            continue  # names bound inside mean something else outside
        stack.extend(child_nodes(current))


_PURE_METHODS = ("detach", "float", "double", "half", "bfloat16", "clone", "contiguous", "to")


def _pure(node: cst.CSTNode) -> bool:
    """An expression that reads a value without side effects, so that it can be evaluated again
    elsewhere: names, attributes, subscripts by constants or names, and conversions (`.detach()`,
    `.float()`, `.to(device)`) of such."""
    if isinstance(node, cst.Name):
        return True
    if isinstance(node, cst.Attribute):
        return _pure(node.value)
    if isinstance(node, cst.Subscript):
        return _pure(node.value) and all(
            isinstance(element.slice, cst.Index) and isinstance(element.slice.value, (cst.SimpleString, cst.Integer, cst.Name))
            for element in node.slice)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _PURE_METHODS:
        return _pure(node.func.value) and all(isinstance(arg.value, (cst.Name, cst.Attribute, cst.SimpleString))
                                              and (not isinstance(arg.value, cst.Attribute) or _pure(arg.value))
                                              for arg in node.args)
    return False


def _paths(code: str) -> tuple[set[str], set[str]]:
    """The dotted names `code` reads (`data`, `self.ref`, `experience.base_action_log_probs`) with the
    prefixes that reach them, and among them the holders: the objects and containers whose attribute
    or item `code` reads (`self`, `experience`, `data` of `data["old_log_probs"]`)."""
    paths: set[str] = set()
    holders: set[str] = set()
    for node in ast.walk(ast.parse(code, mode="eval")):
        if isinstance(node, (ast.Name, ast.Attribute)):
            parts = _dotted_ast(node).split(".")
            if parts != [""]:
                paths.update(".".join(parts[:index]) for index in range(1, len(parts) + 1))
                holders.update(".".join(parts[:index]) for index in range(1, len(parts)))
        if isinstance(node, ast.Subscript) and _dotted_ast(node.value):
            holders.add(_dotted_ast(node.value))
    return paths, holders


def _dotted_ast(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    return ".".join([node.id, *reversed(parts)])


def _changes(node: ast.AST, paths: set[str], holders: set[str]) -> str:
    """The path of `paths` that `node` may change: assigned (or deleted) itself, through a subscript or
    attribute of it, or by a method call on it (`data.pop(...)`, `logp.mul_(...)`, `self.update()`); ""
    if none."""
    targets: list = []
    if isinstance(node, (ast.Assign, ast.Delete)):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
        targets = [node.target]
    elif isinstance(node, ast.NamedExpr):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
        return next((name for name in node.names if name in paths), "")
    elif isinstance(node, ast.Call):
        return _call_changes(node, paths, holders)
    for target in targets:
        for part in ast.walk(target):
            if isinstance(part, (ast.Name, ast.Attribute, ast.Subscript)):
                path = _dotted_ast(_strip_subscripts(part))
                if path in paths or any(other.startswith(path + ".") for other in paths if path):
                    return path
    return ""


_MUTATORS = ("pop", "popitem", "update", "clear", "setdefault", "append", "extend", "insert", "remove",
             "__setitem__", "__delitem__", "setattr")
_READERS = ("get", "keys", "values", "items", "size", "dim")


def _call_changes(node: ast.Call, paths: set[str], holders: set[str]) -> str:
    """A call that may change a path: an in-place or container-mutating method of the value itself
    (`logp.mul_(2)`, `batch.pop("x")`), any method but a reader of an object that holds it
    (`self.step()` may set `self.ref`), or a function handed such an object (`fill(data)`)."""
    if isinstance(node.func, ast.Attribute):
        receiver = _dotted_ast(_strip_subscripts(node.func.value))
        method = node.func.attr
        if receiver in paths and receiver not in holders and (
                method.endswith("_") and not method.endswith("__") or method in _MUTATORS):
            return receiver
        if receiver in holders and method not in _READERS:
            return receiver
        if isinstance(node.func.value, ast.Subscript) and receiver in paths and (
                method.endswith("_") and not method.endswith("__") or method in _MUTATORS):
            return receiver  # data["x"].mul_(2), data["x"].append(...)
    for arg in [*node.args, *(keyword.value for keyword in node.keywords)]:
        passed = _dotted_ast(arg)
        if passed in holders:
            return passed
    return ""


def _strip_subscripts(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Subscript):
        node = node.value
    return node
