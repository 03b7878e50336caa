"""Mechanical fixes of KL findings in Python: rewrites to the bundled estimators.

A fix is built only from what the flow analysis inferred at the statement where the KL term enters
its loss or reward (klaudit.lint.evidence): which sub-expression holds the KL term, which the
policy's, the reference's and the behaviour policy's log-probs, and which the mask of the reduction.
Where one of these is not known, or not known uniquely, no fix is offered and the finding says why.

A KL loss term becomes `klaudit.estimators.kl_penalty(logprobs, ref_logprobs, mask, ...).loss`, at
the KL scale of the reduction it replaces (klaudit.catalog.scaled_fix): a batch token-mean
`.loss.sum() / mask.sum()`, a mean of per-sequence sums `.loss.mean()`, a division by a constant
`.loss.sum() / constant`. When the KL enters a per-token loss that a later statement of the same
function reduces, the term leaves the per-token loss and joins the reduced one. A KL reward term
becomes `klaudit.estimators.kl_reward(logprobs, ref_logprobs, mask)` (detached k1, same per-token
place). Every such fix changes the gradient, so it is unsafe in ruff's sense.

`Builder` writes the loss and reward fixes here, from its parts: where the KL term sits in the
statement and which reductions keep which scale (klaudit.lint.fixdescent), the expressions holding
the estimator's arguments (klaudit.lint.fixarguments), and the statements' positions, blocks and
recorded roles (klaudit.lint.fixsite).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from klaudit.catalog import Config, Row, Sampling
from klaudit.lint import algebra as alg
from klaudit.lint.edits import UNSAFE, Edit, Fix
from klaudit.lint.evidence import BEHAVIOUR, DETACHED_POLICY, MASK, POLICY, REFERENCE, StatementRoles
from klaudit.lint.facts import Fact
from klaudit.lint.fixarguments import ArgumentFinder
from klaudit.lint.fixdescent import COMPATIBLE, Descent, Reduction, TermFinder, kl_scale
from klaudit.lint.fixsite import Refused, statement_value
from klaudit.lint.syntax import walk

PENALTY = "klaudit.estimators.kl_penalty"
REWARD = "klaudit.estimators.kl_reward"


@dataclass(frozen=True)
class SiteUse:
    """One verdict at a statement where a KL term enters a sink: what checks.py knows of it."""

    fact: Fact
    entry: cst.CSTNode  # the statement where the KL term entered
    kind: str  # loss | reward | advantage
    config: Config
    row: Row


@dataclass(frozen=True)
class Outcome:
    fix: Fix | None = None
    reason: str = ""


def refused(reason: str) -> Outcome:
    return Outcome(None, reason)


class Builder(ArgumentFinder, TermFinder):
    """Builds the fix of one site (a statement and an estimator origin) of one module."""

    def site_fix(self, uses: Sequence[SiteUse]) -> Outcome:
        try:
            return Outcome(self._site_fix(uses))
        except Refused as why:
            return refused(str(why))

    def _site_fix(self, uses: Sequence[SiteUse]) -> Fix:
        first = uses[0]
        codes = {use.row.rule for use in uses}
        for code, why in NOT_MECHANICAL.items():
            if code in codes:
                raise Refused(why)
        if len({use.kind == "loss" for use in uses}) > 1 or any(
                use.config.loss is not None and use.config.reward is not None and not _one_weighted_term(use)
                for use in uses):
            raise Refused("the KL is both a loss and a reward here: which one to keep is a choice klaudit leaves to you")
        if any(use.fact.origin is None for use in uses):
            raise Refused("the analysis did not record where the estimator is computed")
        origins = {id(use.fact.origin) for use in uses}  # one per switch branch, all at the same place
        self._site = (first.entry, origins)
        if first.kind == "loss":
            return self._loss_fix(uses, origins)
        return self._reward_fix(uses, origins)

    def _loss_fix(self, uses: Sequence[SiteUse], origins: set) -> Fix:
        entry = uses[0].entry
        value = statement_value(entry)
        roles = self._roles(entry)
        estimator = _estimator(uses)
        off_policy = any(use.config.sampling is not Sampling.ON_POLICY for use in uses)
        descent = self._descend(value, origins, roles)
        if descent.inner and descent.outer:
            raise Refused("the KL term is reduced twice in this statement")
        arguments = self._arguments(descent, roles, off_policy, estimator)
        aggregation = {use.config.aggregation for use in uses}
        if descent.inner:  # `beta * masked_mean(kl, mask)`: the reduction itself is replaced
            reduction = descent.inner[0]
            self._check_scale(reduction, aggregation, roles)
            new = _parse(self._estimator_call(arguments, reduction) + kl_scale(self._code, reduction))
            if reduction.node is not value:  # inside a larger expression: parenthesised, so it binds as one operand
                new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            edits = [self._replace_statement(entry, _replace(entry, reduction.node, new))]
        elif descent.outer:  # `masked_mean(pg + beta * kl, mask)`: the term moves out of the reduction
            reduction = descent.outer[0]
            self._check_scale(reduction, aggregation, roles)
            moved = self._moved_term(descent, arguments, reduction)
            rest = _remove(entry, descent)
            if rest is None:
                new_value = moved
            else:
                new_value = _append(statement_value(rest), moved, descent.sign)
            edits = [self._replace_statement(entry, _set_value(rest or entry, new_value))]
        else:  # a per-token loss reduced by a later statement of the function
            edits = self._split_fix(uses, origins, descent, arguments, aggregation)
        edits.extend(self._import_edit())
        message = (f"Replace the KL term with {PENALTY}(..., estimator=\"{estimator}\")"
                   + (" with importance weights" if off_policy else "") + ".loss at the scale of its reduction")
        return Fix(UNSAFE, message, tuple(edits))

    def _split_fix(self, uses: Sequence[SiteUse], origins: set, descent: Descent, arguments: dict,
                   aggregation: set) -> list[Edit]:
        """The KL term leaves a per-token loss and joins the statement of the function that reduces it."""
        entry = uses[0].entry
        if not descent.adds:
            raise Refused("the statement holds the KL term alone and a later one reduces it: klaudit does "
                           "not move the whole statement")
        start, end = self._line(entry, end=True), self._function_end(self._line(entry))
        candidates = sorted((node for node in self.evidence.statements() if self.position_of(node) is not None
                             and start < self._line(node) <= end), key=self._line)
        for final in candidates:
            roles = self._roles(final)
            try:
                later = self._descend(statement_value(final), origins, roles)
            except Refused:
                continue
            reductions = later.outer + later.inner
            # one reduction, of the per-token loss's own name: no factor of it is left out of the moved term
            if len(reductions) == 1 and isinstance(reductions[0].operand, (cst.Name, cst.Attribute)) and \
                    (later.outer and later.term is later.leaf or later.inner and later.term is reductions[0].node):
                break
        else:
            raise Refused("no later statement of this function reduces the loss in a way klaudit recognises")
        if self._block(self._line(entry)) is not self._block(self._line(final)):
            raise Refused(f"the KL term enters the loss in another block than the reduction at line {self._line(final)} "
                           "(under a condition or loop): moving it would change when it counts")
        reduction = reductions[0]
        self._check_scale(reduction, aggregation, roles)
        self._check_unchanged(descent.term, arguments, entry, final)
        moved = self._moved_term(descent, arguments, reduction)
        rest = _remove(entry, descent)
        assert rest is not None  # descent.adds is not empty
        reduced = _append(statement_value(final), moved, descent.sign * later.sign)
        return [self._replace_statement(entry, rest), self._replace_statement(final, _set_value(final, reduced))]

    def _moved_term(self, descent: Descent, arguments: dict, reduction: Reduction) -> cst.BaseExpression:
        """The term with its KL leaf replaced by the estimator at the reduction's scale; the term's sign
        goes to the operator that adds it."""
        new = _parse(self._estimator_call(arguments, reduction) + kl_scale(self._code, reduction))
        assert descent.term is not None and descent.leaf is not None
        if descent.term is descent.leaf:
            return new
        moved = _replace(descent.term, descent.leaf, new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))
        assert isinstance(moved, cst.BaseExpression)
        return moved

    def _check_scale(self, reduction: Reduction, aggregation: set, roles: StatementRoles) -> None:
        mask = reduction.mask
        if mask is None or not (roles.expression_is(mask, MASK) or  # or a name that held a mask here, always
                                isinstance(mask, cst.Name) and roles.names.get(mask.value) == {MASK}):
            raise Refused("the mask of the KL term's reduction is not known to be a mask")
        if not all(reduction.kind in COMPATIBLE.get(agg, set()) for agg in aggregation):
            raise Refused("the reduction of this statement is not the aggregation the analysis inferred")

    def _estimator_call(self, arguments: dict, reduction: Reduction) -> str:
        assert reduction.mask is not None  # _check_scale
        mask = self._code(reduction.mask)
        extra = "".join(f", {key}={value}" for key, value in arguments.items() if key not in (POLICY, REFERENCE))
        return f"{PENALTY}({arguments[POLICY]}, {arguments[REFERENCE]}, {mask}{extra})"

    def _reward_fix(self, uses: Sequence[SiteUse], origins: set) -> Fix:
        if any(use.config.sampling is not Sampling.ON_POLICY for use in uses):
            raise Refused("an off-policy reward needs per-decision importance weights, which the "
                           "reward's own code must apply")
        entry = uses[0].entry
        roles = self._roles(entry)
        descent = self._descend(statement_value(entry), origins, roles)
        if descent.inner or descent.outer:
            raise Refused("the KL reward is reduced in this statement: klaudit rewrites per-token rewards only")
        assert descent.leaf is not None
        policy = self._reward_policy(descent.term, roles)
        reference = self._one(descent.term, roles, REFERENCE)
        masks = {self._code(node) for node in walk(statement_value(entry)) if roles.expression_is(node, MASK)}
        if not masks:
            masks = set(roles.names_with({MASK}))
        if len(masks) != 1:
            raise Refused("no single mask is known here" if not masks else
                           f"several masks are known here ({', '.join(sorted(masks))})")
        new = _parse(f"{REWARD}({policy}, {reference}, {masks.pop()})")
        edits = [self._replace_statement(entry, _replace(entry, descent.leaf, new))]
        edits.extend(self._import_edit())
        return Fix(UNSAFE, f"Put the detached k1 of {REWARD} into the reward instead", tuple(edits))

    def _reward_policy(self, term, roles: StatementRoles) -> str:
        """A reward is often computed from the rollout's log-probs, which the analysis may call the
        behaviour policy's; either is the sampling policy here, but only one may be known."""
        known = []
        for wanted in ((POLICY, DETACHED_POLICY), (BEHAVIOUR,)):
            try:
                known.append(self._one(term, roles, *wanted))
            except Refused as why:
                if "several" in str(why):
                    raise
        if len(known) != 1:
            raise Refused("the sampling policy's log-probs are not known uniquely here")
        return known[0]


