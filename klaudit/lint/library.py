"""Library functions: what torch, numpy and framework functions and tensor methods do to KL terms.

Two tables say it: `FUNCTIONS` for functions given the tensor first (`torch.clamp(kl, ...)`,
`masked_mean(kl, mask)`, `F.kl_div(...)`), `METHODS` for methods of a tensor (`kl.clamp(...)`,
`kl.sum(-1)`, `kl.detach()`). Each name maps to an effect: a method of `LibraryFlow` (or a function
of the operation alone) that makes the facts of the result from the facts of the tensor operated on,
or declines the call (None: `torch.max(x, dim)` is no elementwise maximum). A function in neither
table, and no log-prob producer (`logprobs_from_logits`) or `zip` variant, holds nothing the analysis
follows.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from klaudit.catalog import Aggregation, Estimator
from klaudit.lint import algebra as alg
from klaudit.lint import roles
from klaudit.lint.algebra import Atom, Poly
from klaudit.lint.arithmetic import KL_WEIGHT
from klaudit.lint.callables import PASS_THROUGH, PASS_THROUGH_RECEIVERS
from klaudit.lint.containers import elements, enumerated, zipped
from klaudit.lint.facts import (
    Fact,
    detach_all,
    kl_targets,
    merge_labels,
    operands,
    replace,
    reversed_in_time,
    tensor,
    with_clamp,
)
from klaudit.lint.flowstate import FlowState
from klaudit.lint.syntax import (
    dotted,
    int_literal,
    is_zero_tensor,
    last_name,
    name_bindings,
    number_value,
    string_value,
    text_of,
    walk,
)
from klaudit.lint.tensors import apply_math, gather, log_sum_exp, over_vocab, per_token_from_logits

# a loss reduction held as a value the analysis cannot see into (`loss_agg_func`, `reduce_loss`, `loss_reducer`)
HELD_LOSS_REDUCER = re.compile(r"loss_?(agg|reduc)|(agg|reduc)\w*_loss", re.IGNORECASE)

# a Ray object handle named after what it holds: `action_log_probs_ref`, `base_action_log_probs_refs`
_RAY_HANDLE = re.compile(r"^(\w+?)_refs?$")

# keywords that name the tensor a library function operates on, when it is not passed positionally
TENSOR_KEYWORDS = ("loss_mat", "values", "input", "tensor", "x", "loss", "losses")


@dataclass(frozen=True)
class Operation:
    """A call of a library function or a tensor method, as an effect reads it."""

    name: str
    tensor: tuple  # the facts of the tensor operated on: a method's receiver, a function's first argument
    positional: list  # the positional arguments as written
    keywords: dict
    node: cst.Call
    method: bool  # a method of the tensor, else a function given the tensor first

    @property
    def rest(self) -> list:
        """The positional arguments after the tensor operated on."""
        return self.positional if self.method else self.positional[1:]


def _model_logits(op: Operation, no_grad: bool) -> tuple:
    """The logits of the policy (`model(ids)`, `self.policy(ids)`) or of the reference (`ref_model(ids)`) where `op`
    is a (log-)softmax of such a call: a model whose forward returns its logits (a nanoGPT's), as the softmax of any
    other output would fail; () otherwise, and for a reward model's or a critic's output."""
    if op.name not in ("log_softmax", "softmax"):
        return ()
    operand = op.node.func.value if op.method and isinstance(op.node.func, cst.Attribute) else \
        op.positional[0] if op.positional else None
    if type(operand) is not cst.Call or type(operand.func) not in (cst.Name, cst.Attribute):
        return ()
    path = dotted(operand.func)
    name = path.rsplit(".", 1)[-1]
    if roles.is_scoring_model(path):
        return ()
    if roles.names_reference_model(name):
        return (tensor(Poly.atom(Atom(alg.REF_LOGITS, False))),)
    return (tensor(Poly.atom(Atom(alg.LOGITS, not no_grad))),) if roles.names_policy_model(name) else ()


# the estimators never negative in exact arithmetic: the larger of one and 0 is the estimate itself
_NON_NEGATIVE = frozenset({Estimator.K2, Estimator.K3, Estimator.LOW_VAR_KL, Estimator.ABS, Estimator.K3_REVERSED,
                           Estimator.FULL, Estimator.FULL_FORWARD})


def _never_negative(value: tuple) -> bool:
    """Whether `value` holds KL estimates and each is a positive multiple of one of `_NON_NEGATIVE`."""
    estimates = [alg.match_estimator(f.poly.terms) for f in value if f.is_kl()]
    return bool(estimates) and all(found is not None and found[0] in _NON_NEGATIVE and found[1] > 0
                                   for found in estimates)


class LibraryFlow(FlowState):
    """Calls of library functions and tensor methods, for klaudit.lint.flow.FunctionRun."""

    def library_call(self, name: str, node: cst.Call) -> tuple:
        positional, keywords = self.args(node)
        # the tensor operated on: the first positional argument, or its keyword (agg_loss(loss_mat=...))
        first_node = positional[0] if positional else next((keywords[k] for k in TENSOR_KEYWORDS if k in keywords), None)
        first = self.expr(first_node) if first_node is not None else ()
        effect = FUNCTIONS.get(name)
        value = effect(self, Operation(name, first, positional, keywords, node, method=False)) if effect else None
        if value is not None:
            return value
        if name.endswith("_zip"):  # strict variants of zip
            return zipped([self.expr(arg) for arg in positional])
        if roles.LOGPROB_PRODUCERS.match(name):
            kinds = {a.kind for f in first if f.poly is not None for a in f.poly.atoms()}
            return per_token_from_logits(kinds, first) or ()
        if HELD_LOSS_REDUCER.search(name):
            # a reduction the configuration picked, out of sight (`self.loss_agg_func(kld, mask)`): the
            # term goes on as reduced over the batch's tokens; which mode, the analysis cannot say
            return self.aggregate("masked_mean", first, positional[:2], {})
        return ()

    def tensor_method(self, method: str, base: tuple, positional: list, keywords: dict, node: cst.Call) -> tuple:
        effect = METHODS.get(method)
        value = effect(self, Operation(method, base, positional, keywords, node, method=True)) if effect else None
        return value if value is not None else ()

    # ---- effects: the facts of the result, or None where the effect does not apply to the call ----

    def unchanged(self, op: Operation) -> tuple:
        """A new shape, dtype or device, masked or non-finite entries filled in: each element keeps its meaning."""
        return op.tensor

    def reshaped(self, op: Operation) -> tuple | None:
        """torch.masked_fill(x, m, v), not a method of a receiver the analysis does not know."""
        return op.tensor if _known_receiver(op.node) else None

    def copied(self, op: Operation) -> tuple | None:
        """torch.tensor(x) copies the values, not the graph; of a list, the values its entries hold."""
        if not _known_receiver(op.node):
            return None
        values = (entry for f in op.tensor for entry in (elements((f,)) if f.role == "tuple" else (f,)))
        return detach_all(tuple(dict.fromkeys(values)))

    def passed_through(self, op: Operation) -> tuple | None:
        """A conversion or a fetch that hands its one tensor back (TensorData.from_torch(x), ray.get(ref),
        np.asarray(x, dtype=np.float64)).
        What `ray.get(action_log_probs_ref)` fetches is named by the handle's name without its `_ref`: the
        policy's log-probs, computed remotely (no gradient), not the reference's that `_ref` would name."""
        if len(op.positional) == 1 and (op.name != "get" or dotted(op.node.func) == "ray.get"):  # `dtype=` aside
            handle = _RAY_HANDLE.match(last_name(op.node.args[0].value)) if op.name == "get" else None
            fetched = roles.named_tensor(handle.group(1), grad=False) if handle else None
            return (tensor(fetched),) if fetched is not None else op.tensor
        return None

    def detached(self, op: Operation) -> tuple:
        """No gradient; a host copy or a Python number (`.item()`, `.cpu()`) is a statistic."""
        if roles.LOGGING_METHODS.match(op.name):
            self.settle(op.tensor)
        return detach_all(op.tensor)

    def clamped(self, op: Operation) -> tuple:
        """A clamped tensor (a clamped token count is still the count); one a guard keeps inside, as it is."""
        return op.tensor if _never_cuts(op, self.func) else with_clamp(op.tensor)

    def elementwise(self, op: Operation) -> tuple:
        """exp, log, abs, ... of each element (klaudit.lint.reductions.unary_math), of a model's logits too."""
        return self.unary_math(op.name, op.tensor or _model_logits(op, self.no_grad), op.node)

    def squared(self, op: Operation) -> tuple:
        """x ** 2 spelled as square(x) or pow(x, 2); any other power is not followed."""
        if op.name == "square" or op.rest and int_literal(op.rest[0]) == 2:
            return self.square(op.tensor, op.node)
        return ()

    def reduced(self, op: Operation) -> tuple:
        """x.sum(dim), torch.mean(x, dim=...): klaudit.lint.reductions.reduce along that axis."""
        dim = op.rest[0] if op.rest else op.keywords.get("dim", op.keywords.get("axis"))
        return self.along_each_axis(op.tensor, dim, lambda part, per_row: self.reduce(part, op.name, per_row, op.node))

    def summed(self, op: Operation) -> tuple:
        """torch.sum reduces; the builtin sum adds the elements of a list (over its first axis)."""
        return self.stacked(op) if isinstance(op.node.func, cst.Name) else self.reduced(op)

    def aggregated(self, op: Operation) -> tuple:
        """A framework's masked mean or loss aggregator (klaudit.lint.reductions.aggregate)."""
        return self.aggregate(op.name, op.tensor, op.positional, op.keywords)

    def gathered(self, op: Operation) -> tuple:
        """x.gather(dim, index): the entries of the chosen tokens or positions (klaudit.lint.tensors.gather).
        Without an index it is a gather across processes (accelerate's `gather(kl)`): the same values."""
        index = op.rest[1] if len(op.rest) > 1 else op.keywords.get("index")
        if index is None:
            return op.tensor
        return gather(op.tensor, index)

    def taken_along(self, op: Operation) -> tuple:
        """take_along_dim(x, index, dim) of torch, take_along_axis of JAX, MLX and NumPy: a gather."""
        index = op.rest[0] if op.rest else op.keywords.get("indices")
        return gather(op.tensor, index)

    def flipped(self, op: Operation) -> tuple:
        return reversed_in_time(op.tensor)

    def accumulated(self, op: Operation) -> tuple:
        """cumsum of a flipped tensor: a reward-to-go, whose summed values are rewards."""
        self.confirm(tuple(f for f in op.tensor if f.flipped))
        return tuple(replace(f, poly=alg.accumulate(f.poly, alg.TO_GO), flipped=False) if f.flipped and f.poly is not None
                     else f for f in op.tensor)

    def multiplied(self, op: Operation) -> tuple:
        return self.multiply(op.tensor, self.expr(op.positional[0]), op.node) if op.positional else op.tensor

    def selected_by_mask(self, op: Operation) -> tuple:
        """masked_select(x, mask): the entries where the mask holds; summed, the masked sum of x * mask."""
        return self.multiply(op.tensor, self.expr(op.rest[0]), op.node) if op.rest else op.tensor

    def added(self, op: Operation) -> tuple:
        if not op.positional:
            return op.tensor
        return self.additive(op.tensor, self.expr(op.positional[0]), 1.0 if op.name == "add" else -1.0, op.node)

    def scattered_add(self, op: Operation) -> tuple | None:
        """torch.scatter_add(x, dim, index, src), x.index_add(dim, index, src): x with src added where
        index points (a sequence's score added at its last token of a KL reward): x + src, elementwise."""
        source = op.rest[2] if len(op.rest) > 2 else op.keywords.get("src", op.keywords.get("source"))
        if source is None or not (op.method or _known_receiver(op.node)):
            return None
        return self.additive(op.tensor, self.expr(source), 1.0, op.node)

    def divided(self, op: Operation) -> tuple:
        return self.divide(op.tensor, self.expr(op.positional[0]), op.node) if op.positional else op.tensor

    def stacked(self, op: Operation) -> tuple:
        """The terms of a list, side by side or added up: each keeps its meaning (rows stacked are a batch
        again; each sequence's own value added up over them is a batch total, a statistic, and their lengths
        the batch's token count); a stacked literal list keeps its positions too, for an index that picks one
        (kl_4BT[estimator]): pieces joined along an axis (`torch.cat`) and a list built by appending do not."""
        stacked = tuple(f for f in op.tensor if f.role == "tuple" and len(f.items) > 1) if "stack" in op.name else ()
        return stacked + tuple(dict.fromkeys(_batch_of(f, added=op.name == "sum") for f in elements(op.tensor)))

    def zipped(self, op: Operation) -> tuple:
        return zipped([self.expr(arg) for arg in op.positional])

    def enumerated(self, op: Operation) -> tuple:
        return enumerated(op.tensor)

    def extreme(self, op: Operation) -> tuple | None:
        """The elementwise larger or smaller of two tensors: either one; torch.max(x, dim) is the largest
        entry along an axis, no per-token term; the larger of x and a tensor of zeros is relu(x), a hinge (of a
        per-token KL, a weight; of any other KL estimate, that estimate clamped at 0)."""
        if len(op.positional) != 2:
            return None
        if op.name in ("max", "min") and int_literal(op.positional[1]) is not None:
            return ()
        zero = [i for i, arg in enumerate(op.positional) if is_zero_tensor(arg) or number_value(arg) == 0]
        if len(zero) == 1:
            other = self.expr(op.positional[1 - zero[0]])
            if op.name in ("max", "maximum") and _never_negative(other):
                return other  # `torch.maximum(k3, zeros)`: k3 itself, whatever rounding made negative aside
            if (hinge := _squashed(replace(op, tensor=other))) is not None:
                return hinge
            if op.name in ("max", "maximum") and any(f.is_kl() for f in other):
                return with_clamp(other)  # `max(0.0, kl)`: the estimate clamped at 0 (a negative one loses its signal)
        return tuple(dict.fromkeys(operands(op.tensor) + operands(self.expr(op.positional[1]))))

    def selected(self, op: Operation) -> tuple | None:
        return self.where(*op.positional) if len(op.positional) == 3 else None

    def token_cross_entropy(self, op: Operation) -> tuple | None:
        """F.cross_entropy(logits, tokens, reduction="none") is -log pi(token) at each position (so is
        F.nll_loss of the log_softmax): minus the sampled tokens' log-probs. Reduced, it is a loss of its own."""
        reduction = op.keywords.get("reduction")
        if not isinstance(reduction, cst.SimpleString) or string_value(reduction) != "none":
            return None
        kinds = {a.kind for f in op.tensor if f.poly is not None for a in f.poly.atoms()}
        logp = per_token_from_logits(kinds, op.tensor)
        return tuple(replace(f, poly=alg.scale(f.poly, -1.0)) for f in logp if f.poly is not None) if logp else None

    def kl_div_of(self, op: Operation) -> tuple:
        return self.kl_div(op.positional, op.keywords, op.node)

    def loss_module_call(self, module: Fact, node: cst.Call) -> tuple:
        """A call of a library's loss object: its function, with the keywords it was built with."""
        positional, keywords = self.args(node)
        built = self.args(module.origin)[1] if isinstance(module.origin, cst.Call) else {}
        return self.kl_div(positional, {**built, **keywords}, node)

    def where(self, condition, when_true, when_false) -> tuple:
        """torch.where(m, a, b): a or b. Labelled by the mask's name, so that where(m, a, b) and
        where(~m, a, b) in one expression pick opposite sides (a DPO pair's chosen and rejected)."""
        negated = isinstance(condition, cst.UnaryOperation) and isinstance(condition.operator, (cst.BitInvert, cst.Not))
        name = dotted(condition.expression if negated else condition)
        sides = [self.expr(when_true), self.expr(when_false)]
        for kept, cut in (sides, sides[::-1]):
            if kept and any(f.poly is not None and f.poly.has_grad() for f in kept) and detach_all(kept) == cut:
                # where(m, x, x.detach()): x, with its gradient cut on the tokens the condition rejects
                return with_clamp(kept)
        if _clamps(condition, when_true, when_false):
            # where(x < 0, 0, x), where(x > c, c, x): a clamp of x written out
            kept = sides[0] if number_value(when_false) is not None else sides[1]
            return with_clamp(kept)
        if {number_value(when_true), number_value(when_false)} == {0.0, 1.0}:
            return (Fact(role="mask"),)  # where(tokens != pad, 1, 0): the test as a 0/1 mask
        filled = (sides[0] and _fill(when_false)) or (sides[1] and _fill(when_true))
        if filled and (not name or any(f.role == "mask" for f in self.expr(condition))):
            # where(tokens != pad, logp, 0), where(mask, x, zeros_like(x)): a padding fill, which no switch names: the
            # tensor on the tokens kept (else each use would pair it with the fill, `logp - 0`)
            return sides[0] if _fill(when_false) else sides[1]
        if name:
            sides = [tuple(replace(f, labels=merge_labels(f.labels, ((name, (side != negated,)),))) for f in facts)
                     for side, facts in zip((True, False), sides)]
        return tuple(dict.fromkeys(sides[0] + sides[1]))

    def kl_div(self, positional, keywords, node) -> tuple:
        """F.kl_div(input, target) is target * (log(target) - input), and with log_target=True
        target.exp() * (target - input): KL(target || input) either way (a target of softmax probabilities
        is read as probabilities, one of log-probs as log-probs). Reduced, it sums over the vocabulary; over the
        positions its `mean` or `batchmean` of one sequence's rows divides by that sequence's length."""
        if len(positional) < 2 and "target" not in keywords:
            return ()
        source = self.expr(positional[0] if positional else keywords["input"])
        target = self.expr(positional[1] if len(positional) > 1 else keywords["target"])
        reduction = keywords.get("reduction")
        how = string_value(reduction) if isinstance(reduction, cst.SimpleString) else "mean" if reduction is None else ""
        elementwise = how == "none"
        out = []
        for t in target:
            for s in source:
                if t.poly is None or s.poly is None:
                    continue
                kinds = {a.kind for a in t.poly.atoms()}
                probabilities = bool(kinds) and kinds <= {alg.VOCAB_PROB, alg.VOCAB_REF_PROB}
                prob, log_prob = (t.poly, apply_math("log", t.poly)) if probabilities else (apply_math("exp", t.poly), t.poly)
                if prob is None or log_prob is None:
                    continue
                poly = alg.mul(prob, alg.add(log_prob, s.poly, -1.0))
                if not elementwise:
                    summed = over_vocab(poly)
                    if summed is None or not summed.terms:
                        continue
                    poly = summed
                fact = replace(t, poly=poly, origin=self.here(node), origin_path=self.module.path, against=kl_targets(node, t, s))
                # a mean over one sequence's [L, V] rows (`batchmean` divides by L) is its token mean; else a sum,
                # as `batchmean` of the [1, L, V] logits of a function or loop that encodes one text (divided by 1)
                per_sequence = s.row and (how == "mean" or how == "batchmean" and not self.one_text_at_a_time())
                out.append(fact if elementwise else replace(
                    fact, aggregation=Aggregation.SEQ_MEAN if per_sequence else Aggregation.SUM))
        return tuple(out)


def _squashed(op: Operation) -> tuple | None:
    """sigmoid, tanh, ... of a per-token KL term: a weight that varies with the log-ratio; relu of an estimate that is
    never negative (`torch.relu(r - 1 - log r)`, against rounding) is that estimate."""
    if op.name == "relu" and _never_negative(op.tensor):
        return op.tensor
    if any(f.is_kl() and not f.scalar and all(a.acc == alg.TOKEN for a in f.poly.atoms()) for f in op.tensor):
        return KL_WEIGHT
    return None


def _never_cuts(op: Operation, func: cst.FunctionDef | None) -> bool:
    """`x.clamp(-c, c)` in a function that skips every value outside it first, `if abs(x...) > c: continue`
    (minstar/BIOAgents drops a sample whose log-ratio passes 5 before clamping it to [-5, 5]): the clamp never
    cuts, and the estimate keeps its gradient everywhere."""
    bounds = [_signed(arg) for arg in op.rest[:2]]
    if func is None or len(bounds) != 2 or bounds[0] is None or bounds[1] is None or bounds[0] != -bounds[1]:
        return False
    clamped = op.node.func.value if op.method and isinstance(op.node.func, cst.Attribute) else \
        op.positional[0] if op.positional else None
    name = dotted(clamped).split(".")[0] if clamped is not None else ""
    return bool(name) and any(_skips_beyond(node, name, bounds[1]) for node in walk(func.body) if type(node) is cst.If)


def _skips_beyond(branch: cst.If, name: str, bound: float) -> bool:
    """`if abs(name...) > bound: continue` (or `>=`, `return`, `break`): the code after it sees |name| <= bound."""
    lines = branch.body.body if type(branch.body) is cst.IndentedBlock else [branch.body]
    smalls = [small for line in lines if isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite))
              for small in line.body]
    exits = len(lines) == len(smalls) == 1 and type(smalls[0]) in (cst.Continue, cst.Return, cst.Break)
    test = branch.test
    if not exits or branch.orelse is not None or type(test) is not cst.Comparison or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    inside = test.left
    return type(target.operator) in (cst.GreaterThan, cst.GreaterThanEqual) and _signed(target.comparator) == bound \
        and type(inside) is cst.Call and dotted(inside.func) in ("abs", "torch.abs") and len(inside.args) == 1 \
        and dotted(inside.args[0].value).split(".")[0] == name


