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
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import libcst as cst

from klaudit.catalog import Aggregation, Config, Row, Sampling
from klaudit.lint import algebra as alg
from klaudit.lint.edits import UNSAFE, Edit, Fix
from klaudit.lint.evidence import (
    BEHAVIOUR,
    DETACHED_POLICY,
    MASK,
    POLICY,
    REFERENCE,
    StatementRoles,
    evidence_of,
)
from klaudit.lint.facts import Fact
from klaudit.lint.syntax import dotted

IMPORT = "import klaudit.estimators"
PENALTY = "klaudit.estimators.kl_penalty"
REWARD = "klaudit.estimators.kl_reward"

# Reductions the fix recognises, with the estimator term that keeps their KL scale.
BATCH_MEAN, SEQ_MEAN, SEQ_SUM, TOTAL_SUM, CONSTANT = "batch-mean", "seq-mean", "seq-sum", "total-sum", "constant"
_COMPATIBLE = {  # the lint's aggregation for the finding -> the reductions that spell it
    Aggregation.BATCH_MEAN: {BATCH_MEAN},
    Aggregation.SEQ_MEAN: {SEQ_MEAN},
    Aggregation.SUM: {SEQ_SUM, TOTAL_SUM, CONSTANT},
    Aggregation.CONSTANT: {SEQ_SUM, TOTAL_SUM, CONSTANT},
}
_MASKED_MEANS = ("masked_mean", "masked_token_mean")


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


@dataclass
class Reduction:
    kind: str
    node: cst.BaseExpression  # the reducing expression
    operand: cst.BaseExpression  # what it reduces (holds the KL term)
    mask: cst.BaseExpression | None = None
    divisor: cst.BaseExpression | None = None


@dataclass
class Descent:
    """How the KL term sits in a statement's value: additive steps (node, side, sign), reductions, the
    term (the operand of the deepest + or -) and, inside it, the node that holds the KL (`leaf`)."""

    adds: list = field(default_factory=list)  # (BinaryOperation, "left" | "right") from the top down
    outer: list = field(default_factory=list)  # reductions above the term
    inner: list = field(default_factory=list)  # reductions inside the term
    sign: int = 1
    term: cst.BaseExpression | None = None
    leaf: cst.BaseExpression | None = None


class _Refused(Exception):
    pass


