"""Expressions: names, literals, attributes, subscripts, displays and comprehensions.

Every expression evaluates to a tuple of `Fact`s, the alternatives it may hold, once per statement.
An attribute or key the analysis did not see stored takes the meaning of its name
(`batch["ref_log_probs"]`); a subscript of a tuple or a dispatch table by a switch value labels each
entry with the value that selects it; `x[:, -1]` keeps the last position. Operators are in
klaudit.lint.arithmetic and calls in klaudit.lint.calls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ClassVar

import libcst as cst

from klaudit.catalog import Position
from klaudit.frameworks.options import Options
from klaudit.frameworks.settings import number as parsed_number
from klaudit.lint import algebra as alg
from klaudit.lint import budget, roles
from klaudit.lint.algebra import Atom, Poly
from klaudit.lint.conditions import where_false
from klaudit.lint.constructed import constructed_number
from klaudit.lint.containers import as_row, entry_of, rows
from klaudit.lint.facts import Fact, detach_all, merge_labels, operands, replace, reversed_in_time, tensor
from klaudit.lint.flowstate import FlowState
from klaudit.lint.pinned import configuration_read
from klaudit.lint.syntax import (
    dotted,
    drops_last_char,
    int_literal,
    is_data_read,
    is_last_index,
    is_literal_choice,
    looks_like_option,
    marks_counted_tokens,
    number_value,
    picks_a_row,
    picks_the_first_row,
    reverses_last_axis,
    root_name,
    slice_names,
    string_key,
    string_value,
    walk,
)
from klaudit.lint.tensors import picked_from_vocabulary


class ExpressionFlow(FlowState):
    """The facts of an expression, for klaudit.lint.flow.FunctionRun; `e_<node type>` interprets each kind."""

    _evaluators: ClassVar[dict[type, Callable | None]] = {}  # node type -> its e_ method (or None), per class

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._evaluators = {}

    def expr(self, node: cst.BaseExpression) -> tuple:
        """The facts of an expression; each is evaluated once per statement (the environment only
        changes between statements). Its `e_` method is looked up once per node type (a lookup by name
        through the interpreter's eleven parts cost more than most evaluations)."""
        key = id(node)
        memo = self._memo
        if key in memo:
            return memo[key]
        evaluators = self._evaluators
        kind = type(node)
        if kind not in evaluators:
            evaluators[kind] = getattr(type(self), "e_" + kind.__name__, None)
        evaluate = evaluators[kind]
        value = () if evaluate is None else evaluate(self, node)
        memo[key] = value
        budget.spend(1 + len(value))
        return value

    def e_Name(self, node: cst.Name) -> tuple:
        if node.value in self.env:
            return self.note_read(self.env[node.value])
        if node.value in ("True", "False"):
            return (Fact(role="bool", text=node.value),)
        if node.value == "None":
            return (Fact(role="none"),)
        return self.module_value(node.value)

    def e_Await(self, node: cst.Await) -> tuple:
        return self.expr(node.expression)

    def e_SimpleString(self, node: cst.SimpleString) -> tuple:
        text = string_value(node)
        return (Fact(role="str", text=text),) if isinstance(text, str) else ()  # bytes are no switch value

    def e_Integer(self, node: cst.Integer) -> tuple:
        value = number_value(node)
        return () if value is None else (tensor(Poly.const(value)),)

    e_Float = e_Integer

    def e_Attribute(self, node: cst.Attribute) -> tuple:
        path = dotted(node)
        if path in self.env:
            return self.note_read(self.env[path])
        attr = node.attr.value
        if attr in ("data",):
            return detach_all(self.expr(node.value))
        if attr in ("T", "mT"):
            return self.expr(node.value)
        if attr == "logits":  # a model's output: the reference's when the model is named so (ref_model(...).logits)
            if type(node.value) is cst.Name and (entries := entry_of(self.expr(node.value), attr)):
                return entries  # a record's field: generate's output (klaudit.lint.calls)
            if roles.is_scoring_model(dotted(node.value)):
                return ()  # a reward model's or a critic's score
            if roles.is_reference_model(dotted(node.value)):
                return (tensor(Poly.atom(Atom(alg.REF_LOGITS, False))),)
            return (tensor(Poly.atom(Atom(alg.LOGITS, not self.no_grad))),)
        base = root_name(node)
        if base == "self":
            return self.constant_setting(node) or self.held_log_probs(node)
        entries = entry_of(self.expr(node.value), attr)
        if entries:
            return entries  # a record built with this field
        stored = self.stored(attr) if isinstance(node.value, cst.Name) else ()
        if stored:
            return stored  # `experience.kl`: what the module's code stored into `.kl` of some object
        named = _named_tensor(attr, self.no_grad, (dotted(node.value), attr) in fields_beside_their_old_copy(self.module.tree))
        if named:
            return named
        if roles.is_mask_name(attr):
            return (Fact(role="mask"),)
        if path is not None and "." in path and self.module.project.options.zero_in_every_run(path.split(".", 1)[1], self.module.path):
            return (tensor(Poly.const(0.0)),)  # a coefficient every run sets to 0 (`config.kl_coefficient`)
        if not isinstance(node.value, cst.Name) or base not in self.env:
            return (Fact(role="str", name=attr),) if looks_like_option(attr) else ()
        return ()

    def held_log_probs(self, node: cst.Attribute) -> tuple:
        """`self.action_logprobs`, `self.ref_action_logprobs`: log-probs an object holds (a rollout buffer's), read by
        their names as a batch's fields are; only the object's own (`self.x`), not a nested one (`self.cfg.x`)."""
        return _named_tensor(node.attr.value, self.no_grad) if type(node.value) is cst.Name else ()

    def constant_setting(self, node: cst.Attribute) -> tuple:
        """`self.x` that the class sets once, to a literal or a switch between literals (`self.dim = None
        if token_level else -1` in __init__): its values, each under its switch value; or from an argument
        every construction of the class gives the same number (klaudit.lint.constructed)."""
        if type(node.value) is not cst.Name or self.cls is None:
            return ()
        assigned = self.analyzer.self_values(self.module, self.cls).get(node.attr.value, ())
        if len(assigned) != 1:
            return ()
        if is_literal_choice(assigned[0]):
            return self.expr(assigned[0])
        if zero_option(assigned[0], self.module.project.options, self.module.path):
            return (tensor(Poly.const(0.0)),)  # `self.beta_rl = args.beta_rl`, which every run leaves at 0
        classdef = self.module.classes.get(self.cls, (None,))[0]
        number = constructed_number(self.module.path, self.module.project, classdef, node.attr.value) \
            if classdef is not None else None
        return self.expr(number) if number is not None else ()

    def e_Subscript(self, node: cst.Subscript) -> tuple:
        key = string_key(node)
        if key is not None:
            found = self.read_key(node.value, key)
            if found is not None:
                return found
            grad = not self.no_grad and (not is_data_read(node) or roles.is_current_policy_name(key)
                                         or (dotted(node.value), key) in self.detached_entries())
            named = self.named_entry(node.value, key, grad)
            if named:
                return named
            if roles.is_mask_name(key):
                return (Fact(role="mask"),)
            return ()
        base = self.expr(node.value)
        picked = picked_tokens(node, base, self.token_ids())
        if picked is not None:
            return picked
        last = is_last_index(node)
        if last:
            return tuple(replace(f, position=Position.LAST) if f.role == "tensor" else f for f in base)
        index = self.index_tuple(node)
        if index is not None:  # a literal list or tuple's items; the value's other alternatives are indexed as below
            items = {replace(f, labels=()) for part in base if part.role == "tuple" for item in part.items for f in item}
            # beside `[]`, the per-row list a branch computes; not a stack of those items (`torch.stack([k1, k3])`)
            others = tuple(f for f in base if f.role != "tuple" and replace(f, labels=()) not in items)
            return index + (self.indexed(node, others) if others else ())
        return self.indexed(node, base)

    def indexed(self, node: cst.Subscript, base: tuple) -> tuple:
        """`base` indexed by `node`'s subscript that is no string key, gather, last position or literal tuple's item:
        a dispatch table's entry, a cut string, a reversal, a row of a batch, else the same facts."""
        chosen = self.dispatch(node)
        if chosen is not None:
            return chosen
        if any(f.role == "str" for f in base):
            if drops_last_char(node):
                return tuple(replace(f, text=f.text[:-1]) if f.text else replace(f, cut=f.cut + 1)
                             for f in base if f.role == "str")
            return ()
        if reverses_last_axis(node):
            # NumPy's and JAX's reversal (a torch tensor takes no negative step), read as along the tokens as flip is
            return reversed_in_time(base)
        if any(self.batch_indices) and picks_a_row(node, {k: v for loop in self.batch_indices for k, v in loop.items()},
                                                   frozenset().union(*self.loop_variables), self.batch_indices[-1]) \
                or picks_the_first_row(node, self.position_ranges):
            return tuple(as_row(f) for f in base)
        return base

    @functools.cached_property
    def position_ranges(self) -> frozenset[str]:
        """The names the function binds once to a bounded `slice(...)` (syntax.slice_names)."""
        return slice_names(self.func)

    def index_tuple(self, node: cst.Subscript) -> tuple | None:
        base = self.expr(node.value)
        parts = [f for f in base if f.role == "tuple"]
        if not parts or len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return None
        index_node = node.slice[0].slice.value
        idx = int_literal(index_node)
        if idx is None:
            name = self.switch_name(index_node)
            return tuple(replace(f, labels=merge_labels(f.labels, ((name, (i,)),)))
                         for part in parts for i, item in enumerate(part.items) for f in item)
        return tuple(f for part in parts if -len(part.items) <= idx < len(part.items) for f in part.items[idx])

    def e_Tuple(self, node: cst.Tuple) -> tuple:
        return (Fact(role="tuple", items=tuple(self.expr(e.value) for e in node.elements)),)

    def e_List(self, node: cst.List) -> tuple:
        return (Fact(role="tuple", items=tuple(self.expr(e.value) for e in node.elements)),)

    def comprehension(self, node, parts: tuple) -> list:
        """The facts of `parts` (element expressions) of a comprehension, its targets bound to the
        elements of what they iterate; the targets do not outlive it."""
        saved = self.env
        self.env = dict(saved)
        clause = node.for_in
        while clause is not None:
            self.assign_target(clause.target, rows(self.expr(clause.iter)), rhs=clause.iter)
            clause = clause.inner_for_in
        values = [self.expr(part) for part in parts]
        self.env = saved
        return values

    def e_ListComp(self, node: cst.ListComp) -> tuple:
        return self.comprehension(node, (node.elt,))[0]

    e_SetComp = e_GeneratorExp = e_ListComp

    def e_DictComp(self, node: cst.DictComp) -> tuple:
        self.comprehension(node, (node.key, node.value))  # its calls may store KL terms; the dict is not followed
        return ()

    def e_Dict(self, node: cst.Dict) -> tuple:
        items = []
        for element in node.elements:
            if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
                items.append((string_value(element.key), self.expr(element.value)))
        return (Fact(role="dict", items=tuple(items)),)

    def e_IfExp(self, node: cst.IfExp) -> tuple:
        label, decided = self.condition(node.test)
        if decided is True:
            return self.expr(node.body)
        if decided is False:
            return self.expr(node.orelse)
        body = operands(self.expr(node.body))
        orelse = operands(self.expr(node.orelse))
        if holding := self.holding(node.test):
            body = tuple(replace(f, labels=merge_labels(f.labels, holding)) for f in body)
        if label is not None:
            orelse = tuple(replace(f, labels=merge_labels(f.labels, where_false(label))) for f in orelse)
        return tuple(dict.fromkeys(body + orelse))

    def e_Comparison(self, node: cst.Comparison) -> tuple:
        """A comparison (`approx_kl > target_kl`) uses a KL value as a statistic; `labels != -100` (or with the
        padding token's id) marks the tokens that count, a 0/1 mask whatever it is named."""
        self.settle(self.expr(node.left))
        for comparison in node.comparisons:
            self.settle(self.expr(comparison.comparator))
        if len(node.comparisons) == 1 and isinstance(node.comparisons[0].operator, cst.NotEqual) \
                and marks_counted_tokens(node.comparisons[0].comparator):
            return (Fact(role="mask"),)
        return ()

    def e_BooleanOperation(self, node: cst.BooleanOperation) -> tuple:
        return ()


def picked_tokens(node: cst.Subscript, base: tuple, token_ids: frozenset[str]) -> tuple | None:
    """`log_probs[rows, positions, token_ids]`: vocabulary-level log-probs or logits indexed on their last axis
    by the sampled tokens' ids, a gather (tensors.picked_from_vocabulary); so is one position's distribution indexed
    by the token sampled from it (`torch.log(probs_1d[next_token_id])`, a token-by-token sampler's); None for any
    other index. The ids are
    known by their name (`log_probs[:, :, actions]`) or as a name the function binds to such ids kept as they are
    (`token_ids`: `labels_s = labels.clamp(0, V - 1)`), or by an index array on each of three axes (`logprobs[rows,
    cols, rollouts]`: numpy's advanced indexing, one entry per row and position, as a gather picks)."""
    last = node.slice[-1].slice
    if type(last) is not cst.Index:
        return None
    index = root_name(last.value)
    named = roles.names_token_ids(index) or index in token_ids
    if not named and not _indexes_every_axis(node) or len(node.slice) == 1 and not named:
        return None
    picked = picked_from_vocabulary(base)
    # index arrays into per-token values (`sample_log_probs[rows, best]`) pick among them: no gather
    return picked if picked or named else None


def _indexes_every_axis(node: cst.Subscript) -> bool:
    """Rows, positions and tokens each indexed by a variable or a computed array, none sliced or fixed by a literal.
    Two arrays may pick positions of [B, T, V] logits (`logits[rows, cells]`, still over the vocabulary): only the
    three-axis form names a token."""
    return len(node.slice) == 3 and all(
        type(element.slice) is cst.Index and type(element.slice.value) in (cst.Name, cst.Attribute, cst.Call)
        for element in node.slice)


def _named_tensor(attr: str, no_grad: bool, current: bool = False) -> tuple:
    """A field whose name says what it holds (`ref_logprobs`, `old_log_probs`): that tensor, with the policy's
    gradient outside no_grad where the name is the current policy's, or the module takes the field's importance
    log-ratio to its behaviour-policy copy (`current`); () for any other name."""
    poly = roles.named_tensor(attr, grad=not no_grad and (current or roles.is_current_policy_name(attr)))
    return (tensor(poly),) if poly is not None else ()


@functools.lru_cache(maxsize=64)  # asked at each field read of the module's functions
def fields_beside_their_old_copy(module: cst.Module) -> frozenset[tuple[str, str]]:
    """(object, field) of each `batch.logprobs - batch.old_logprobs` `module` writes: a field whose behaviour-policy
    copy is subtracted from it, an importance log-ratio, holds the current policy's log-probs with their gradient
    (a stored field is otherwise read as detached)."""
    return frozenset(
        (dotted(node.left.value), node.left.attr.value) for node in walk(module)
        if type(node) is cst.BinaryOperation and type(node.operator) is cst.Subtract
        and type(node.left) is cst.Attribute and type(node.right) is cst.Attribute
        and node.left.value.deep_equals(node.right.value)
        and roles.tensor_role(node.left.attr.value) == alg.POLICY and roles.tensor_role(node.right.attr.value) == alg.OLD)


def zero_option(value: cst.BaseExpression, options: Options, path: str) -> bool:
    """Whether `value` reads an option of the project (`args.beta_rl`) that every run the project's launches show
    gives 0: a coefficient copied from it scales nothing. So does a key a run reads from a configuration section as
    0 (passformer's `float(rl.get("kl_coeff", 0.0))`, 0 in every YAML file: klaudit.lint.pinned)."""
    if type(value) is cst.Call and dotted(value.func) in ("float", "int") and len(value.args) == 1:
        value = value.args[0].value
    read = configuration_read(value, options, path)
    if read is not None:
        return read.value is not None and parsed_number(read.value) == 0
    if type(value) is not cst.Attribute or type(value.value) is not cst.Name or value.value.value == "self":
        return False
    return options.zero_in_launched_runs(value.attr.value, path)