def _signed(node: cst.CSTNode) -> float | None:
    """A numeric literal's value, negated ones (-5.0) too."""
    if type(node) is cst.Arg:
        node = node.value
    if type(node) is cst.UnaryOperation and type(node.operator) is cst.Minus:
        value = number_value(node.expression)
        return None if value is None else -value
    return number_value(node)


def _clamps(condition: cst.BaseExpression, when_true: cst.BaseExpression, when_false: cst.BaseExpression) -> bool:
    """torch.where(x < a, b, x) or where(x > a, b, x) (either side), with a and b numbers: x clamped."""
    if not (isinstance(condition, cst.Comparison) and len(condition.comparisons) == 1):
        return False
    compared = condition.comparisons[0]
    if not isinstance(compared.operator, (cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual)):
        return False
    value, bound = condition.left, compared.comparator
    if number_value(bound) is None:
        value, bound = bound, value
    if number_value(bound) is None:
        return False
    same = value.deep_equals
    return (number_value(when_true) is not None and same(when_false)) or (number_value(when_false) is not None
                                                                          and same(when_true))


def _fill(node: cst.BaseExpression) -> bool:
    """A constant that fills the entries a test rejects: a number, or a fresh tensor of zeros (`zeros_like(x)`)."""
    return number_value(node) is not None or is_zero_tensor(node)


