"""What the flow analysis inferred about the expressions of the statements where a KL term enters a
loss or reward: which sub-expression holds the policy's, the reference's or the behaviour policy's
log-probs, a mask, or the KL term itself, and which names of the function held them at that point.

The autofix (klaudit.lint.autofix) rewrites code from these roles, never from names of its own
guessing: a role is recorded only where the analysis' value of an expression is unambiguous (one
alternative per evaluation, the same in every evaluation).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import libcst as cst

from klaudit.lint import algebra as alg
from klaudit.lint.syntax import SCOPES, child_nodes

POLICY, DETACHED_POLICY, REFERENCE, BEHAVIOUR, MASK = "policy", "detached policy", "reference", "behaviour", "mask"
OTHER = "other"  # an alternative that is none of the above
_LOGPROB_ROLES = {alg.POLICY: POLICY, alg.REF: REFERENCE, alg.OLD: BEHAVIOUR}


def role_of(facts: tuple) -> frozenset | None:
    """The roles of a value the analysis explains as log-prob tensors of one kind each, or masks: one
    role per alternative (a switch may pick the behaviour policy's log-probs or a detached copy of the
    policy's). The policy's log-probs are told apart by whether gradient flows through them. None when
    an alternative is anything else."""
    if not facts:
        return None
    roles = set()
    for fact in facts:
        if fact.role == "mask":
            roles.add(MASK)
        elif fact.role == "tensor" and fact.poly is not None and len(fact.poly.terms) == 1:
            monomial, coefficient = fact.poly.terms[0]
            atom = monomial[0] if len(monomial) == 1 else None
            if atom is None or coefficient != 1.0 or atom.acc != alg.TOKEN or atom.kind not in _LOGPROB_ROLES:
                return None
            role = _LOGPROB_ROLES[atom.kind]
            roles.add(DETACHED_POLICY if role == POLICY and not atom.grad else role)
        else:
            return None
    return frozenset(roles)


def _varies(fact) -> bool:
    """A tensor fact that is more than a constant (a number the analysis folded into its algebra)."""
    return fact.poly is None or bool(fact.poly.atoms())


def _shape(fact) -> str:
    """How a non-KL tensor alternative varies: see StatementRoles.factors."""
    if fact.poly is not None and fact.poly.has_grad():
        return "policy"
    if fact.scalar:
        return "scalar"
    if fact.poly is not None and fact.poly.atoms() and all(a.acc == alg.SEQUENCE for a in fact.poly.atoms()):
        return "sequence"
    return "token"


@dataclass
class StatementRoles:
    """The roles inside one statement, each the set of roles an expression (by node id) or a name of
    the environment held over the statement's evaluations (one role: the analysis was sure of it)."""

    expressions: dict[int, set] = field(default_factory=dict)
    names: dict[str, set] = field(default_factory=dict)
    kl: dict[int, set] = field(default_factory=dict)  # id(expression) -> ids of the KL origins it holds
    tensors: set = field(default_factory=set)  # ids of expressions that may hold a tensor other than a KL term
    partly_kl: set = field(default_factory=set)  # ids of expressions that hold a KL term in some alternatives only
    switches: dict[int, set] = field(default_factory=dict)  # id(expression) -> (switch, values) of its KL terms
    texts: dict[int, set] = field(default_factory=dict)  # id(expression) -> the strings it may hold
    # id(expression) -> what its non-KL tensor alternatives are: "scalar" (one number for the batch),
    # "sequence" or "token" (one value per sequence or token), "policy" (gradient flows through it)
    factors: dict[int, set] = field(default_factory=dict)

    @staticmethod
    def _merge(table: dict, key, roles: frozenset | None) -> None:
        if roles is not None:
            table.setdefault(key, set()).update(roles)

    def expression_is(self, node: cst.CSTNode, role: str) -> bool:
        return self.expressions.get(id(node)) == {role}

    def names_with(self, roles: set) -> list[str]:
        """The names that held one of `roles` in every evaluation, sorted."""
        return sorted(name for name, held in self.names.items() if held <= roles)


class Evidence:
    """The roles of every statement where a KL term entered a sink, merged over its evaluations."""

    def __init__(self) -> None:
        self._statements: dict[int, StatementRoles] = {}
        self._keep: list = []  # the statements, so that their ids stay theirs while recorded
        self._entries: dict[int, cst.CSTNode] = {}  # the statements where a KL term entered a sink
        self._nodes: dict[int, tuple[cst.CSTNode, ...]] = {}  # a recorded statement's expressions (walked once)

    def note(self, statement: cst.CSTNode, memo: Mapping[int, tuple], env: Mapping[str, tuple],
             entry: bool = True) -> None:
        """Record the values the analysis gave the sub-expressions of `statement` (`memo`, by node id)
        and the names of the environment, at a point where a KL term enters a sink there (`entry`) or
        is stored."""
        roles = self._statements.get(id(statement))
        if roles is None:
            roles = self._statements[id(statement)] = StatementRoles()
            self._keep.append(statement)
        if entry:
            self._entries.setdefault(id(statement), statement)
        nodes = self._nodes.get(id(statement))
        if nodes is None:
            nodes = self._nodes[id(statement)] = tuple(_expressions(statement))
        for node in nodes:
            facts = memo.get(id(node))
            if facts is None:
                continue
            roles._merge(roles.expressions, id(node), role_of(facts) or frozenset({OTHER}))
            others = [f for f in facts if f.role == "mask" or f.role == "tensor" and not f.is_kl() and _varies(f)]
            if others:
                roles.tensors.add(id(node))
                roles.factors.setdefault(id(node), set()).update(_shape(f) for f in others)
            kl = [f for f in facts if f.is_kl()]
            if kl:
                roles.kl.setdefault(id(node), set()).update(id(f.origin) for f in kl)
                roles.switches.setdefault(id(node), set()).update(label for f in kl for label in f.labels)
                if len(kl) < len(facts):
                    roles.partly_kl.add(id(node))
            texts = {f.text for f in facts if f.role == "str" and f.text is not None}
            if texts:
                roles.texts.setdefault(id(node), set()).update(texts)
        for name, facts in env.items() if entry else ():  # the names before the statement runs
            roles._merge(roles.names, name, role_of(facts))

    def of(self, statement: cst.CSTNode) -> StatementRoles | None:
        return self._statements.get(id(statement))

    def statements(self) -> list:
        """Every statement where a KL term entered a sink, in the order they were first recorded."""
        return list(self._entries.values())

    def assignments(self) -> list:
        """Every statement recorded (entries and the assignments that store a KL term)."""
        return list(self._keep)


_BY_ANALYZER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def evidence_of(analyzer) -> Evidence:
    """The evidence an analyzer (klaudit.lint.modules.Analyzer) gathered while it interpreted."""
    found = _BY_ANALYZER.get(analyzer)
    if found is None:
        found = _BY_ANALYZER[analyzer] = Evidence()
    return found


def note_entry(run, statement: cst.CSTNode) -> None:
    """Called by the flow analysis (a FunctionRun) where KL terms enter a sink at `statement`."""
    evidence_of(run.analyzer).note(statement, run._memo, run.env)


def note_assignment(run, statement: cst.CSTNode) -> None:
    """Called by the flow analysis after an assignment: one that stores a KL term (where an estimator is
    computed, or where a helper's estimate arrives) is recorded like an entry, so that a fix can take
    the log-probs from where the estimate was formed."""
    value = getattr(statement, "value", None)
    if value is not None and any(f.is_kl() for f in run._memo.get(id(value), ())):
        evidence_of(run.analyzer).note(statement, run._memo, run.env, entry=False)


def _expressions(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every expression node under `node` (a statement), outermost first (siblings in any order: the
    evidence is kept by node)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.BaseExpression):
            yield current
        if type(current) in SCOPES and current is not node:  # its expressions are not the statement's
            continue
        stack.extend(child_nodes(current))
