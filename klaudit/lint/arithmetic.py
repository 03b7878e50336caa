"""Operators: what `-x`, `a + b`, `a - b`, `a * b`, `a / b`, `x ** 2`, `m & n` make of KL terms.

Tensors add and multiply as polynomials in log-probability atoms (klaudit.lint.algebra), one
alternative with each compatible alternative of the other side. A KL term plus another loss term or
a score goes on; a term divided by a sequence length or a token count is averaged over it.
"""

from __future__ import annotations

import libcst as cst

from klaudit.catalog import Aggregation
from klaudit.lint import algebra as alg
from klaudit.lint import roles
from klaudit.lint.algebra import Poly
from klaudit.lint.facts import (
    NEG,
    UNKNOWN,
    Fact,
    bounded,
    combine,
    compatible,
    different_targets,
    operands,
    replace,
    separate_objectives,
)
from klaudit.lint.flowstate import FlowState
from klaudit.lint.syntax import last_name, walk
from klaudit.lint.tensors import normalised, without_stabilizer

# A squashing function of a per-token log-ratio (`gate = sigmoid(beta * delta)`): a weight that varies
# with the log-ratio, so a KL term multiplied by it is no catalog estimator.
KL_WEIGHT = (Fact(role="kl-weight"),)


class ArithmeticFlow(FlowState):
    """Unary and binary operators on facts, for klaudit.lint.flow.FunctionRun."""

    def e_UnaryOperation(self, node: cst.UnaryOperation) -> tuple:
        value = self.expr(node.expression)
        if isinstance(node.operator, cst.Minus):
            out = []
            for f in operands(value):
                if f.role == "neg":
                    out.append(UNKNOWN)
                elif f.poly is not None:
                    out.append(replace(f, poly=alg.scale(f.poly, -1.0)))
                else:
                    out.append(NEG[0])
            return tuple(dict.fromkeys(out))
        if isinstance(node.operator, cst.Not) or isinstance(node.operator, cst.BitInvert):
            return tuple(f for f in value if f.role == "mask")
        return value

    def e_BinaryOperation(self, node: cst.BinaryOperation) -> tuple:
        return self.binary(self.expr(node.left), self.expr(node.right), node.operator, node)

    def binary(self, left: tuple, right: tuple, op, node) -> tuple:
        name = type(op).__name__.replace("Assign", "")
        if name in ("Add", "Subtract"):
            return self.additive(left, right, -1.0 if name == "Subtract" else 1.0, node)
        if name == "Multiply":
            if isinstance(node, cst.BinaryOperation):  # `d * d`, `0.5 * d * d`: one value times itself
                if node.left.deep_equals(node.right):
                    return self.square(left, node)
                inner = node.left
                if isinstance(inner, cst.BinaryOperation) and isinstance(inner.operator, cst.Multiply) \
                        and inner.right.deep_equals(node.right):
                    return self.multiply(self.expr(inner.left), self.square(right, node), node)
            return self.multiply(left, right, node)
        if name == "Divide":
            return self.divide(left, right, node)
        if name == "Power":
            exponent = [f.poly.const_value() for f in right if f.poly is not None]
            if exponent and exponent[0] == 2.0:
                return self.square(left, node)
            return ()
        if name in ("BitAnd", "BitOr"):
            return tuple(f for f in left + right if f.role == "mask")[:1]
        return ()

    def additive(self, left: tuple, right: tuple, sign: float, node) -> tuple:
        counts = tuple(f for f in left + right if f.role in ("length", "ntokens"))
        if counts:
            return counts  # a token count plus an epsilon is still the count
        carrier, shown = _straight_through(node) if sign > 0 else (None, None)
        if carrier is not None and (shown is None or not any(f.poly is not None and f.poly.has_grad()
                                                               for f in self.expr(shown))):
            # `x + (y - x.detach())`: y's value with x's gradient (a loss renormalised by an all-reduced count,
            # a quantised value): the gradient is x's, each of x's alternatives with itself
            return left if carrier == "left" else right
        if sign < 0 and (log_probs := normalised(left, right)):
            return log_probs
        if batch_statistic_of(right, left) or (sign < 0 and _names_mean(_operand(node, left=False))
                                                and mean_of_the_same(right, left)):
            return left  # returns minus their batch mean (whitening): a baseline, the per-token terms go on
        out = []
        for a in operands(left):
            for b in operands(right):
                if not compatible(a.labels, b.labels):
                    continue  # the two values of no one path (a value left where a branch did not run)
                if "none" in (a.role, b.role):
                    continue  # `None - x` raises: a helper's `return None` path reaches no sum
                a_poly, b_poly = _tensor_poly(a), _tensor_poly(b)
                if a_poly is not None and b_poly is not None:
                    a_poly, b_poly = _at_one_level(a_poly, b_poly), _at_one_level(b_poly, a_poly)
                    if a.scalar != b.scalar and a.is_kl() and b.is_kl():
                        # a per-token term minus a batch statistic of it (a baseline): the term goes on
                        out.append(replace(b, poly=alg.scale(b_poly, sign)) if a.scalar else a)
                        continue
                    if a.is_kl() and b.is_kl() and (different_targets(a, b) or separate_objectives(a, b)):
                        # a distillation term to a teacher beside a KL to the reference, or two KL losses under
                        # switches of their own: two objectives, not one estimator; each goes on alone, to be
                        # judged on its own
                        out += [replace(a, beside=True), replace(b, poly=alg.scale(b_poly, sign), beside=True)]
                        continue
                    out.append(combine(a, b, alg.add(a_poly, b_poly, sign), self.here(node), self.module.path))
                elif _constant(a if a_poly is not None else b) and UNKNOWN.role in (a.role, b.role):
                    continue  # a number plus a value the analysis cannot explain: no known value
                elif a_poly is not None:
                    out.append(replace(a, beside=True))  # a KL term plus another loss term or a score: the KL term goes on
                elif b_poly is not None:
                    out.append(replace(b, poly=alg.scale(b_poly, sign), beside=True))
        return bounded(tuple(dict.fromkeys(out)))

    def multiply(self, left: tuple, right: tuple, node) -> tuple:
        counts = tuple(f for f in left + right if f.role in ("length", "ntokens"))
        if counts and not any(f.role == "tensor" and f.poly is not None and not f.poly.is_const() for f in left + right) \
                and not _names_a_loss(node):
            return counts  # a token count times a number (`len(tokens) * G`) still counts each sequence's tokens
        out = []
        negative_unknown = False
        for a in operands(left):
            for b in operands(right):
                a_poly, b_poly = _tensor_poly(a), _tensor_poly(b)
                if _weighted_by_advantage(a, b, node):
                    # `logp * advantages`, `-advantages * ratio` or `-log_ratio * advantages` (the ratio taken to
                    # the reference), the advantages a value of no KL: a policy-gradient term, whatever KL term is
                    # added to it; a ratio to the behaviour policy stays, which says the samples are older. Another
                    # unexplained factor stays too: a token weight on the ratio inside an estimator (TR-GRPO's
                    # w * ref/pi - log(w * ref/pi) - 1) is read as that estimator
                    continue
                if a_poly is not None and b_poly is not None:
                    if (a.beside or b.beside) and a.is_kl() and b.is_kl():
                        # (x + d)^2 with x a value the analysis does not follow (FlowRL's log Z - beta R):
                        # the cross term 2 x d is no estimator, and it is most of the product's gradient
                        continue
                    if compatible(a.labels, b.labels):
                        out.append(combine(a, b, alg.mul(a_poly, b_poly), self.here(node), self.module.path, product=True))
                elif not compatible(a.labels, b.labels):
                    continue
                elif a_poly is not None or b_poly is not None:
                    tensor_side, other, poly = (a, b, a_poly) if a_poly is not None else (b, a, b_poly)
                    assert poly is not None
                    if _constant(tensor_side) and other.role == UNKNOWN.role:
                        # `x * inv_temperature`: a number times an unexplained value is no known value, but for its
                        # sign: `-1 * self.kl_coeff` (tril's KL reward) is minus a coefficient, as `-self.kl_coeff` is
                        negative_unknown = negative_unknown or (poly.const_value() or 0.0) < 0
                        continue
                    if other.role == KL_WEIGHT[0].role and tensor_side.is_kl():
                        continue  # a KL term weighted per token by a function of a log-ratio: no estimator
                    if other.role == "critic" and tensor_side.is_kl():
                        # sg(V - r + tau * log-ratio) * V: the gradient of a critic's squared error to the target
                        # r - tau * log(pi/ref) (DRO-V's value loss); the KL is the critic's target, not a penalty
                        continue
                    factor = -1.0 if other.role == "neg" else 1.0
                    out.append(replace(tensor_side, poly=alg.scale(poly, factor)))
                elif (a.role == "neg") != (b.role == "neg"):
                    negative_unknown = True
        if not out and negative_unknown:
            return NEG
        return bounded(tuple(dict.fromkeys(out)))

    def square(self, value: tuple, node) -> tuple:
        """`x ** 2`: each value of x times itself. x's values on different paths (a log-ratio from one branch, its
        spelling from another) are never multiplied together: no path squares one value by another."""
        return bounded(tuple(dict.fromkeys(f for alternative in operands(value)
                                           for f in self.multiply((alternative,), (alternative,), node))))

    def divide(self, left: tuple, right: tuple, node) -> tuple:
        out = []
        for f in left:
            if f.role != "tensor":
                continue
            divisors = [g for g in right if compatible(g.labels, f.labels)]  # on the paths both hold on
            # `p_ref / p_pi` of the sampled tokens' probabilities: exp(Q - P); a probability floored or offset to keep
            # the division finite (`exp(logp).clamp(min=1e-8)`, `p + 1e-10`) clamps no KL, as a safe log of one does not
            ratios = [replace(f, poly=ratio, clamped=False) for g in divisors
                      if f.poly is not None and g.role == "tensor" and g.poly is not None
                      and (ratio := alg.probability_ratio(f.poly, without_stabilizer(g.poly))) is not None]
            if ratios:
                out.extend(ratios)
                continue
            if any(g.role == "length" for g in divisors):  # a packed row's length is the batch's token count
                f = replace(f, aggregation=Aggregation.BATCH_MEAN if f.packed else Aggregation.SEQ_MEAN)
            elif any(g.role == "ntokens" for g in divisors):
                f = replace(f, aggregation=Aggregation.BATCH_MEAN if f.aggregation in (None, Aggregation.SUM) else f.aggregation)
            elif any(g.role == "tensor" and g.poly is not None and not g.poly.is_const() for g in divisors):
                continue
            out.append(f)
        return tuple(out)