def _batch_of(fact: Fact, added: bool) -> Fact:
    """A sequence's row or value among the others: the batch of them, or their total when `added`."""
    if not fact.row:
        return fact
    if added and fact.role == "length":
        return Fact(role="ntokens", labels=fact.labels)
    reduced = added and fact.role == "tensor" and fact.poly is not None and fact.poly.atoms() and all(
        atom.acc in (alg.SEQUENCE, alg.SEQUENCE_MEAN) for atom in fact.poly.atoms())
    return replace(fact, row=False, scalar=fact.scalar or bool(reduced))


def _filtered(flow: LibraryFlow, op: Operation) -> tuple | None:
    """SciPy's lfilter([1], [1, -g], x): y_t = x_t + g * y_(t-1), a discounted running sum of x; of x reversed
    in time and reversed back, the discounted reward-to-go (the `discount_cumsum` of many PPO codes)."""
    def entries(node) -> list:
        return [e.value for e in node.elements] if isinstance(node, (cst.List, cst.Tuple)) else []
    numerator, denominator = (entries(node) for node in (op.positional + [None, None])[:2])
    signal = op.positional[2] if len(op.positional) > 2 else op.keywords.get("x")
    if signal is None or [number_value(e) for e in numerator] != [1] or len(denominator) != 2 \
            or number_value(denominator[0]) != 1:
        return None
    return flow.accumulated(replace(op, tensor=flow.expr(signal)))