class Builder:
    """Builds the fix of one site (a statement and an estimator origin) of one module."""

    def __init__(self, path: str, module: cst.Module, source: str, analyzer,
                 position_of: Callable[[cst.CSTNode], tuple | None]) -> None:
        self.path = path
        self.module = module
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.evidence = evidence_of(analyzer)
        self.position_of = position_of
        self._tree: ast.Module | None = None
        self._site: tuple = (None, set())  # (the entry statement, the ids of its KL term's origins)

    # ---- entry point ------------------------------------------------------------------------

    def site_fix(self, uses: Sequence[SiteUse]) -> Outcome:
        try:
            return Outcome(self._site_fix(uses))
        except _Refused as why:
            return refused(str(why))

    def _site_fix(self, uses: Sequence[SiteUse]) -> Fix:
        first = uses[0]
        codes = {use.row.rule for use in uses}
        for code, why in NOT_MECHANICAL.items():
            if code in codes:
                raise _Refused(why)
        if len({use.kind == "loss" for use in uses}) > 1 or any(
                use.config.loss is not None and use.config.reward is not None and not _one_weighted_term(use)
                for use in uses):
            raise _Refused("the KL is both a loss and a reward here: which one to keep is a choice klaudit leaves to you")
        if any(use.fact.origin is None for use in uses):
            raise _Refused("the analysis did not record where the estimator is computed")
        origins = {id(use.fact.origin) for use in uses}  # one per switch branch, all at the same place
        self._site = (first.entry, origins)
        if first.kind == "loss":
            return self._loss_fix(uses, origins)
        return self._reward_fix(uses, origins)

    # ---- loss -------------------------------------------------------------------------------

    def _loss_fix(self, uses: Sequence[SiteUse], origins: set) -> Fix:
        entry = uses[0].entry
        value = _value(entry)
        roles = self._roles(entry)
        estimator = _estimator(uses)
        off_policy = any(use.config.sampling is not Sampling.ON_POLICY for use in uses)
        descent = self._descend(value, origins, roles)
        if descent.inner and descent.outer:
            raise _Refused("the KL term is reduced twice in this statement")
        arguments = self._arguments(descent, roles, off_policy, estimator)
        aggregation = {use.config.aggregation for use in uses}
        if descent.inner:  # `beta * masked_mean(kl, mask)`: the reduction itself is replaced
            reduction = descent.inner[0]
            self._check_scale(reduction, aggregation, roles)
            new = _parse(self._estimator_call(arguments, reduction) + _scale(self._code, reduction))
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
                new_value = _append(_value(rest), moved, descent.sign)
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
            raise _Refused("the statement holds the KL term alone and a later one reduces it: klaudit does "
                           "not move the whole statement")
        start, end = self._line(entry, end=True), self._function_end(self._line(entry))
        candidates = sorted((node for node in self.evidence.statements() if self.position_of(node) is not None
                             and start < self._line(node) <= end), key=self._line)
        for final in candidates:
            roles = self._roles(final)
            try:
                later = self._descend(_value(final), origins, roles)
            except _Refused:
                continue
            reductions = later.outer + later.inner
            # one reduction, of the per-token loss's own name: no factor of it is left out of the moved term
            if len(reductions) == 1 and isinstance(reductions[0].operand, (cst.Name, cst.Attribute)) and \
                    (later.outer and later.term is later.leaf or later.inner and later.term is reductions[0].node):
                break
        else:
            raise _Refused("no later statement of this function reduces the loss in a way klaudit recognises")
        if self._block(self._line(entry)) is not self._block(self._line(final)):
            raise _Refused(f"the KL term enters the loss in another block than the reduction at line {self._line(final)} "
                           "(under a condition or loop): moving it would change when it counts")
        reduction = reductions[0]
        self._check_scale(reduction, aggregation, roles)
        self._check_unchanged(descent.term, arguments, entry, final)
        moved = self._moved_term(descent, arguments, reduction)
        rest = _remove(entry, descent)
        assert rest is not None  # descent.adds is not empty
        reduced = _append(_value(final), moved, descent.sign * later.sign)
        return [self._replace_statement(entry, rest), self._replace_statement(final, _set_value(final, reduced))]

    def _moved_term(self, descent: Descent, arguments: dict, reduction: Reduction) -> cst.BaseExpression:
        """The term with its KL leaf replaced by the estimator at the reduction's scale; the term's sign
        goes to the operator that adds it."""
        new = _parse(self._estimator_call(arguments, reduction) + _scale(self._code, reduction))
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
            raise _Refused("the mask of the KL term's reduction is not known to be a mask")
        if not all(reduction.kind in _COMPATIBLE.get(agg, set()) for agg in aggregation):
            raise _Refused("the reduction of this statement is not the aggregation the analysis inferred")

    def _estimator_call(self, arguments: dict, reduction: Reduction) -> str:
        assert reduction.mask is not None  # _check_scale
        mask = self._code(reduction.mask)
        extra = "".join(f", {key}={value}" for key, value in arguments.items() if key not in (POLICY, REFERENCE))
        return f"{PENALTY}({arguments[POLICY]}, {arguments[REFERENCE]}, {mask}{extra})"

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
        inside = {self._code(node) for node in _walk(term)
                  if roles.expressions.get(id(node)) and roles.expressions[id(node)] <= wanted}
        if len(inside) == 1:
            return inside.pop()
        if len(inside) > 1:
            raise _Refused(f"several expressions hold the {_WORDS[role]}: {', '.join(sorted(inside))}")
        formed = self._from_sources(wanted, role)
        if formed is not None:
            return formed
        names = roles.names_with(wanted)
        unsure = sorted(name for name, held in roles.names.items() if held & wanted and not held <= wanted)
        if len(names) == 1 and not unsure:
            return names[0]
        if not names and not unsure:
            raise _Refused(f"no expression is known to hold the {_WORDS[role]} here")
        raise _Refused(f"several names may hold the {_WORDS[role]}: {', '.join(names + unsure)}")

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
                _value(source), lambda node, held=held: bool(held.get(id(node))) and held[id(node)] <= wanted
                and _pure(node))}
            if len(codes) > 1:
                raise _Refused(f"several expressions hold the {_WORDS[role]} where the estimate is formed (line "
                               f"{self._line(source)}): {', '.join(sorted(codes))}")
            found.update(codes)
        if not found:
            return None
        if len(found) > 1:
            raise _Refused(f"the {_WORDS[role]} are different expressions where the estimates are formed: "
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
            raise _Refused(f"the estimate is formed in a loop (line {self._line(source)}) that the KL term leaves")
        spans = [(start + 1, end - 1)] + [(loop.lineno, loop.end_lineno or loop.lineno) for loop in entry_loops
                                          if id(loop) not in set(map(id, source_loops))]
        paths, holders = _paths(code)
        for node in ast.walk(self._function_of(end) or self._ast()):
            line = getattr(node, "lineno", 0)
            if not any(low <= line <= high for low, high in spans):
                continue
            changed = _changes(node, paths, holders)
            if changed:
                raise _Refused(f"`{changed}` may change at line {line}, between the estimate (line "
                               f"{self._line(source)}) and the KL term's use")

    def _check_unchanged(self, term, arguments: dict, entry: cst.CSTNode, final: cst.CSTNode) -> None:
        """The moved term and the estimator's arguments must mean the same at the later statement."""
        names = {root for code in arguments.values() for root in _roots(code)}
        names |= {root for node in _walk(term) if isinstance(node, cst.Name) for root in [node.value]}
        start, end = self._line(entry, end=True), self._line(final)
        for node in ast.walk(self._ast()):
            line = getattr(node, "lineno", 0)
            if start < line < end and isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
                if _ast_root(node) in names:
                    raise _Refused(f"`{_ast_root(node)}` is assigned again at line {line}, before the reduction")

    # ---- reward -----------------------------------------------------------------------------

    def _reward_fix(self, uses: Sequence[SiteUse], origins: set) -> Fix:
        if any(use.config.sampling is not Sampling.ON_POLICY for use in uses):
            raise _Refused("an off-policy reward needs per-decision importance weights, which the "
                           "reward's own code must apply")
        entry = uses[0].entry
        roles = self._roles(entry)
        descent = self._descend(_value(entry), origins, roles)
        if descent.inner or descent.outer:
            raise _Refused("the KL reward is reduced in this statement: klaudit rewrites per-token rewards only")
        assert descent.leaf is not None
        policy = self._reward_policy(descent.term, roles)
        reference = self._one(descent.term, roles, REFERENCE)
        masks = {self._code(node) for node in _walk(_value(entry)) if roles.expression_is(node, MASK)}
        if not masks:
            masks = set(roles.names_with({MASK}))
        if len(masks) != 1:
            raise _Refused("no single mask is known here" if not masks else
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
            except _Refused as why:
                if "several" in str(why):
                    raise
        if len(known) != 1:
            raise _Refused("the sampling policy's log-probs are not known uniquely here")
        return known[0]

    # ---- descent ----------------------------------------------------------------------------

    def _descend(self, value: cst.BaseExpression, origins: set, roles: StatementRoles) -> Descent:
        def holds(node: cst.CSTNode) -> bool:
            return not origins.isdisjoint(roles.kl.get(id(node), ()))

        if not holds(value):
            raise _Refused("the analysis did not record where the KL term sits in this statement")
        descent = Descent()
        node: cst.BaseExpression = value
        while True:
            reduction = None if descent.adds else _reduction(node, holds, lambda call, mode: _modes(call, mode, roles))
            if reduction is not None:  # a reduction of the whole sum: the term leaves it
                descent.outer.append(reduction)
                node = reduction.operand
                continue
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract)):
                left, right = holds(node.left), holds(node.right)
                if left == right:
                    raise _Refused("both operands of a sum hold the KL term" if left else
                                   "the analysis did not record where the KL term sits in this statement")
                if right and isinstance(node.operator, cst.Subtract):
                    descent.sign = -descent.sign
                descent.adds.append((node, "left" if left else "right"))
                node = node.left if left else node.right
                continue
            if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) and _is_sum(node.expression):
                descent.sign = -descent.sign
                node = node.expression
                continue
            break
        descent.term = node
        descent.leaf = self._leaf(node, holds, roles, descent)
        return descent

    def _leaf(self, node: cst.BaseExpression, holds, roles: StatementRoles, descent: Descent) -> cst.BaseExpression:
        """The node of the term that holds the KL, through coefficients (factors the analysis took for
        scales: no tensor, no KL), unary minus and reductions."""
        while True:
            reduction = _reduction(node, holds, lambda call, mode: _modes(call, mode, roles))
            if reduction is not None:
                # the whole reduction is replaced: it must reduce the KL term alone, with no factor
                if self._leaf(reduction.operand, holds, roles, Descent()) is not reduction.operand:
                    raise _Refused("the reduction holds more than the KL term")
                descent.inner.append(reduction)
                return reduction.node
            if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
                node = node.expression
                continue
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Multiply, cst.Divide)):
                left, right = holds(node.left), holds(node.right)
                other = node.right if left else node.left
                if left == right or (right and isinstance(node.operator, cst.Divide)):
                    raise _Refused("the KL term is multiplied by another KL term")
                if id(other) in roles.tensors:
                    self._check_factor(other, roles)
                node = node.left if left else node.right
                continue
            if isinstance(node, (cst.BinaryOperation, cst.BooleanOperation, cst.IfExp, cst.Comparison)):
                raise _Refused("the KL term is combined with other terms in a way klaudit does not rewrite")
            _check_per_token(node, holds)
            return node

    def _check_factor(self, factor: cst.BaseExpression, roles: StatementRoles) -> None:
        """A tensor multiplying the KL term stays where it is, outside the replaced span, when it is one
        number for the batch (an adaptive coefficient); a per-token or per-sequence tensor cannot be
        carried by the estimator's per-sequence loss, and one that depends on the policy (a ratio,
        log-probs) is part of what the fix replaces."""
        shapes = roles.factors.get(id(factor), {"token"})
        code = self._code(factor)
        if "policy" in shapes:
            raise _Refused(f"the KL term is multiplied by `{code}`, which depends on the policy (a differentiable "
                           "ratio or log-probs): the product is a different estimator, rewrite it by hand")
        if shapes != {"scalar"}:
            raise _Refused(f"the KL term is multiplied by `{code}`, a tensor with a value per token or sequence: "
                           "the estimator's per-sequence loss cannot carry those weights")

    # ---- edits ------------------------------------------------------------------------------

    def _roles(self, statement: cst.CSTNode) -> StatementRoles:
        roles = self.evidence.of(statement)
        if roles is None:
            raise _Refused("the analysis recorded no roles for this statement")
        return roles

    def _code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node).strip()

    def _line(self, statement: cst.CSTNode, end: bool = False) -> int:
        where = self.position_of(statement)
        if where is None:
            raise _Refused("the statement's position is unknown")
        return where[2] if end else where[0]

    def _replace_statement(self, statement: cst.CSTNode, new: cst.CSTNode) -> Edit:
        where = self.position_of(statement)
        if where is None:
            raise _Refused("the statement's position is unknown")
        line, column, end_line, end_column = where
        content = self.module.code_for_node(new)
        if isinstance(new, (cst.Assign, cst.AugAssign, cst.Return, cst.Expr)) and not isinstance(
                new.semicolon, cst.MaybeSentinel):
            content = content.rstrip().removesuffix(";").rstrip()
        return Edit(line, self._char_column(line, column), end_line, self._char_column(end_line, end_column), content)

    def _char_column(self, line: int, byte_column: int) -> int:
        """A 1-based column in characters, from the 1-based byte column Python's parser gives."""
        text = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        return len(text.encode("utf-8")[: byte_column - 1].decode("utf-8", errors="ignore")) + 1

    def _import_edit(self) -> list[Edit]:
        """`import klaudit.estimators`, once: after the module's leading imports (or its docstring)."""
        tree = self._ast()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(alias.name == "klaudit.estimators" and alias.asname is None
                                                    for alias in node.names):
                return []
        after = 0
        for index, node in enumerate(tree.body):
            is_docstring = index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and \
                isinstance(node.value.value, str)
            if is_docstring or isinstance(node, (ast.Import, ast.ImportFrom)):
                after = node.end_lineno or node.lineno
            else:
                break
        line = after + 1
        while after == 0 and line - 1 < len(self.lines) and self.lines[line - 1].startswith("#"):
            line += 1  # after a shebang and an encoding declaration, which must stay first
        if line - 1 >= len(self.lines):
            prefix = "" if not self.lines or self.lines[-1].endswith("\n") else "\n"
            return [Edit(line, 1, line, 1, prefix + IMPORT + "\n")] if prefix else [Edit(line, 1, line, 1, IMPORT + "\n")]
        return [Edit(line, 1, line, 1, IMPORT + "\n")]

    def _block(self, line: int) -> ast.AST | None:
        """The innermost compound statement (function, branch, loop, with, try) around `line`."""
        around = [node for node in ast.walk(self._ast()) if isinstance(node, _COMPOUND)
                  and node.lineno < line <= (node.end_lineno or 0)]
        return max(around, key=lambda node: node.lineno, default=None)

    def _function_of(self, line: int) -> ast.AST | None:
        """The innermost function that holds `line`."""
        around = [node for node in ast.walk(self._ast()) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.lineno <= line <= (node.end_lineno or 0)]
        return max(around, key=lambda node: node.lineno, default=None)

    def _loops(self, line: int) -> list:
        """The loops of the innermost function around `line`, whose bodies hold it."""
        function = self._function_of(line)
        return [node for node in ast.walk(function or self._ast()) if isinstance(node, (ast.For, ast.AsyncFor, ast.While))
                and node.lineno < line <= (node.end_lineno or 0)]

    def _function_end(self, line: int) -> int:
        """The last line of the innermost function that holds `line`."""
        ends = [node.end_lineno or node.lineno for node in ast.walk(self._ast())
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or 0)]
        if not ends:
            raise _Refused("the statement is not inside a function")
        return min(ends)

    def _ast(self) -> ast.Module:
        if self._tree is None:
            self._tree = ast.parse(self.source)
        return self._tree