def batch_statistic_of(statistic: tuple, value: tuple) -> bool:
    """Whether `statistic` is a batch-wide reduction of `value` itself (`masked_mean(adv, mask)` taken
    off `adv`): each of its alternatives is one of the per-token alternatives of `value`, reduced to a
    scalar. Subtracting it is a baseline, whose expected contribution to the gradient is ~0. Alternatives of
    the statistic without a KL term (the mean over a mask the analysis also reads as zeros) do not count."""
    reduced = [f for f in statistic if f.role == "tensor" and f.poly is not None and f.is_kl()]
    if not reduced:
        return False
    per_token = {f.poly for f in value if f.role == "tensor" and f.poly is not None and not f.scalar}
    return all(f.scalar and f.poly in per_token and not f.poly.is_const() for f in reduced)


def mean_of_the_same(statistic: tuple, value: tuple) -> bool:
    """Whether every KL alternative of `statistic` is one of `value`'s own: a mean the code took of the same
    values in Python (`mean = sum(advantages) / T` over a list of per-turn advantages), which the analysis
    does not see reduced."""
    reduced = [f.poly for f in statistic if f.role == "tensor" and f.poly is not None and f.is_kl()]
    own = {f.poly for f in value if f.role == "tensor" and f.poly is not None}
    return bool(reduced) and all(poly in own for poly in reduced)