def _known_receiver(node: cst.Call) -> bool:
    """A function called by name, or of a module the analysis knows (torch, numpy, ray); not a method of what such a
    function returns (`torch.tensor(q).reshape(-1)` is no `torch.reshape(-1)`: its first argument is a shape)."""
    path = dotted(node.func)
    return isinstance(node.func, cst.Name) or path.split(".")[0] in PASS_THROUGH_RECEIVERS and "(" not in path


Effect = Callable[[LibraryFlow, Operation], "tuple | None"]


def _mean(flow: LibraryFlow, op: Operation) -> tuple:
    """torch.mean(x, dim), np.mean(x): a reduction; of a list (`np.mean(kl_values)`), over its stacked entries."""
    return flow.reduced(replace(op, tensor=flow.stacked(op)) if any(f.role == "tuple" for f in op.tensor) else op)


def _kl_div_module(_: LibraryFlow, op: Operation) -> tuple:
    """torch.nn.KLDivLoss(reduction=...): an object that computes F.kl_div when called."""
    return (Fact(role="loss-module", name="kl_div", origin=op.node),)


def _log(flow: LibraryFlow, op: Operation) -> tuple:
    """The log of each element; of the exponentials summed over the last axis (`mx.log(mx.exp(logits).sum(axis=-1,
    keepdims=True))`), the log-sum-exp written out."""
    if (summed := _summed_exponentials(op)) is not None:
        return log_sum_exp(flow.expr(summed[0]), keepdim=summed[1])
    return flow.elementwise(op)


