"""Where the KL term sits in a statement a fix rewrites: the additive steps above it, the reductions
around it that a fix recognises (each with the estimator term that keeps its KL scale), and the node
inside the term that holds the KL (`Descent`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from klaudit.catalog import Aggregation
from klaudit.lint.evidence import StatementRoles
from klaudit.lint.fixsite import FixSite, Refused
from klaudit.lint.syntax import dotted, string_value

# Reductions the fix recognises, with the estimator term that keeps their KL scale.
BATCH_MEAN, SEQ_MEAN, SEQ_SUM, TOTAL_SUM, CONSTANT = "batch-mean", "seq-mean", "seq-sum", "total-sum", "constant"
COMPATIBLE = {  # the lint's aggregation for the finding -> the reductions that spell it
    Aggregation.BATCH_MEAN: {BATCH_MEAN},
    Aggregation.SEQ_MEAN: {SEQ_MEAN},
    Aggregation.SUM: {SEQ_SUM, TOTAL_SUM, CONSTANT},
    Aggregation.CONSTANT: {SEQ_SUM, TOTAL_SUM, CONSTANT},
}
_MASKED_MEANS = ("masked_mean", "masked_token_mean")


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


class TermFinder(FixSite):
    """Finds the KL term of a statement, for klaudit.lint.autofix.Builder."""

    def _descend(self, value: cst.BaseExpression, origins: set, roles: StatementRoles) -> Descent:
        def holds(node: cst.CSTNode) -> bool:
            return not origins.isdisjoint(roles.kl.get(id(node), ()))

        if not holds(value):
            raise Refused("the analysis did not record where the KL term sits in this statement")
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
                    raise Refused("both operands of a sum hold the KL term" if left else
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
                    raise Refused("the reduction holds more than the KL term")
                descent.inner.append(reduction)
                return reduction.node
            if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
                node = node.expression
                continue
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Multiply, cst.Divide)):
                left, right = holds(node.left), holds(node.right)
                other = node.right if left else node.left
                if left == right or (right and isinstance(node.operator, cst.Divide)):
                    raise Refused("the KL term is multiplied by another KL term")
                if id(other) in roles.tensors:
                    self._check_factor(other, roles)
                node = node.left if left else node.right
                continue
            if isinstance(node, (cst.BinaryOperation, cst.BooleanOperation, cst.IfExp, cst.Comparison)):
                raise Refused("the KL term is combined with other terms in a way klaudit does not rewrite")
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
            raise Refused(f"the KL term is multiplied by `{code}`, which depends on the policy (a differentiable "
                           "ratio or log-probs): the product is a different estimator, rewrite it by hand")
        if shapes != {"scalar"}:
            raise Refused(f"the KL term is multiplied by `{code}`, a tensor with a value per token or sequence: "
                           "the estimator's per-sequence loss cannot carry those weights")


def _is_sum(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract))


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
        raise Refused(f"`{name}` is also given {', '.join(extra) or 'more arguments'}, which can change its scale "
                       "(a global token count, the data-parallel size): the fix would not keep it")
    if params[0] not in args or params[1] not in args or not holds(args[params[0]]):
        raise Refused(f"the KL term passes through `{name}`, whose arguments klaudit does not recognise")
    operand, mask = args[params[0]], args[params[1]]
    if name == "aggregate_loss":
        return Reduction(BATCH_MEAN, call, operand, mask=mask)
    mode = args.get("loss_agg_mode")
    values = {str(string_value(mode))} if isinstance(mode, cst.SimpleString) else \
        modes(call, mode) if mode is not None else set()
    if len(values) != 1:
        shown = ", ".join(sorted(f'"{value}"' for value in values)) or "a value klaudit cannot read"
        raise Refused(f"the scale of `agg_loss` depends on its loss_agg_mode ({shown}), which the code reads "
                       "from its configuration: write the reduction of the mode you run by hand")
    [value] = values
    if value == "seq-mean-token-sum":
        raise Refused("agg_loss's loss_agg_mode \"seq-mean-token-sum\" divides by the number of non-empty "
                       "sequences, which no reduction of the estimator's loss spells exactly")
    if value not in _AGG_MODES:
        raise Refused(f"agg_loss's loss_agg_mode \"{value}\" is not one klaudit knows the scale of")
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
                raise Refused(f"the KL term is reshaped or reduced here (`.{leaf.func.attr.value}()`)")
            return
        if any(holds(arg.value) for arg in leaf.args):
            raise Refused(f"the KL term passes through `{dotted(leaf.func) or 'a call'}`, whose result klaudit "
                           "cannot rewrite")
    if isinstance(leaf, cst.Subscript) and holds(leaf.value):
        raise Refused("the KL term is indexed or sliced here")


def _same_args(a: cst.Call, b: cst.Call) -> bool:
    return len(a.args) == len(b.args) and all(x.deep_equals(y) for x, y in zip(a.args, b.args))


def kl_scale(code: Callable[[cst.CSTNode], str], reduction: Reduction) -> str:
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