NOT_MECHANICAL = {
    "KL005": "summing the KL over every token changes which tensors the reward is built from: rewrite it by hand",
    "KL006": "which of the loss and the reward to keep is a choice klaudit leaves to you",
    "KL011": "flipping the sign of the KL term is left to you: check the sign convention of the surrounding code",
}


def _one_weighted_term(use: SiteUse) -> bool:
    """A loss-and-reward configuration that is one term of the code: an estimate times a differentiable
    ratio of the policy (exp(P - sg P) * k counts as k in the loss plus k as a reward), not a KL loss
    paired with a separate KL reward of the same step. Replacing that term replaces both parts."""
    terms = alg.terms_of(use.fact.poly, "loss") if use.fact.poly is not None else []
    return any(term.weighted in ("score", "is", "score-seq", "is-seq") for term in terms)


def _estimator(uses: Sequence[SiteUse]) -> str:
    """The estimator the catalog's fixes ask for: k3 only if every verdict here keeps k3 (R-C), rb is
    refused (it needs logits), k1 (R-A) otherwise."""
    wanted = set()
    for use in uses:
        fix = use.row.fix
        if 'estimator="rb"' in fix:
            raise Refused("the fix needs the logits of both models (estimator=\"rb\"), which klaudit does not track")
        wanted.add("k3" if 'estimator="k3"' in fix else "k1")
    return "k3" if wanted == {"k3"} else "k1"