_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.If, ast.For, ast.AsyncFor, ast.While, ast.With,
             ast.AsyncWith, ast.Try, ast.Match, ast.ClassDef) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())
_WORDS = {POLICY: "policy's log-probs", DETACHED_POLICY: "policy's detached log-probs", REFERENCE: "reference's log-probs", BEHAVIOUR: "behaviour policy's log-probs",
          MASK: "mask"}

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
            raise _Refused("the fix needs the logits of both models (estimator=\"rb\"), which klaudit does not track")
        wanted.add("k3" if 'estimator="k3"' in fix else "k1")
    return "k3" if wanted == {"k3"} else "k1"


# ---- syntax helpers -------------------------------------------------------------------------


def _value(statement: cst.CSTNode) -> cst.BaseExpression:
    if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
        return statement.value
    if isinstance(statement, cst.AugAssign) and isinstance(statement.operator, (cst.AddAssign, cst.SubtractAssign)):
        return statement.value
    if isinstance(statement, cst.AnnAssign) and statement.value is not None:
        return statement.value
    if isinstance(statement, cst.Return) and statement.value is not None:
        return statement.value
    raise _Refused("klaudit rewrites assignments and returns only")


def _set_value(statement: cst.CSTNode, value: cst.BaseExpression) -> cst.CSTNode:
    return statement.with_changes(value=value)