def _summed_exponentials(op: Operation) -> tuple[cst.BaseExpression, bool] | None:
    """(x, keepdim) where `op` is the log of exp(x) summed over the last axis: of `exp(x).sum(-1)`,
    `x.exp().sum(dim=-1, keepdim=True)` or `torch.sum(torch.exp(x), axis=-1, keepdims=True)`; None otherwise."""
    node = op.node.func.value if op.method and type(op.node.func) is cst.Attribute else \
        op.positional[0] if op.positional else None
    if op.name != "log" or type(node) is not cst.Call or last_name(node.func) != "sum":
        return None
    method = type(node.func) is cst.Attribute and not _known_receiver(node)
    args = [arg for arg in node.args if arg.keyword is None]
    summed = node.func.value if method and type(node.func) is cst.Attribute else args.pop(0).value if args else None
    keywords = {arg.keyword.value: arg.value for arg in node.args if arg.keyword is not None}
    axis = args[0].value if args else keywords.get("dim", keywords.get("axis"))
    keep = keywords.get("keepdim", keywords.get("keepdims", args[1].value if len(args) > 1 else None))
    if type(summed) is not cst.Call or last_name(summed.func) != "exp" or axis is None or int_literal(axis) != -1:
        return None
    exponent = summed.args[0].value if summed.args else summed.func.value if type(summed.func) is cst.Attribute \
        else None
    if exponent is None:
        return None
    return exponent, type(keep) is cst.Name and keep.value == "True"