def _names_mean(operand: cst.CSTNode | None) -> bool:
    """An operand named for a mean or a baseline (`mean`, `adv_mean`, `baseline`): what is subtracted to centre."""
    name = last_name(operand) if isinstance(operand, (cst.Name, cst.Attribute)) else None
    return name is not None and roles.names_baseline(name)


def _at_one_level(stored: Poly, policy: Poly) -> Poly:
    """The reference's or an older policy's log-probs, per token, taken from the policy's log-prob of a whole
    sequence (`seq_logp - ref_logps`, the stored values cached one per sequence): one value per sequence too,
    as the tensors' shapes must agree; any other operand as it is."""
    if len(stored.terms) != 1 or len(policy.terms) != 1 or len(stored.terms[0][0]) != 1 or len(policy.terms[0][0]) != 1:
        return stored
    (kept,), (lead,) = stored.terms[0][0], policy.terms[0][0]
    if kept.kind in (alg.REF, alg.OLD) and not kept.grad and kept.acc == alg.TOKEN \
            and lead.kind == alg.POLICY and lead.acc in (alg.SEQUENCE, alg.SEQUENCE_MEAN):
        return alg.accumulate(stored, lead.acc)
    return stored


def _tensor_poly(fact: Fact) -> Poly | None:
    """The polynomial of a tensor fact; None for any other fact (a mask, a length, a sign)."""
    return fact.poly if fact.role == "tensor" else None