def _walk(node: cst.CSTNode | None):
    stack = [node] if node is not None else []
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.children)


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


def _is_sum(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract))


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
        stack.extend(current.children)


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


def _method(node: cst.CSTNode | None, name: str) -> tuple[cst.Call, cst.BaseExpression] | None:
    """(the call, its receiver) of `receiver.name(...)`."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == name:
        return node, node.func.value
    return None


def _masked(node: cst.BaseExpression | None, holds) -> tuple | None:
    """(operand, mask) of `operand * mask` or `mask * operand`, the operand holding the KL term."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        if holds(node.left) and not holds(node.right):
            return node.left, node.right
        if holds(node.right) and not holds(node.left):
            return node.right, node.left
    return None


def _same(a: cst.CSTNode | None, b: cst.CSTNode | None) -> bool:
    return a is not None and b is not None and a.deep_equals(b)


def _reduction(node: cst.BaseExpression, holds, modes=lambda call, mode: set()) -> Reduction | None:
    """The reductions of a per-token term the fix can keep the scale of (see the module docstring).
    `modes(call, mode)` is the set of strings an aggregator's mode argument may hold."""
    if not holds(node):
        return None
    if isinstance(node, cst.Call) and dotted(node.func).rsplit(".", 1)[-1] in _MASKED_MEANS:
        args = _call_args(node, ("values", "mask"))  # masked_mean(x, mask): a mean over every masked token
        if args is not None and len(args) == 2 and holds(args["values"]):
            return Reduction(BATCH_MEAN, node, args["values"], mask=args["mask"])
        return None
    if isinstance(node, cst.Call) and dotted(node.func).rsplit(".", 1)[-1] in _AGGREGATORS:
        return _aggregator(node, holds, modes)
    mean = _method(node, "mean")
    if mean is not None:
        per_sequence = None if mean[0].args else _per_sequence_mean(mean[1], holds)
        if per_sequence is not None:  # masked_mean(x, mask, dim=-1).mean()
            return Reduction(SEQ_MEAN, node, per_sequence["values"], mask=per_sequence["mask"])
        return _mean_reduction(mean[0], mean[1], holds) if not mean[0].args else None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
        total = _method(node.left, "sum")
        masked = _masked(total[1] if total else None, holds)
        if total is None or masked is None or total[0].args or holds(node.right):
            return None
        count = _method(node.right, "sum")
        if count is not None and _same(count[1], masked[1]) and not count[0].args:
            return Reduction(BATCH_MEAN, node, masked[0], mask=masked[1])
        return Reduction(CONSTANT, node, masked[0], mask=masked[1], divisor=node.right)
    total = _method(node, "sum")
    masked = _masked(total[1] if total else None, holds)
    if total is not None and masked is not None and not total[0].args:
        return Reduction(TOTAL_SUM, node, masked[0], mask=masked[1])
    return None