def _log_sum_exp(_: LibraryFlow, op: Operation) -> tuple:
    """torch.logsumexp(logits, -1), logits.logsumexp(-1, keepdim=True), MLX's `keepdims=True`: the log-softmax's
    normaliser."""
    keep = op.keywords.get("keepdim", op.keywords.get("keepdims", op.rest[1] if len(op.rest) > 1 else None))
    return log_sum_exp(op.tensor, keepdim=isinstance(keep, cst.Name) and keep.value == "True")


def _distributions_kl(flow: LibraryFlow, op: Operation) -> tuple | None:
    """torch.distributions.kl_divergence(p, q) = KL(p || q) over the next token at each step. Of the policy's
    distribution and the reference's, told apart by their names (`agent_dist`, `prior.get_dist(batch)`), it is the
    exact per-step KL, or with the reference's first the exact forward KL; else not one of ours."""
    if len(op.positional) != 2 or op.keywords:
        return None
    first, second = (roles.distribution_side(dotted(arg.func if isinstance(arg, cst.Call) else arg) or "")
                     for arg in op.positional)
    kind: alg.AtomKind
    if (first, second) == ("policy", "reference"):
        kind = alg.FULL
    elif (first, second) == ("reference", "policy"):
        kind = alg.FULL_FWD
    else:
        return None
    value = (tensor(alg.Poly.atom(alg.Atom(kind, True)), origin=flow.here(op.node), origin_path=flow.module.path,
                    against=kl_targets(op.node)),)
    return detach_all(value) if flow.no_grad else value  # under no_grad: a gradient cut (row 1c)