def _set_value(statement: cst.CSTNode, value: cst.BaseExpression) -> cst.CSTNode:
    return statement.with_changes(value=value)


def _parse(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


class _Swap(cst.CSTTransformer):
    def __init__(self, old: cst.CSTNode, new: cst.CSTNode) -> None:
        self.old, self.new = old, new

    def on_leave(self, original_node, updated_node):
        return self.new if original_node is self.old else updated_node


def _replace(tree: cst.CSTNode, old: cst.CSTNode, new: cst.CSTNode) -> cst.CSTNode:
    """`tree` with the node `old` (by identity) replaced by `new`."""
    replaced = tree.visit(_Swap(old, new))
    assert isinstance(replaced, cst.CSTNode)  # the transformer replaces, never removes
    return replaced


def _remove(statement: cst.CSTNode, descent: Descent) -> cst.CSTNode | None:
    """The statement without the KL term: its additive parent becomes the other operand (keeping the
    parent's parentheses); None when the term is the statement's whole value."""
    if not descent.adds:
        return None
    parent, side = descent.adds[-1]
    other = parent.left if side == "right" else parent.right
    if side == "left" and isinstance(parent.operator, cst.Subtract):
        other = cst.UnaryOperation(operator=cst.Minus(), expression=_parenthesized(other))
    if parent.lpar:
        other = _parenthesized(other).with_changes(lpar=parent.lpar, rpar=parent.rpar) if not other.lpar else \
            other.with_changes(lpar=[*parent.lpar, *other.lpar], rpar=[*other.rpar, *parent.rpar])
    return _replace(statement, parent, other)


_TIGHT = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float, cst.UnaryOperation)
_ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.MatrixMultiply,
               cst.Power)


def _parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    if node.lpar or isinstance(node, _TIGHT):
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _append(value: cst.BaseExpression, term: cst.BaseExpression, sign: int) -> cst.BaseExpression:
    """`value + term` (or `- term`), parenthesising `value` where the operator would bind it otherwise."""
    if not (value.lpar or isinstance(value, _TIGHT) or
            isinstance(value, cst.BinaryOperation) and isinstance(value.operator, _ARITHMETIC)):
        value = _parenthesized(value)
    if isinstance(term, cst.BinaryOperation) and isinstance(term.operator, (cst.Add, cst.Subtract)) and not term.lpar:
        term = _parenthesized(term)
    operator = cst.Add() if sign > 0 else cst.Subtract()
    return cst.BinaryOperation(left=value, operator=operator, right=term)