_AGGREGATORS = {"agg_loss": ("loss_mat", "loss_mask", "loss_agg_mode"), "aggregate_loss": ("loss", "loss_mask")}
# verl's loss_agg_mode values whose KL scale the estimator's `.loss` can keep: the batch token-mean,
# the per-sequence token-mean (replaced by the batch token-mean, as the catalog's fix for KL007), and
# the token-sum divided by the padded length. seq-mean-token-sum divides by the number of non-empty
# sequences, which no reduction of `.loss` spells exactly.
_AGG_MODES = {"token-mean": BATCH_MEAN, "seq-mean-token-mean": SEQ_MEAN, "seq-mean-token-sum-norm": CONSTANT}


def _call_args(call: cst.Call, names: tuple) -> dict | None:
    """The arguments of `call` by parameter name, for a signature `names` (positional or keyword);
    None when it passes anything else (`*args`, `**kwargs`, an unknown keyword)."""
    found: dict = {}
    for index, arg in enumerate(call.args):
        if arg.star:
            return None
        name = arg.keyword.value if arg.keyword else (names[index] if index < len(names) else None)
        if name not in names or name in found:
            return None
        found[name] = arg.value
    return found


def _aggregator(call: cst.Call, holds, modes) -> Reduction:
    """verl's `agg_loss(loss_mat, loss_mask, loss_agg_mode)` and OpenRLHF's `aggregate_loss(loss, mask)`
    (its default, a batch token-mean), with no argument that rescales them (data-parallel size, a
    global token count): the reduction their mode spells."""
    name = dotted(call.func).rsplit(".", 1)[-1]
    params = _AGGREGATORS[name]
    args = _call_args(call, params)
    if args is None:
        extra = [arg.keyword.value if arg.keyword else ("**" if arg.star == "**" else "*") + _code_of(arg.value)
                 for arg in call.args if arg.star or arg.keyword and arg.keyword.value not in params]
        raise _Refused(f"`{name}` is also given {', '.join(extra) or 'more arguments'}, which can change its scale "
                       "(a global token count, the data-parallel size): the fix would not keep it")
    if params[0] not in args or params[1] not in args or not holds(args[params[0]]):
        raise _Refused(f"the KL term passes through `{name}`, whose arguments klaudit does not recognise")
    operand, mask = args[params[0]], args[params[1]]
    if name == "aggregate_loss":
        return Reduction(BATCH_MEAN, call, operand, mask=mask)
    mode = args.get("loss_agg_mode")
    values = {str(mode.evaluated_value)} if isinstance(mode, cst.SimpleString) else \
        modes(call, mode) if mode is not None else set()
    if len(values) != 1:
        shown = ", ".join(sorted(f'"{value}"' for value in values)) or "a value klaudit cannot read"
        raise _Refused(f"the scale of `agg_loss` depends on its loss_agg_mode ({shown}), which the code reads "
                       "from its configuration: write the reduction of the mode you run by hand")
    [value] = values
    if value == "seq-mean-token-sum":
        raise _Refused("agg_loss's loss_agg_mode \"seq-mean-token-sum\" divides by the number of non-empty "
                       "sequences, which no reduction of the estimator's loss spells exactly")
    if value not in _AGG_MODES:
        raise _Refused(f"agg_loss's loss_agg_mode \"{value}\" is not one klaudit knows the scale of")
    kind = _AGG_MODES[value]
    if kind == CONSTANT:
        divisor = cst.parse_expression(f"{_atom(_code_of(mask))}.shape[-1]")
        return Reduction(CONSTANT, call, operand, mask=mask, divisor=divisor)
    return Reduction(kind, call, operand, mask=mask)