_LAST_AXIS = cst.parse_expression("-1")


def _einsum(flow: LibraryFlow, op: Operation) -> tuple | None:
    """torch.einsum("btk,btk->bt", p, log_p - log_q): the operands' elementwise product summed over the indices the
    output drops, read where every operand has the same indices and the output keeps all but the last (a sum over
    the last axis: here the vocabulary's, the exact per-step KL) or none (a sum over everything); else not ours."""
    spec = text_of(op.positional[0]) if op.positional else None
    if spec is None or spec.count("->") != 1 or "." in spec:
        return None
    inputs, output = spec.replace(" ", "").split("->")
    indices = set(inputs.split(","))
    if len(indices) != 1 or len(inputs.split(",")) != len(op.positional) - 1:
        return None
    (each,) = indices
    if output not in ("", each, each[:-1]):
        return None
    product = flow.expr(op.positional[1])
    for operand in op.positional[2:]:
        product = flow.multiply(product, flow.expr(operand), op.node)
    if output == each:
        return product
    return flow.along_each_axis(product, _LAST_AXIS if output else None,
                                lambda part, per_row: flow.reduce(part, "sum", per_row, op.node))


def _pieces(_: LibraryFlow, op: Operation) -> tuple | None:
    """x.split(sizes), x.chunk(n), x.unbind(), torch.split(x, ...) along the batch axis: a list of pieces.
    A piece is one sequence where the tensor is unbound or split by the sequences' lengths (a packed
    row cut back into its responses: `logps.split(response_lengths)`), else a part of the batch."""
    dim_at = 0 if op.name == "unbind" else 1  # x.unbind(dim), x.split(sizes, dim)
    dim = op.keywords.get("dim", op.rest[dim_at] if len(op.rest) > dim_at else None)
    if dim is not None and int_literal(dim) != 0:
        return None  # along the tokens: pieces of every sequence
    sizes = op.rest[0] if op.rest and op.name != "unbind" else op.keywords.get("split_size_or_sections")
    by_sequence = op.name == "unbind" or op.name in ("split", "tensor_split") and sizes is not None and (
        roles.names_lengths(last_name(sizes) or ""))
    piece = tuple(replace(f, row=True, packed=False) if by_sequence and f.role in ("tensor", "mask") else f
                  for f in op.tensor if f.role in ("tensor", "mask"))
    return (Fact(role="tuple", items=(piece,)),) if piece else ()


def _counted(flow: LibraryFlow, op: Operation) -> tuple | None:
    """The builtin len(x) of tokens picked by an index (`active = logps[mask]`, then `len(active)`), the entries along
    their first axis: of one sequence's tokens (a row) that sequence's length; of the batch's tokens picked into one
    row (a packed selection) their count. Another length (a Python list's, a batch's number of sequences) is none."""
    if not isinstance(op.node.func, cst.Name) or len(op.positional) != 1 or not _picked(op.positional[0], flow.func):
        return None
    return tuple(Fact(role="length", labels=f.labels, row=True) if f.row
                 else Fact(role="ntokens", labels=f.labels) for f in op.tensor
                 if f.role in ("tensor", "mask") and (f.row or f.packed))