def _operand(node: cst.CSTNode, left: bool) -> cst.CSTNode | None:
    """The left or right operand of a binary operation, None for any other node."""
    if not isinstance(node, cst.BinaryOperation):
        return None
    return node.left if left else node.right


def _names_a_loss(node: cst.CSTNode) -> bool:
    """An operand named for a loss (`-out.loss * n_tokens`, `nll * lengths`): a mean over the tokens times their
    count is a sum over them (a sequence's log-prob from a model's built-in cross-entropy), not a count."""
    return any(isinstance(operand, (cst.Name, cst.Attribute)) and roles.sink_of_name(last_name(operand) or "") == "loss"
               for side in (True, False) if (operand := _unsigned(_operand(node, left=side))) is not None)


def _unsigned(node: cst.CSTNode | None) -> cst.CSTNode | None:
    """`x` for `-x`; any other node as it is."""
    return node.expression if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) else node


def _names_advantage(expression: cst.CSTNode | None) -> bool:
    """An operand that names an advantage (`advantages`, `-mb_adv.unsqueeze(-1)`): a policy-gradient weight."""
    return any(isinstance(inner, cst.Name) and roles.names_advantage(inner.value) for inner in walk(expression))


def _weighted_by_advantage(a: Fact, b: Fact, node: cst.CSTNode) -> bool:
    """One operand a term of the policy's and the reference's log-probs, the other named an advantage and
    holding no KL (a value the analysis does not explain, its negation, an argument it took for a switch
    value, or numbers): the product is the policy-gradient part of a loss."""
    for term, weight, weight_is_left in ((a, b, False), (b, a, True)):
        poly = _tensor_poly(term)
        if poly is None or poly.is_const() or not _of_policy_and_reference(poly):
            continue
        no_kl = weight.role in (UNKNOWN.role, "neg", "str") or _constant(weight)
        if no_kl and _names_advantage(_operand(node, weight_is_left)):
            return True
    return False


def _of_policy_and_reference(poly: Poly) -> bool:
    """Made of the policy's and the reference's log-probs only: log pi, log ref, their log-ratio and its exp."""
    return all(atom.kind in _POLICY_AND_REFERENCE for atom in poly.atoms())


_POLICY_AND_REFERENCE = frozenset({alg.POLICY, alg.REF, alg.DELTA, alg.RATIO, alg.INV_RATIO})


def _straight_through(node: cst.CSTNode) -> tuple[str | None, cst.BaseExpression | None]:
    """Where a sum is the straight-through form `x + (y - x).detach()` or `x + (y - x.detach())`, either way round:
    which operand carries its gradient, "left" or "right" (x's side), and, in the second form, y, whose gradient
    the sum also carries unless it has none; (None, None) for any other sum."""
    if type(node) is not cst.BinaryOperation or type(node.operator) is not cst.Add:
        return None, None
    for carrier, x, other in (("left", node.left, node.right), ("right", node.right, node.left)):
        if type(other) is cst.BinaryOperation and type(other.operator) is cst.Subtract and _detached(other.right, x):
            return carrier, other.left
        inner = other.func.value if isinstance(other, cst.Call) and isinstance(other.func, cst.Attribute) else None
        if _detached(other, None) and isinstance(inner, cst.BinaryOperation) \
                and type(inner.operator) is cst.Subtract and inner.right.deep_equals(x):
            return carrier, None
    return None, None


def _detached(node: cst.BaseExpression, of: cst.BaseExpression | None) -> bool:
    """`v.detach()` (of `of` where given)."""
    return (type(node) is cst.Call and not node.args and type(node.func) is cst.Attribute
            and node.func.attr.value == "detach" and (of is None or node.func.value.deep_equals(of)))


def _constant(fact: Fact) -> bool:
    """A number (a literal, or arithmetic of literals): no tensor of the trainer."""
    return fact.role == "tensor" and fact.poly is not None and fact.poly.is_const()