def _code_of(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node).strip()


def _modes(call: cst.Call, mode: cst.BaseExpression, roles: StatementRoles) -> set:
    """The strings an aggregator's mode may hold here: those the analysis knows it holds, or the values
    of the switch it names under which the KL terms leave the aggregator (one each, by the analysis)."""
    known = roles.texts.get(id(mode), set())
    if known:
        return set(known)
    name = dotted(mode).rsplit(".", 1)[-1]
    return {value for switch, values in roles.switches.get(id(call), set()) if switch == name
            for value in values if isinstance(value, str)}


def _per_sequence_mean(node: cst.BaseExpression, holds) -> dict | None:
    """The arguments of `masked_mean(x, mask, dim=-1)` (or axis=1): one token-mean per sequence, x
    holding the KL term; None for anything else."""
    if not (isinstance(node, cst.Call) and dotted(node.func).rsplit(".", 1)[-1] in _MASKED_MEANS):
        return None
    args = _call_args(node, ("values", "mask", "dim"))
    if args is None:
        args = _call_args(node, ("values", "mask", "axis"))
        if args is not None and "axis" in args:
            args["dim"] = args.pop("axis")
    if args is None or set(args) != {"values", "mask", "dim"} or not holds(args["values"]):
        return None
    dim = args["dim"]
    last = isinstance(dim, cst.UnaryOperation) and isinstance(dim.operator, cst.Minus) and \
        isinstance(dim.expression, cst.Integer) and dim.expression.value == "1"
    return args if last or isinstance(dim, cst.Integer) and dim.value == "1" else None