def _picked(node: cst.BaseExpression, func: cst.FunctionDef | cst.Module) -> bool:
    """Whether `node` is a subscript of a tensor (`logps[mask]`), or a name `func` binds only to such."""
    if type(node) is cst.Subscript:
        return True
    bound = name_bindings(func).get(node.value, []) if type(node) is cst.Name else []
    return bool(bound) and all(type(value) is cst.Subscript for _, value in bound)


def _each(names: str, effect: Effect) -> dict[str, Effect]:
    return dict.fromkeys(names.split(), effect)


# Operations that keep what each element of a tensor means (a new shape, dtype or device, masked or
# non-finite entries filled in): spelled as functions (torch.masked_fill(x, m, v)) and as methods.
RESHAPING = ("masked_fill nan_to_num reshape squeeze unsqueeze expand_dims flatten transpose permute clone"
             " repeat_interleave pad pad_input index_select")  # F.pad and flash-attn's pad_input put each entry back
# at its position; index_select picks whole rows (a mini-batch's sequences) or positions, each entry still what it
# was; expand_dims is NumPy's, JAX's and MLX's unsqueeze

# library classes whose instances compute a KL when called (a call of one is not a record of its keywords)
LOSS_MODULES = frozenset(("KLDivLoss",))

FUNCTIONS: dict[str, Effect] = {
    **_each("exp abs expm1 log_softmax softmax neg negative", LibraryFlow.elementwise),
    "log": _log,
    **_each("clamp clip clamp_ clamp_min clamp_max", LibraryFlow.clamped),
    **_each("sigmoid tanh softplus relu erf", lambda _flow, op: _squashed(op)),
    "sum": LibraryFlow.summed,
    "mean": _mean,
    **_each("pow square", LibraryFlow.squared),
    "gather": LibraryFlow.gathered,
    **_each("take_along_dim take_along_axis", LibraryFlow.taken_along),
    "stop_gradient": LibraryFlow.detached,  # JAX's and MLX's detach
    **_each("flip fliplr", LibraryFlow.flipped),
    "cumsum": LibraryFlow.accumulated,
    "lfilter": _filtered,
    **dict.fromkeys(sorted(roles.NAMED_AGGREGATIONS), LibraryFlow.aggregated),
    "kl_div": LibraryFlow.kl_div_of,
    "kl_divergence": _distributions_kl,
    **_each("cross_entropy nll_loss", LibraryFlow.token_cross_entropy),
    "KLDivLoss": _kl_div_module,
    **dict.fromkeys(PASS_THROUGH, LibraryFlow.passed_through),
    "detach": LibraryFlow.detached,
    "float": LibraryFlow.detached,  # the builtin: a Python number holds no gradient
    "len": _counted,
    **_each(RESHAPING, LibraryFlow.reshaped),
    "tensor": LibraryFlow.copied,
    **_each("stack cat vstack hstack concat concatenate", LibraryFlow.stacked),
    **_each("zip safezip", LibraryFlow.zipped),
    "enumerate": LibraryFlow.enumerated,
    **_each("max min maximum minimum", LibraryFlow.extreme),
    "where": LibraryFlow.selected,
    "masked_select": LibraryFlow.selected_by_mask,
    **_each("scatter_add index_add", LibraryFlow.scattered_add),
    **_each("split tensor_split unbind chunk", _pieces),
    "logsumexp": _log_sum_exp,
    "einsum": _einsum,
}

METHODS: dict[str, Effect] = {
    **_each("detach item tolist numpy cpu detach_ clone_detach", LibraryFlow.detached),
    **_each(RESHAPING + " float double half bfloat16 to type_as view contiguous expand expand_as cuda view_as"
            " reshape_as masked_fill_ mul_ repeat astype", LibraryFlow.unchanged),
    **_each("clamp clamp_ clip clip_ clamp_min clamp_max", LibraryFlow.clamped),
    **_each("sum mean nansum nanmean", LibraryFlow.reduced),
    **_each("exp abs expm1 neg log_softmax softmax", LibraryFlow.elementwise),
    "log": _log,
    **_each("pow square", LibraryFlow.squared),
    "gather": LibraryFlow.gathered,
    "take_along_dim": LibraryFlow.taken_along,
    "flip": LibraryFlow.flipped,
    "cumsum": LibraryFlow.accumulated,
    **_each("mul multiply", LibraryFlow.multiplied),
    "masked_select": LibraryFlow.selected_by_mask,
    **_each("add sub subtract", LibraryFlow.added),
    **_each("div divide", LibraryFlow.divided),
    **_each("scatter_add scatter_add_ index_add index_add_", LibraryFlow.scattered_add),
    **_each("split tensor_split unbind chunk", _pieces),
    "logsumexp": _log_sum_exp,
}