def _mean_reduction(node: cst.Call, mean_of: cst.BaseExpression, holds) -> Reduction | None:
    """`((x * m).sum(d) / m.sum(d)).mean()` (per-sequence token-mean) or `(x * m).sum(d).mean()`
    (mean of per-sequence sums)."""
    if isinstance(mean_of, cst.BinaryOperation) and isinstance(mean_of.operator, cst.Divide):
        total, count = _method(mean_of.left, "sum"), _method(mean_of.right, "sum")
        masked = _masked(total[1] if total else None, holds)
        if total and count and masked and _same(count[1], masked[1]) and total[0].args and _same_args(total[0], count[0]):
            return Reduction(SEQ_MEAN, node, masked[0], mask=masked[1])
        return None
    total = _method(mean_of, "sum")
    masked = _masked(total[1] if total else None, holds)
    if total is not None and masked is not None and total[0].args:
        return Reduction(SEQ_SUM, node, masked[0], mask=masked[1])
    return None


_SAME_SHAPE = ("detach", "float", "double", "clone", "contiguous", "to")


def _check_per_token(leaf: cst.BaseExpression, holds) -> None:
    """The KL leaf must be the per-token estimate itself: not a slice or reduction of it, and not the
    result of a function it was handed to (which may do anything with it)."""
    if isinstance(leaf, cst.Call):
        if isinstance(leaf.func, cst.Attribute) and holds(leaf.func.value):
            if leaf.func.attr.value not in _SAME_SHAPE:
                raise _Refused(f"the KL term is reshaped or reduced here (`.{leaf.func.attr.value}()`)")
            return
        if any(holds(arg.value) for arg in leaf.args):
            raise _Refused(f"the KL term passes through `{dotted(leaf.func) or 'a call'}`, whose result klaudit "
                           "cannot rewrite")
    if isinstance(leaf, cst.Subscript) and holds(leaf.value):
        raise _Refused("the KL term is indexed or sliced here")


def _same_args(a: cst.Call, b: cst.Call) -> bool:
    return len(a.args) == len(b.args) and all(x.deep_equals(y) for x, y in zip(a.args, b.args))


def _scale(code: Callable[[cst.CSTNode], str], reduction: Reduction) -> str:
    """The reduction of the per-sequence `.loss` with the KL scale of `reduction` (catalog.scaled_fix)."""
    assert reduction.mask is not None
    if reduction.kind in (BATCH_MEAN, SEQ_MEAN):
        return f".loss.sum() / {_atom(code(reduction.mask))}.sum()"
    if reduction.kind == SEQ_SUM:
        return ".loss.mean()"
    if reduction.kind == TOTAL_SUM:
        return ".loss.sum()"
    assert reduction.divisor is not None
    return f".loss.sum() / {_atom(code(reduction.divisor))}"


def _atom(code: str) -> str:
    """`code` as an operand of `.` or `/`: parenthesised unless it is a name, attribute, call or subscript."""
    try:
        node = cst.parse_expression(code)
    except cst.ParserSyntaxError:
        return f"({code})"
    return code if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or node.lpar else f"({code})"
