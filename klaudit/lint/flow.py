"""Abstract interpretation of one function: what each expression holds, and where KL terms end up.

Every expression evaluates to a tuple of `Fact`s: the alternatives it may hold (switch branches
stay apart, labelled by the literal that selects them). A tensor fact carries a symbolic
polynomial (klaudit.lint.algebra) plus how it was clamped, reduced and sliced. Statements are
walked in order; `if` branches are joined; loops run twice; calls into functions of the linted
tree are interpreted by klaudit.lint.modules.Analyzer with the caller's argument facts. The
result of a function is its returned facts and its sinks: the loss, reward and advantage
expressions that KL terms reach.
"""

from __future__ import annotations

import re

import libcst as cst

from klaudit.catalog import Aggregation, Position
from klaudit.lint import algebra as alg
from klaudit.lint import budget, roles
from klaudit.lint.algebra import Atom, Poly
from klaudit.lint.callables import PASS_THROUGH, PASS_THROUGH_RECEIVERS, Callee, CallFlow, closure_of
from klaudit.lint.containers import ContainerFlow, elements, entry_of, enumerated, zipped
from klaudit.lint.evidence import note_assignment, note_entry
from klaudit.lint.facts import (
    NEG,
    UNKNOWN,
    Fact,
    Outcome,
    Sink,
    bounded,
    combine,
    compatible,
    contained,
    detach_all,
    holds_behaviour_ratio,
    is_negated_pattern,
    is_pattern,
    join_envs,
    logprob_kinds,
    loss_part,
    merge_labels,
    negated,
    operands,
    param_facts,
    registry_switches,
    rename_logprobs,
    replace,
    takes,
    tensor,
    within_registry,
)
from klaudit.lint.syntax import (
    case_strings,
    decorated_no_grad,
    dotted,
    drops_last_char,
    int_literal,
    is_data_read,
    is_last_index,
    last_name,
    looks_like_option,
    mentions,
    number_value,
    params,
    root_name,
    string_key,
    string_literals,
)
from klaudit.lint.tensors import AGG_MODES, agg_mode, apply_math, gather, over_vocab, per_token_from_logits

# A squashing function of a per-token log-ratio (`gate = sigmoid(beta * delta)`): a weight that varies
# with the log-ratio, so a KL term multiplied by it is no catalog estimator.
KL_WEIGHT = (Fact(role="kl-weight"),)


# Values whose meaning the analysis knows, which a target's name does not override (`seq_mask =
# mask.sum(-1)` holds each sequence's length, whatever its name says).
EXPLAINED_ROLES = ("tensor", "mask", "function", "length", "ntokens")

# keywords that name the tensor a library function operates on, when it is not passed positionally
TENSOR_KEYWORDS = ("loss_mat", "values", "input", "tensor", "x", "loss", "losses")

# Operations that keep what each element of a tensor means (a new shape, dtype or device, masked or
# non-finite entries filled in); the methods, and those also spelled as functions (torch.masked_fill(x, m, v)).
RESHAPING_FUNCTIONS = frozenset({"masked_fill", "nan_to_num", "reshape", "squeeze", "unsqueeze", "flatten", "transpose",
                                 "permute", "clone", "repeat_interleave"})
RESHAPING_METHODS = RESHAPING_FUNCTIONS | {"float", "double", "half", "bfloat16", "to", "type_as", "view", "contiguous",
                                           "expand", "expand_as", "cuda", "view_as", "masked_fill_", "mul_", "repeat"}


class FunctionRun(ContainerFlow, CallFlow):
    """One interpretation of one function body."""

    def __init__(self, analyzer, module, func: cst.FunctionDef, cls, env: dict, record: bool):
        self.analyzer = analyzer
        self.module = module
        self.func = func
        self.cls = cls
        self.env = dict(env)
        self.record = record
        self.labels: tuple = ()
        self._memo: dict = {}
        self.stmt: cst.CSTNode | None = None
        self.no_grad = decorated_no_grad(func)
        self.reverse_loop: set = set()
        self.returns: list = []
        self.sinks: list = []
        self.waiting: dict = {}  # reward-named assignment -> its Sink, until the value is seen to reach a reward
        self.loss_parts: dict = {}  # loss-named assignment -> its Sink, unless a later loss takes the term on
        self.confirmed: set = set()
        self.sink_count = 0  # sinks and reward candidates in execution order
        self.formed: dict = {}  # origin -> a KL term formed in this function and stored in a variable
        self.settled: set = set()  # origins whose use is known: a sink, a return, a metric, a later term
        self.read: set = set()  # origins of the KL terms the current statement reads
        self.compared = False  # a call so far was given the policy's and the behaviour policy's log-probs
        name = func.name.value
        self.loss_function = roles.is_loss_function(name) or (
            name in ("forward", "__call__") and cls is not None and roles.is_loss_function(cls)
        )

    def run(self) -> Outcome:
        self.block(self.func.body)
        unexplained = [fact for origin, fact in self.formed.items() if origin not in self.settled]
        sinks = self.sinks + list(self.loss_parts.values())
        names = registered_names(self.func)
        if names:  # a function a registry runs under these names: its dispatch switch takes only them
            values = [tuple(dict.fromkeys(self.returns))] + [sink.facts for sink in sinks]
            keys = registry_switches(values, names)
            sinks = [replace(sink, facts=within_registry(sink.facts, names, keys)) for sink in sinks]
            return Outcome(within_registry(values[0], names, keys), sinks, unexplained)
        return Outcome(tuple(dict.fromkeys(self.returns)), sinks, unexplained)

    # ---- statements ------------------------------------------------------------------

    def block(self, body: cst.BaseSuite) -> None:
        if isinstance(body, cst.SimpleStatementSuite):
            for small in body.body:
                self.small(small)
            return
        for stmt in body.body:
            self.statement(stmt)

    def statement(self, stmt: cst.CSTNode) -> None:
        self._memo = {}
        self.read = set()
        self.stmt = stmt
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                self.small(small)
        elif isinstance(stmt, cst.If):
            self.if_statement(stmt)
        elif isinstance(stmt, (cst.For, cst.While)):
            reverse = isinstance(stmt, cst.For) and "reversed" in dotted(stmt.iter.func) if isinstance(getattr(stmt, "iter", None), cst.Call) else False
            if isinstance(stmt, cst.For):
                # loop variables: the elements of what is iterated, else roles from their names
                self.assign_target(stmt.target, elements(self.expr(stmt.iter)), rhs=stmt.iter)
            for _ in range(2):  # twice, so that values carried from one iteration to the next are seen
                if reverse:
                    self.reverse_loop.add(id(stmt))
                self.block(stmt.body)
                self.reverse_loop.discard(id(stmt))
            # training loops run: the state after the body, not a join with the state before it
            if stmt.orelse is not None:
                self.block(stmt.orelse.body)
        elif isinstance(stmt, cst.With):
            saved = self.no_grad
            if any(roles.NO_GRAD_CONTEXTS.match(dotted(item.item.func).split(".")[-1].rstrip("()"))
                   for item in stmt.items if isinstance(item.item, cst.Call)):
                self.no_grad = True
            for item in stmt.items:
                if item.asname is not None:
                    self.assign_target(item.asname.name, ())
            self.block(stmt.body)
            self.no_grad = saved
        elif isinstance(stmt, cst.Try):
            before = dict(self.env)
            self.block(stmt.body)
            for handler in stmt.handlers:
                self.block(handler.body)
            self.env = join_envs(before, self.env)
            if stmt.orelse is not None:
                self.block(stmt.orelse.body)
            if stmt.finalbody is not None:
                self.block(stmt.finalbody.body)
        elif isinstance(stmt, cst.Match):
            self.match_statement(stmt)
        elif isinstance(stmt, cst.FunctionDef):
            self.define(stmt)

    def define(self, func: cst.FunctionDef) -> None:
        """A function defined inside this one (a loss closure, a callback): analysed where it is
        defined, its enclosing variables holding their facts there; its sinks are this function's.
        The name holds it, so that a call of it is interpreted with the caller's arguments."""
        closure = closure_of(self.env)
        self.env[func.name.value] = (Fact(role="function", callee=Callee(self.module, func, self.cls, closure)),)
        env = dict(closure)
        env.update((param.name.value, param_facts(param)) for param in params(func))
        run = FunctionRun(self.analyzer, self.module, func, self.cls, env, record=self.record)
        run.no_grad = run.no_grad or self.no_grad
        for sink in run.run().sinks:
            self.sinks.append(Sink(sink.kind, sink.facts, sink.node, len(self.sinks)))
        self.settled.update(run.settled)  # an enclosing variable the closure uses has that use

    def if_statement(self, stmt: cst.If) -> None:
        label, decided = self.condition(stmt.test)
        if decided is True:
            self.block(stmt.body)
            return
        if decided is False:
            if isinstance(stmt.orelse, cst.If):
                self.if_statement(stmt.orelse)
            elif stmt.orelse is not None:
                self.block(stmt.orelse.body)
            return
        before = dict(self.env)
        saved = self.labels
        if label is not None:
            self.labels = merge_labels(self.labels, (label,))
        self.block(stmt.body)
        self.labels = saved
        after_body = self.env
        self.env = dict(before)
        otherwise = _otherwise(label)  # the switch values where the test is false, where labels can say so
        if isinstance(stmt.orelse, cst.If):
            self.labels = merge_labels(self.labels, otherwise)  # an elif runs where the test before it is false
            self.if_statement(stmt.orelse)
            self.labels = saved
            for name, facts in list(self.env.items()) if otherwise else ():
                if after_body.get(name) != facts:  # the value the elif chain leaves, where the test is false
                    self.env[name] = tuple(replace(f, labels=merge_labels(f.labels, otherwise)) for f in facts)
        elif stmt.orelse is not None:
            self.labels = merge_labels(self.labels, otherwise)
            self.block(stmt.orelse.body)
            self.labels = saved
        elif otherwise:
            # `if flag: kl = kl * ratio` without else: where the test is false, kl keeps its old value
            for name, facts in before.items():
                if after_body.get(name) != facts:
                    self.env[name] = tuple(replace(f, labels=merge_labels(f.labels, otherwise)) for f in facts)
        self.env = join_envs(after_body, self.env)
        if _chain_leaves(stmt):
            # `if test: return` (or an elif chain whose every branch returns, without else): the statements
            # after it run only where every test is false
            branch: cst.BaseSuite | cst.If | cst.Else | None = stmt
            while isinstance(branch, cst.If):
                self.labels = merge_labels(self.labels, self.negation(branch.test))
                branch = branch.orelse

    def negation(self, test: cst.BaseExpression) -> tuple:
        """Switch values that hold where `test` is false, as far as they can be written as labels:
        `if not flag: return` leaves flag True below, `if not x.endswith("+"): return` the suffixed values."""
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
            return self.negation(test.left) + self.negation(test.right)
        label, decided = self.condition(test)
        return _otherwise(label) if decided is None else ()

    def match_statement(self, stmt: cst.Match) -> None:
        subject = self.expr(stmt.subject)
        name = next((f.name for f in subject if f.role == "str"), last_name(stmt.subject))
        before = dict(self.env)
        merged = dict(before)
        saved = self.labels
        for case in stmt.cases:
            values = case_strings(case.pattern)
            self.env = dict(before)
            if values:
                self.labels = merge_labels(saved, ((name, values),))
            self.block(case.body)
            self.labels = saved
            merged = join_envs(merged, self.env)
        self.env = merged

    def condition(self, test: cst.BaseExpression):
        """(label, decided): the switch value an `if` selects, and its truth when known."""
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            label, decided = self.condition(test.expression)
            if decided is not None:
                return None, not decided
            otherwise = _otherwise(label)
            return (otherwise[0] if otherwise else None), None
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
            (left, left_decided), (right, right_decided) = self.condition(test.left), self.condition(test.right)
            if True in (left_decided, right_decided):
                return None, True
            if left_decided is False or right_decided is False:
                return (right, right_decided) if left_decided is False else (left, left_decided)
            return _either(left, right), None
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            comp = test.comparisons[0]
            if isinstance(comp.operator, (cst.Is, cst.IsNot)) and last_name(comp.comparator) == "None":
                decided = self.is_none(test.left)
                if decided is not None and isinstance(comp.operator, cst.IsNot):
                    decided = not decided
                return None, decided
            left, right = test.left, comp.comparator
            strings = string_literals(right) or string_literals(left)
            subject = left if string_literals(right) else right
            if strings and isinstance(comp.operator, (cst.Equal, cst.In, cst.NotEqual, cst.NotIn)):
                facts = self.expr(subject)
                known = [f.text for f in facts if f.role == "str" and f.text is not None]
                name = next((f.name for f in facts if f.role == "str" and f.name), last_name(subject))
                negate = isinstance(comp.operator, (cst.NotEqual, cst.NotIn))
                if known:
                    hit = any(k in strings for k in known)
                    return None, (not hit if negate else hit)
                values = spelled(facts, tuple(strings))
                return (None if negate or not values else (name, values)), None
            number = number_value(right) if number_value(left) is None else None
            if number is not None and isinstance(comp.operator, cst.Equal):
                # `if weight == 0:` selects a setting like a flag: its branches exclude each other
                return (f"{self.switch_name(left)} == {number:g}", (True,)), None
            if isinstance(comp.operator, cst.Equal) and isinstance(right, cst.Attribute) and right.attr.value.isupper():
                # `if loss_type == LossType.TOKEN_LEVEL:` (an enum member or a constant): the same
                return (f"{last_name(left)} == {dotted(right)}", (True,)), None
            return None, None
        if isinstance(test, cst.Call) and isinstance(test.func, cst.Attribute) and test.func.attr.value in ("endswith", "startswith"):
            strings = string_literals(test.args[0].value) if test.args else None
            facts = self.expr(test.func.value)
            known = [f.text for f in facts if f.role == "str" and f.text is not None]
            if strings and known:
                method = test.func.attr.value
                return None, any(getattr(k, method)(tuple(strings)) for k in known)
            name = next((f.name for f in facts if f.name), last_name(test.func.value))
            if strings:
                return (name, tuple(f"*{s}" for s in strings)), None
            return None, None
        if isinstance(test, (cst.Name, cst.Attribute)):
            facts = self.expr(test)
            if any(f.role == "tensor" for f in facts):
                return None, None
            known = [f.text for f in facts if f.role == "bool" and f.text is not None]
            if known:
                return None, known[0] == "True"
            name = last_name(test)
            if name in ("True", "False"):
                return None, name == "True"
            return (self.switch_name(test), (True,)), None
        return None, None

    def switch_name(self, node: cst.BaseExpression) -> str:
        """The name a switch's labels use: the one its value carries from where it was read (a caller's
        `config.kl_type` passed as `kind`), else its own."""
        return next((f.name for f in self.expr(node) if f.role in ("str", "bool") and f.name), "") or last_name(node)

    def is_none(self, node: cst.BaseExpression) -> bool | None:
        """Whether `node` holds None, when its facts decide it (an argument left at a None default,
        or given a value): `if dim is None:` in a helper, decided by the call."""
        facts = self.expr(node)
        if not facts:
            return None
        nones = [f.role == "none" for f in facts]
        return True if all(nones) else (False if not any(nones) else None)

    def here(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement being interpreted: findings and origins are reported at statements."""
        return self.stmt if self.stmt is not None else node

    def small(self, small: cst.CSTNode) -> None:
        self._memo = {}
        self.read = set()
        self.stmt = small
        if isinstance(small, cst.Assign):
            value = self.loop_carried(small) or self.expr(small.value)
            for target in small.targets:
                self.assign_target(target.target, value, small, rhs=small.value)
        elif isinstance(small, cst.AnnAssign) and small.value is not None:
            self.assign_target(small.target, self.expr(small.value), small, rhs=small.value)
        elif isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Subscript):
            self.expr(small.value)  # x[idx] += y changes some positions of x: x keeps its meaning
        elif isinstance(small, cst.AugAssign):
            op = small.operator
            current = self.expr(small.target)
            value = self.binary(current, self.expr(small.value), op, small)
            self.assign_target(small.target, value, small, rhs=small.value, augmented=True)
        if self.record and isinstance(small, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            note_assignment(self, small)
        if isinstance(small, cst.Expr):
            self.expr(small.value)
        elif isinstance(small, cst.Return) and small.value is not None:
            value = self.expr(small.value)
            value = tuple(replace(f, labels=merge_labels(f.labels, self.labels)) for f in value
                          if compatible(f.labels, self.labels))
            if self.loss_function:
                marked = self.sink("loss", loss_part(value), small)
                value = tuple(marked) + tuple(f for f in value if f.role in ("tuple", "dict"))
            else:
                self.returned(small.value)
            self.settle(value)
            self.returns.extend(value)

    def loop_carried(self, small: cst.Assign) -> tuple:
        """`running = r[:, t] + gamma * running` in a reversed loop: the reward-to-go of this step's terms."""
        if not self.reverse_loop or len(small.targets) != 1 or not isinstance(small.targets[0].target, cst.Name):
            return ()
        name = small.targets[0].target.value
        if not mentions(small.value, name):
            return ()
        saved = self.env.get(name)
        self.env[name] = ()
        value = self.expr(small.value)
        if saved is not None:
            self.env[name] = saved
        self.confirm(value)  # rewards summed into returns (a GAE or reward-to-go recursion) are rewards
        return tuple(replace(f, poly=alg.accumulate(f.poly, alg.TO_GO)) if f.poly is not None else f for f in value)

    def assign_target(self, target: cst.CSTNode, value: tuple, node=None, rhs=None, augmented=False) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            parts = [f for f in value if f.role == "tuple"]
            for index, element in enumerate(target.elements):
                sub: tuple = ()
                for part in parts:
                    if index < len(part.items):
                        sub += part.items[index]
                self.assign_target(element.value, sub, node, rhs=rhs)
            return
        name = last_name(target)
        if rhs is not None and name and not any(f.role in EXPLAINED_ROLES for f in value):
            value = self.from_name(name, rhs) or value  # the analysis could not explain it: the name can
        if rhs is not None and name and roles.names_kl(name) and not any(f.is_kl() for f in value):
            value = self.log_ratio_against_unknown(rhs) or value
        if self.no_grad:
            value = detach_all(value)
        if self.labels:
            value = tuple(replace(f, labels=merge_labels(f.labels, self.labels)) for f in value
                          if compatible(f.labels, self.labels))
        if isinstance(target, cst.Name) and rhs is not None:
            value = rename_logprobs(value, name, is_data_read(rhs))
        kind = roles.sink_of_name(name) if name else None
        if kind == "reward" and node is not None:
            value = self.reward_candidate(value, node)
        elif kind == "loss" and node is not None:
            value = self.loss_candidate(value, node)
        elif kind is not None and node is not None:
            value = self.sink(kind, value, node)
        if isinstance(target, (cst.Attribute, cst.Subscript)):
            self.stored_outside(target, value)
        self.track(value)
        if isinstance(target, cst.Name):
            self.env[name] = value
        elif isinstance(target, cst.Subscript) and string_key(target) is not None:
            self.store_key(target, string_key(target), value)
        elif isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name):
            base = target.value.value
            self.env[base] = tuple(dict.fromkeys(self.env.get(base, ()) + value))
        elif isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self":
            self.env["self." + name] = value
        elif isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name):
            self.env[f"{target.value.value}.{name}"] = value
            self.collect(name, value)

    def log_ratio_against_unknown(self, rhs: cst.CSTNode) -> tuple:
        """`kl = logprobs - base` stored under a KL name: the unexplained side of a difference with the
        policy's log-probs is the reference's log-probs (log pi - log ref, or log ref - log pi)."""
        if not (isinstance(rhs, cst.BinaryOperation) and isinstance(rhs.operator, cst.Subtract)):
            return ()
        left, right = self.expr(rhs.left), self.expr(rhs.right)

        def policy(value: tuple) -> Fact | None:
            found = [f for f in value if f.role == "tensor" and f.poly is not None and
                     {a.kind for a in f.poly.atoms()} == {alg.POLICY} and len(f.poly.terms) == 1]
            return found[0] if len(found) == 1 and len(value) == 1 else None

        reference = Poly.atom(Atom(alg.REF, False))
        if policy(left) is not None and not right:
            return self.additive(left, (tensor(reference),), -1.0, rhs)
        if policy(right) is not None and not left:
            return self.additive((tensor(reference),), right, -1.0, rhs)
        return ()

    def from_name(self, name: str, rhs: cst.CSTNode) -> tuple:
        """A value the expression did not explain, read from the target's name."""
        poly = roles.named_tensor(name, grad=not self.no_grad and not is_data_read(rhs))
        if poly is not None:
            return (tensor(poly),)
        if roles.is_mask_name(name):
            return (Fact(role="mask"),)
        return ()

    def sink(self, kind: str, value: tuple, node: cst.CSTNode) -> tuple:
        """Record that `value` reaches a loss, reward or advantage at `node`; returns it with its entry set."""
        node = self.here(node)
        marked = tuple(f if f.entry is not None or not f.is_kl() else replace(f, entry=node) for f in value)
        if kind == "loss":
            marked = self.mark_stale(marked)
        facts = tuple(f for f in marked if f.is_kl())
        if facts and self.record:
            note_entry(self, node)
            self.sinks.append(Sink(kind, facts, node, self.next_order()))
        self.confirm(value)
        self.settle(value)
        if kind == "loss":
            self.take_on(facts)
        return marked

    # ---- rewards by use: a value named *_rewards is a reward only if it is used as one -----------

    def reward_candidate(self, value: tuple, node: cst.CSTNode) -> tuple:
        """A KL value stored under a reward name waits: it is a reward sink once it reaches a loss,
        returns, advantages or code the analysis does not see; if it only feeds metrics or the
        statistics a loss function returns (a DPO loss's `chosen_rewards`), it is not one."""
        node = self.here(node)
        if node in self.confirmed:
            return self.sink("reward", value, node)
        # an earlier candidate this value came from (`kl_reward = beta * kl`, then `rewards = scores -
        # kl_reward`) was an intermediate on this path: the sign and estimator count where the reward
        # is final. It still waits for uses along paths that skip this assignment (an `if` branch).
        earlier = {p for f in value for p in f.pending if p is not node and p in self.waiting}
        marked = tuple(replace(f, entry=f.entry or node,
                               pending=tuple(p for p in f.pending if p not in earlier) + (node,)) if f.is_kl() else f
                       for f in value)
        facts = tuple(f for f in marked if f.is_kl())
        if facts and self.record:
            note_entry(self, node)
            earlier = self.waiting.get(node)
            facts = tuple(dict.fromkeys(earlier.facts + facts)) if earlier is not None else facts
            self.waiting[node] = Sink("reward", facts, node, earlier.order if earlier else self.next_order())
        return marked

    def loss_candidate(self, value: tuple, node: cst.CSTNode) -> tuple:
        """A KL value stored under a loss name is a loss term; when it flows on, with its gradient, into
        a later loss (`per_token_loss = -pg_loss + ...`), that later loss is the objective whose sign and
        form count, and the earlier name was a part of it (reported where the term first entered)."""
        node = self.here(node)
        marked = self.mark_stale(tuple(replace(f, entry=f.entry or node, pending=f.pending + (node,))
                                       if f.is_kl() else f for f in value))
        facts = tuple(f for f in marked if f.is_kl())
        self.take_on(facts, node)
        if facts and self.record:
            note_entry(self, node)
            earlier = self.loss_parts.get(node)
            facts = tuple(dict.fromkeys(earlier.facts + facts)) if earlier is not None else facts
            self.loss_parts[node] = Sink("loss", facts, node, earlier.order if earlier else self.next_order())
        self.confirm(value)
        self.settle(value)
        return marked

    def mark_stale(self, value: tuple) -> tuple:
        """KL terms entering a loss in a step that compares the policy with the samples' behaviour
        policy (a PPO ratio to `old_log_probs`, here or in a call given both) are on older samples."""
        if not any(f.is_kl() and not f.stale for f in value):
            return value
        ratios = [g for v in self.env.values() for g in v if holds_behaviour_ratio((g,))]
        # an alternative on an exclusive path (another switch value or branch) is no evidence for this one
        return tuple(replace(f, stale=True) if f.is_kl() and (
            self.compared or holds_behaviour_ratio((f,)) or any(compatible(g.labels, f.labels) for g in ratios))
            else f for f in value)

    def note_comparison(self, node: cst.Call) -> None:
        """A call given the policy's log-probs and, in another argument, the behaviour policy's
        (`policy_loss_fn(old_log_prob=..., log_prob=...)`) compares the two, like a ratio formed here."""
        if self.compared:
            return
        held = []
        for arg in node.args:
            value = self.env.get(arg.value.value) if isinstance(arg.value, cst.Name) else self._memo.get(id(arg.value))
            held.append(logprob_kinds(value or ()))
        self.compared = any(alg.POLICY in a and alg.OLD in b for i, a in enumerate(held)
                            for j, b in enumerate(held) if i != j)

    def take_on(self, facts: tuple, node: cst.CSTNode | None = None) -> None:
        """Earlier loss-named parts that these differentiable facts carry on are not losses of their own."""
        for f in facts:
            if f.poly is None or not f.poly.has_grad():
                continue
            for p in f.pending:
                part = self.loss_parts.get(p)
                # the same term carried on (not combined with another into a new term)
                if p is not node and part is not None and any(g.origin is f.origin for g in part.facts):
                    del self.loss_parts[p]

    def confirm(self, value: tuple) -> None:
        """The reward candidates `value` passed through are rewards after all: record their sinks."""
        for f in contained(value):
            for node in f.pending:
                waiting = self.waiting.pop(node, None)
                if waiting is not None:
                    self.confirmed.add(node)
                    self.sinks.append(waiting)
                    self.settle(waiting.facts)

    # ---- what became of each KL term (the terms nothing explains are KL100) ---------------------

    def settle(self, value: tuple) -> None:
        """The KL terms of `value` have a known use (a sink, a return, a metric, a comparison), and so
        have the terms the current statement read to make them."""
        self.settled.update(self.read)
        self.settled.update(f.origin for f in contained(value) if f.is_kl())

    def note_read(self, value: tuple) -> tuple:
        """Remember the KL terms a statement reads; returns `value`."""
        self.read.update(f.origin for f in value if f.origin is not None and f.is_kl())
        return value

    def track(self, value: tuple) -> None:
        """A KL term formed here and stored; the terms a new tensor was computed from are used by it."""
        origins = {f.origin for f in value if f.is_kl()}
        if any(f.role == "tensor" and f.poly is not None for f in value):
            self.settled.update(self.read - origins)  # a new term, or a margin in which the terms cancel
        for f in value:
            if f.is_kl() and f.origin is not None and f.calls == 0 and f.origin_path == self.module.path:
                self.formed.setdefault(f.origin, f)

    def next_order(self) -> int:
        self.sink_count += 1
        return self.sink_count

    def returned(self, node: cst.BaseExpression) -> None:
        """A reward returned by a function that is not a loss goes on to be used by its caller; a
        returned metrics dict (`return loss, metrics`) only records statistics."""
        parts = [e.value for e in node.elements] if isinstance(node, (cst.Tuple, cst.List)) else [node]
        for part in parts:
            if not roles.is_metrics_name(last_name(part)):
                self.confirm(self.expr(part))

    def stored_outside(self, target: cst.CSTNode, value: tuple) -> None:
        """`data.batch["token_level_rewards"] = r`, `experience.rewards = r`: the value leaves the function,
        to be used where the analysis cannot follow, unless the container only records metrics or is
        a dict local to this function."""
        holder = target.value
        names = [last_name(n) for n in _chain(holder)]
        if any(roles.is_metrics_name(n) for n in names if n):
            self.settle(value)  # a logged statistic
            return
        if isinstance(holder, cst.Name) and any(f.role == "dict" for f in self.env.get(holder.value, ())):
            return
        self.confirm(value)

    # ---- expressions -------------------------------------------------------------------

    def expr(self, node: cst.BaseExpression) -> tuple:
        """The facts of an expression; each is evaluated once per statement (the environment only
        changes between statements)."""
        key = id(node)
        if key in self._memo:
            return self._memo[key]
        method = getattr(self, "e_" + type(node).__name__, None)
        value = () if method is None else method(node)
        self._memo[key] = value
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
        return (Fact(role="str", text=node.evaluated_value),)

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
            if roles.is_reference_model(dotted(node.value)):
                return (tensor(Poly.atom(Atom(alg.REF_LOGITS, False))),)
            return (tensor(Poly.atom(Atom(alg.LOGITS, not self.no_grad))),)
        base = root_name(node)
        if base == "self":
            return ()
        entries = entry_of(self.expr(node.value), attr)
        if entries:
            return entries  # a record built with this field
        stored = self.stored(attr) if isinstance(node.value, cst.Name) else ()
        if stored:
            return stored  # `experience.kl`: what the module's code stored into `.kl` of some object
        poly = roles.named_tensor(attr, grad=not self.no_grad and roles.is_current_policy_name(attr))
        if poly is not None:
            return (tensor(poly),)
        if roles.is_mask_name(attr):
            return (Fact(role="mask"),)
        if not isinstance(node.value, cst.Name) or base not in self.env:
            return (Fact(role="str", name=attr),) if looks_like_option(attr) else ()
        return ()

    def e_Subscript(self, node: cst.Subscript) -> tuple:
        key = string_key(node)
        if key is not None:
            found = self.read_key(node.value, key)
            if found is not None:
                return found
            grad = not self.no_grad and (not is_data_read(node) or roles.is_current_policy_name(key))
            poly = roles.named_tensor(key, grad=grad)
            if poly is not None:
                return (tensor(poly),)
            if roles.is_mask_name(key):
                return (Fact(role="mask"),)
            return ()
        base = self.expr(node.value)
        last = is_last_index(node)
        if last:
            return tuple(replace(f, position=Position.LAST) if f.role == "tensor" else f for f in base)
        index = self.index_tuple(node)
        if index is not None:
            return index
        chosen = self.dispatch(node)
        if chosen is not None:
            return chosen
        if any(f.role == "str" for f in base):
            if drops_last_char(node):
                return tuple(replace(f, text=f.text[:-1]) if f.text else replace(f, cut=f.cut + 1)
                             for f in base if f.role == "str")
            return ()
        return base

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
            self.assign_target(clause.target, elements(self.expr(clause.iter)), rhs=clause.iter)
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
                items.append((element.key.evaluated_value, self.expr(element.value)))
        return (Fact(role="dict", items=tuple(items)),)

    def e_IfExp(self, node: cst.IfExp) -> tuple:
        label, decided = self.condition(node.test)
        if decided is True:
            return self.expr(node.body)
        if decided is False:
            return self.expr(node.orelse)
        body = operands(self.expr(node.body))
        orelse = operands(self.expr(node.orelse))
        if label is not None:
            body = tuple(replace(f, labels=merge_labels(f.labels, (label,))) for f in body)
            orelse = tuple(replace(f, labels=merge_labels(f.labels, _otherwise(label))) for f in orelse)
        return tuple(dict.fromkeys(body + orelse))

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

    def e_Comparison(self, node: cst.Comparison) -> tuple:
        """A comparison (`approx_kl > target_kl`) uses a KL value as a statistic."""
        self.settle(self.expr(node.left))
        for comparison in node.comparisons:
            self.settle(self.expr(comparison.comparator))
        return ()

    def e_BooleanOperation(self, node: cst.BooleanOperation) -> tuple:
        return ()

    def binary(self, left: tuple, right: tuple, op, node) -> tuple:
        name = type(op).__name__.replace("Assign", "")
        if name in ("Add", "Subtract"):
            return self.additive(left, right, -1.0 if name == "Subtract" else 1.0, node)
        if name == "Multiply":
            return self.multiply(left, right, node)
        if name == "Divide":
            return self.divide(left, right, node)
        if name == "Power":
            exponent = [f.poly.const_value() for f in right if f.poly is not None]
            if exponent and exponent[0] == 2.0:
                return self.multiply(left, left, node)
            return ()
        if name in ("BitAnd", "BitOr"):
            return tuple(f for f in left + right if f.role == "mask")[:1]
        return ()

    def additive(self, left: tuple, right: tuple, sign: float, node) -> tuple:
        counts = tuple(f for f in left + right if f.role in ("length", "ntokens"))
        if counts:
            return counts  # a token count plus an epsilon is still the count
        out = []
        for a in operands(left):
            for b in operands(right):
                a_tensor, b_tensor = a.role == "tensor" and a.poly is not None, b.role == "tensor" and b.poly is not None
                if a_tensor and b_tensor:
                    if not compatible(a.labels, b.labels):
                        continue
                    if a.scalar != b.scalar and a.is_kl() and b.is_kl():
                        # a per-token term minus a batch statistic of it (a baseline): the term goes on
                        out.append(replace(b, poly=alg.scale(b.poly, sign)) if a.scalar else a)
                        continue
                    out.append(combine(a, b, alg.add(a.poly, b.poly, sign), self.here(node), self.module.path))
                elif _constant(a if a_tensor else b) and UNKNOWN.role in (a.role, b.role):
                    continue  # a number plus a value the analysis cannot explain: no known value
                elif a_tensor:
                    out.append(a)  # a KL term plus another loss term or a score: the KL term goes on
                elif b_tensor:
                    out.append(replace(b, poly=alg.scale(b.poly, sign)))
        return bounded(tuple(dict.fromkeys(out)))

    def multiply(self, left: tuple, right: tuple, node) -> tuple:
        out = []
        negative_unknown = False
        for a in operands(left):
            for b in operands(right):
                a_tensor, b_tensor = a.role == "tensor" and a.poly is not None, b.role == "tensor" and b.poly is not None
                if a_tensor and b_tensor:
                    if compatible(a.labels, b.labels):
                        out.append(combine(a, b, alg.mul(a.poly, b.poly), self.here(node), self.module.path, product=True))
                elif a_tensor or b_tensor:
                    tensor_side, other = (a, b) if a_tensor else (b, a)
                    if _constant(tensor_side) and other.role == UNKNOWN.role:
                        continue  # `x * inv_temperature`: a number times an unexplained value is no known value
                    if other.role == KL_WEIGHT[0].role and tensor_side.is_kl():
                        continue  # a KL term weighted per token by a function of a log-ratio: no estimator
                    factor = -1.0 if other.role == "neg" else 1.0
                    out.append(replace(tensor_side, poly=alg.scale(tensor_side.poly, factor)))
                elif (a.role == "neg") != (b.role == "neg"):
                    negative_unknown = True
        if not out and negative_unknown:
            return NEG
        return bounded(tuple(dict.fromkeys(out)))

    def divide(self, left: tuple, right: tuple, node) -> tuple:
        out = []
        for f in left:
            if f.role != "tensor":
                continue
            if any(g.role == "length" for g in right):
                f = replace(f, aggregation=Aggregation.SEQ_MEAN)
            elif any(g.role == "ntokens" for g in right):
                f = replace(f, aggregation=Aggregation.BATCH_MEAN if f.aggregation in (None, Aggregation.SUM) else f.aggregation)
            elif any(g.role == "tensor" and g.poly is not None and not g.poly.is_const() for g in right):
                continue
            out.append(f)
        return tuple(out)

    # ---- calls ---------------------------------------------------------------------------

    def e_Call(self, node: cst.Call) -> tuple:
        func = node.func
        value = None
        if isinstance(func, cst.Attribute):
            value = self.method_call(func.attr.value, func.value, node)
        if value is None:
            value = self.call_target(func, node)
        self.note_comparison(node)
        return value

    def call_target(self, func: cst.BaseExpression, node: cst.Call) -> tuple:
        """A call of `func` with the arguments of `node` (`f.remote(...)` calls f with them)."""
        callees = self.callable_values(func)
        if callees:
            # a callee picked by a switch (a dispatch table's entry) gives results under that switch value
            return tuple(dict.fromkeys(replace(fact, labels=merge_labels(fact.labels, held.labels))
                                       for held in callees for fact in self.call_callee(held.callee, node)
                                       if compatible(fact.labels, held.labels)))
        resolved = self.analyzer.resolve(self.module, func, self.cls, imports=self.worth_following(node))
        if resolved is not None:
            return self.call_summary(resolved, node)
        name = dotted(func).split(".")[-1]
        if roles.is_return_computation(name):
            for arg in node.args:  # rewards handed to a GAE / RLOO / GRPO advantage outside the tree
                self.confirm(self.expr(arg.value))
        elif any(roles.is_metrics_name(last_name(part)) for part in _chain(func)):
            for arg in node.args:  # logged: `self.log(...)`, `gather_for_metrics(kl)`, `self.stats[k].append(kl)`
                self.settle(self.expr(arg.value))
        # an imported class is followed when its words speak of KL or a loss (KLEstimator) or KL facts go in
        words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name)
        classdef = (self.analyzer.resolve_class(self.module, func, imports=self.worth_following(node)
                                                or roles.might_contain_kl(words) or "estimator" in name.lower())
                    if name[:1].isupper() else None)
        if classdef is not None:
            return self.instance(*classdef, node)
        if name == "partial":
            return self.partial(node)
        if name == "dict" or (name[:1].isupper() and node.args and all(a.keyword is not None for a in node.args)):
            return self.build_record([], [], self.args(node)[1])  # dict(kl=kl), Experience(kl=kl, ...)
        return self.library_call(name, node)

    def worth_following(self, node: cst.Call) -> bool:
        """Follow a call into another module only when it can matter: KL or log-prob facts go in,
        or its name speaks of KL, log-probs or a loss (parsing other modules is the costly part)."""
        name = dotted(node.func).split(".")[-1]
        if roles.might_contain_kl(name) or "loss" in name.lower() or "reward" in name.lower():
            return True
        return any(f.role == "tensor" and f.poly is not None and not f.poly.is_const()
                   for arg in node.args for f in self.expr(arg.value))

    def args(self, node: cst.Call) -> tuple:
        positional = [a.value for a in node.args if a.keyword is None and not a.star]
        keywords = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
        return positional, keywords

    def call_callee(self, callee: Callee, node: cst.Call) -> tuple:
        """A call of a function held as a value: its closure and the partial's bound arguments come first."""
        bound = {name: tuple(replace(f, passed=True) if f.is_kl() else f for f in facts)
                 for name, facts in callee.bound_keywords}
        return self.call_summary((callee.module, callee.func, callee.cls), node, dict(callee.closure), callee.bound, bound)

    def call_summary(self, resolved, node: cst.Call, closure=None, bound=(), bound_keywords=None) -> tuple:
        module, func, cls = resolved
        positional, keywords = self.args(node)
        positional = [*bound, *positional]
        parameters = params(func)
        if parameters and parameters[0].name.value in ("self", "cls") and (cls is not None):
            parameters = parameters[1:]
        env = dict(closure or {})
        spread = any(a.star == "**" for a in node.args)  # f(x, **options): any parameter may come from it
        spread_entries: dict = {}  # the entries of a spread dict the analysis knows (`f(**{"mode": m})`)
        for a in node.args:
            if a.star == "**":
                for key, facts in (item for f in self.expr(a.value) if f.role == "dict" for item in f.items):
                    spread_entries[key] = tuple(dict.fromkeys(spread_entries.get(key, ()) + facts))
        for index, param in enumerate(parameters):
            name = param.name.value
            arg = positional[index] if index < len(positional) else keywords.get(name, spread_entries.get(name))
            if bound_keywords and name in bound_keywords and arg is None:
                env[name] = bound_keywords[name]
                continue
            if isinstance(arg, tuple):  # facts bound ahead of the call
                env[name] = tuple(replace(f, passed=True) if f.is_kl() else f for f in arg)
                continue
            if arg is not None:
                facts = tuple(replace(f, passed=True) if f.is_kl() else f for f in self.expr(arg))
                if any(f.role == "str" for f in facts) or not facts:
                    label = last_name(arg)
                    facts = tuple(replace(f, name=f.name or label) if f.role == "str" else f for f in facts)
                    if not facts:
                        # an argument the analysis cannot explain: the parameter's name can (a tensor
                        # role), else it is taken for a switch value named after the argument
                        facts = tuple(f for f in param_facts(param) if f.role in ("tensor", "mask"))
                    if not facts and label and not roles.tensor_role(label):
                        facts = (Fact(role="str", name=label),)
                env[name] = facts
            elif param.default is not None:
                default = param.default
                if spread and isinstance(default, cst.Name) and default.value == "None":
                    env[name] = ()  # maybe set by the spread dict: `if x is None:` decides nothing
                elif isinstance(default, cst.SimpleString):
                    env[name] = (Fact(role="str", name=name),)
                elif isinstance(default, cst.Name) and default.value in ("True", "False"):
                    env[name] = (Fact(role="bool", name=name),)
                else:
                    env[name] = self.expr(default) if isinstance(default, (cst.Name, cst.Integer, cst.Float)) else ()
            else:
                env[name] = param_facts(param)
        outcome = self.analyzer.call(module, func, cls, env)
        for facts in env.values():
            self.settle(facts)  # handed to a function of the tree, whose analysis follows it
        # where a term already entered a loss or reward here, it stays reported there; a term that enters
        # one inside the callee is reported at this call
        entered = {f.entry for facts in env.values() for f in facts if f.entry is not None}
        for sink in outcome.sinks:
            self.sink(sink.kind, tuple(replace(f, entry=f.entry if f.entry in entered else None, passed=False)
                                       for f in sink.facts), node)
        return outcome.returns

    def method_call(self, method: str, base_node: cst.BaseExpression, node: cst.Call) -> tuple | None:
        positional, keywords = self.args(node)
        if roles.BACKWARD_CALLS.match(method):
            target = self.expr(base_node) if not positional else self.expr(positional[0])
            self.sink("loss", loss_part(target), node)
            return ()
        if method in ("log_prob",) and dotted(base_node).split(".")[-1].rstrip("()") in ("Categorical", "Normal"):
            return self.from_name("log_prob", node) or (tensor(Poly.atom(Atom(alg.POLICY, not self.no_grad))),)
        receiver_name = dotted(base_node)
        if receiver_name in ("torch", "F", "torch.nn.functional", "nn.functional", "np", "math", "numpy"):
            return None
        if method == "remote":  # a Ray task or actor method: the function, called with these arguments
            return self.call_target(base_node, node)
        if method in ("get", "pop") and positional and isinstance(positional[0], cst.SimpleString):
            default = positional[1] if len(positional) > 1 else keywords.get("default")
            return self.read_get(base_node, positional[0].evaluated_value, default)
        if method in ("append", "extend") and len(positional) == 1 and last_name(base_node):
            self.add_to_list(base_node, method, positional[0], node)
            return ()
        base = self.expr(base_node)
        if method in ("endswith", "startswith", "lower", "upper", "strip"):
            return base if method in ("lower", "upper", "strip") else ()
        if not base:
            return None if method not in ("sum", "mean") else ()
        return self.tensor_method(method, base, positional, keywords, node)

    def tensor_method(self, method, base, positional, keywords, node) -> tuple:
        if method in ("detach", "item", "tolist", "numpy", "cpu", "detach_", "clone_detach"):
            if roles.LOGGING_METHODS.match(method):
                self.settle(base)  # a host copy or a Python number: a statistic
            return detach_all(base)
        if method in RESHAPING_METHODS:
            return base
        if method in ("clamp", "clamp_", "clip", "clip_", "clamp_min", "clamp_max"):
            return tuple(replace(f, clamped=True) if f.role == "tensor" else f for f in base)
        if method in ("sum", "mean", "nansum", "nanmean"):
            return self.reduce(base, method, self.dim(positional[0] if positional else keywords.get("dim", keywords.get("axis"))),
                               node)
        if method in ("exp", "log", "abs", "square", "expm1", "neg", "log_softmax", "softmax"):
            return self.unary_math(method, base, node)
        if method == "pow":
            if positional and int_literal(positional[0]) == 2:
                return self.multiply(base, base, node)
            return ()
        if method == "gather":
            return gather(base)
        if method == "flip":
            return tuple(replace(f, flipped=not f.flipped) for f in base)
        if method == "cumsum":
            self.confirm(tuple(f for f in base if f.flipped))  # a reward-to-go: the summed values are rewards
            return tuple(replace(f, poly=alg.accumulate(f.poly, alg.TO_GO), flipped=False) if f.flipped and f.poly is not None
                         else f for f in base)
        if method in ("mul", "multiply"):
            return self.multiply(base, self.expr(positional[0]), node) if positional else base
        if method in ("add", "sub", "subtract"):
            if not positional:
                return base
            return self.additive(base, self.expr(positional[0]), 1.0 if method == "add" else -1.0, node)
        if method in ("div", "divide"):
            return self.divide(base, self.expr(positional[0]), node) if positional else base
        return ()

    def dim(self, node) -> bool | None:
        """True for a reduction over the token axis (per row), False over everything, None over the batch axis."""
        if node is None:
            return False
        if int_literal(node) == 0:
            return None
        facts = self.expr(node)
        return any(f.role == "tensor" and f.poly is not None and f.poly.is_const() for f in facts) or (
            not facts and not isinstance(node, cst.Name))

    def reduce(self, base: tuple, method: str, per_row: bool | None, node) -> tuple:
        if per_row is None:
            return base  # over the batch axis: the per-sequence terms are kept
        out = []
        for f in base:
            if f.role == "mask":
                out.append(Fact(role="length" if per_row else "ntokens"))
                continue
            if f.role != "tensor" or f.poly is None:
                continue
            vocab = over_vocab(f.poly)
            if vocab is not None and per_row:
                out.append(replace(f, poly=vocab, origin=self.here(node)))
                continue
            if vocab is not None and vocab.terms and per_row is False:
                # `p * (log p - log q)` summed over every axis at once (tokens flattened by a mask
                # index): the exact per-step KL, summed (or averaged) over the tokens
                aggregation = f.aggregation or (Aggregation.SUM if method == "sum" else Aggregation.CONSTANT)
                out.append(replace(f, poly=vocab, origin=self.here(node), aggregation=aggregation, scalar=True))
                continue
            if per_row and f.poly.atoms() and all(a.acc == alg.SEQUENCE for a in f.poly.atoms()):
                out.append(replace(f, scalar=True))  # already one value per sequence: a group statistic
                continue
            if per_row:
                poly = alg.accumulate(f.poly, alg.SEQUENCE)
                aggregation = Aggregation.SEQ_MEAN if method == "mean" else (f.aggregation or Aggregation.SUM)
                out.append(replace(f, poly=poly, aggregation=aggregation))
            else:
                aggregation = f.aggregation or (Aggregation.SUM if method == "sum" else Aggregation.CONSTANT)
                out.append(replace(f, aggregation=aggregation, scalar=True))
        return tuple(out)

    def unary_math(self, fn: str, base: tuple, node) -> tuple:
        out = []
        for f in base:
            if f.role != "tensor" or f.poly is None:
                continue
            mean = fn == "exp" and f.aggregation is Aggregation.SEQ_MEAN and any(
                a.acc == alg.SEQUENCE for a in f.poly.atoms())
            if mean:  # exp of a log-ratio averaged over the response: a weight, not a length-normalised KL
                f = replace(f, poly=f.poly.map_atoms(lambda a: a.accumulated(alg.SEQUENCE_MEAN)
                                                     if a.acc == alg.SEQUENCE else a), aggregation=None)
            poly = apply_math(fn, f.poly)
            if poly is None:
                continue
            position = f.position
            if fn in ("exp", "abs", "square", "expm1") and f.is_kl() and any(a.acc == alg.SEQUENCE for a in f.poly.atoms()):
                position = Position.SEQUENCE
            out.append(replace(f, poly=poly, origin=self.here(node), origin_path=self.module.path, position=position))
        return tuple(out)

    def library_call(self, name: str, node: cst.Call) -> tuple:
        positional, keywords = self.args(node)
        # the tensor operated on: the first positional argument, or its keyword (agg_loss(loss_mat=...))
        first_node = positional[0] if positional else next((keywords[k] for k in TENSOR_KEYWORDS if k in keywords), None)
        first = self.expr(first_node) if first_node is not None else ()
        if name in ("exp", "log", "abs", "square", "expm1", "log_softmax", "softmax", "neg", "negative"):
            return self.unary_math(name, first, node)
        if name in ("clamp", "clip", "clamp_"):  # as the method: a clamped token count is still the count
            return tuple(replace(f, clamped=True) if f.role == "tensor" else f for f in first)
        if name in ("sigmoid", "tanh", "softplus", "relu", "erf") and any(
                f.is_kl() and not f.scalar and all(a.acc == alg.TOKEN for a in f.poly.atoms()) for f in first):
            return KL_WEIGHT
        if name in ("sum", "mean") and not (name == "sum" and isinstance(node.func, cst.Name)):
            dim = positional[1] if len(positional) > 1 else keywords.get("dim", keywords.get("axis"))
            return self.reduce(first, name, self.dim(dim), node)
        if name == "square":
            return self.multiply(first, first, node)
        if name == "pow" and len(positional) > 1 and int_literal(positional[1]) == 2:
            return self.multiply(first, first, node)
        if name == "gather":
            return gather(first)
        if name in ("flip", "fliplr", "cumsum"):
            return self.tensor_method("flip" if name != "cumsum" else "cumsum", first, positional[1:], keywords, node)
        if name in ("masked_mean", "masked_sum", "agg_loss", "aggregate_loss", "masked_aggregator", "sum_of_sample_mean"):
            return self.aggregate(name, first, positional, keywords)
        if name == "kl_div":
            return self.kl_div(positional, keywords, node)
        if name in PASS_THROUGH and len(node.args) == 1 and (name != "get" or dotted(node.func) == "ray.get"):
            return first  # a conversion or a fetch that hands its tensor back (TensorData.from_torch(x))
        if name == "detach":
            return detach_all(first)
        if name == "float":
            return first
        if isinstance(node.func, cst.Name) or dotted(node.func).split(".")[0] in PASS_THROUGH_RECEIVERS:
            # torch.masked_fill(x, m, v), not a method of a receiver the analysis does not know
            if name in RESHAPING_FUNCTIONS:
                return first
            if name == "tensor":
                return detach_all(first)  # torch.tensor(x) copies the values, not the graph
        if name in ("stack", "cat", "vstack", "hstack", "concat", "concatenate") or (
                name == "sum" and isinstance(node.func, cst.Name)):  # builtin sum: over the first axis
            # the terms of a list, side by side or added up: each keeps its meaning; a stacked
            # literal list keeps its positions too, for an index that picks one (kl_4BT[estimator])
            stacked = tuple(f for f in first if f.role == "tuple") if name != "sum" else ()
            return stacked + elements(first)
        if name == "zip" or name.endswith("_zip") or name == "safezip":  # zip and its strict variants
            return zipped([self.expr(arg) for arg in positional])
        if name == "enumerate":
            return enumerated(first)
        if name in ("max", "min") and len(positional) == 2 and int_literal(positional[1]) is not None:
            return ()  # torch.max(x, dim): the largest entry along an axis, no per-token term
        if name in ("max", "min", "maximum", "minimum") and len(positional) == 2:
            return tuple(dict.fromkeys(operands(first) + operands(self.expr(positional[1]))))
        if name == "where" and len(positional) == 3:
            return self.where(*positional)
        if roles.LOGPROB_PRODUCERS.match(name):
            kinds = {a.kind for f in first if f.poly is not None for a in f.poly.atoms()}
            return per_token_from_logits(kinds, first) or ()
        if name in ("cross_entropy",):
            return ()
        if name in ("masked_whiten", "whiten"):
            return ()
        return ()

    def where(self, condition, when_true, when_false) -> tuple:
        """torch.where(m, a, b): a or b. Labelled by the mask's name, so that where(m, a, b) and
        where(~m, a, b) in one expression pick opposite sides (a DPO pair's chosen and rejected)."""
        negated = isinstance(condition, cst.UnaryOperation) and isinstance(condition.operator, (cst.BitInvert, cst.Not))
        name = dotted(condition.expression if negated else condition)
        sides = [self.expr(when_true), self.expr(when_false)]
        for kept, cut in (sides, sides[::-1]):
            if kept and any(f.poly is not None and f.poly.has_grad() for f in kept) and detach_all(kept) == cut:
                # where(m, x, x.detach()): x, with its gradient cut on the tokens the condition rejects
                return tuple(replace(f, clamped=True) if f.role == "tensor" else f for f in kept)
        if name:
            sides = [tuple(replace(f, labels=merge_labels(f.labels, ((name, (side != negated,)),))) for f in facts)
                     for side, facts in zip((True, False), sides)]
        return tuple(dict.fromkeys(sides[0] + sides[1]))

    def aggregate(self, name, first, positional, keywords) -> tuple:
        if name == "masked_mean":
            dim = positional[2] if len(positional) > 2 else keywords.get("dim", keywords.get("axis"))
            aggregation = Aggregation.SEQ_MEAN if self.dim(dim) else Aggregation.BATCH_MEAN
        elif name == "masked_sum":
            aggregation = Aggregation.SUM
        elif name in ("agg_loss", "aggregate_loss", "masked_aggregator"):
            mode = positional[2] if len(positional) > 2 else keywords.get("loss_agg_mode") or keywords.get("mode")
            if mode is not None and not isinstance(mode, cst.SimpleString):
                return self.each_agg_mode(first, mode)
            aggregation = agg_mode(mode)
        else:
            aggregation = Aggregation.SEQ_MEAN
        out = []
        for f in first:
            if f.role != "tensor":
                continue
            out.append(replace(f, aggregation=f.aggregation or aggregation, scalar=aggregation is not Aggregation.SEQ_MEAN))
        return tuple(out)

    def each_agg_mode(self, first: tuple, mode: cst.BaseExpression) -> tuple:
        """A `loss_agg_mode` the code reads from its configuration: every mode the aggregator knows,
        each under its value of the switch (a string the analysis knows picks its own)."""
        known = [f.text for f in self.expr(mode) if f.role == "str" and f.text in AGG_MODES]
        switch = last_name(mode) or "loss_agg_mode"
        out = []
        for value in known or list(AGG_MODES):
            aggregation = AGG_MODES[value]
            labels = () if known else ((switch, (value,)),)
            out.extend(replace(f, aggregation=f.aggregation or aggregation, labels=merge_labels(f.labels, labels),
                               scalar=aggregation is not Aggregation.SEQ_MEAN)
                       for f in first if f.role == "tensor")
        return tuple(out)

    def kl_div(self, positional, keywords, node) -> tuple:
        """F.kl_div(input, target, log_target=True) is target.exp() * (target - input): KL(target || input)."""
        if len(positional) < 2 and "target" not in keywords:
            return ()
        source = self.expr(positional[0] if positional else keywords["input"])
        target = self.expr(positional[1] if len(positional) > 1 else keywords["target"])
        reduction = keywords.get("reduction")
        elementwise = isinstance(reduction, cst.SimpleString) and reduction.evaluated_value == "none"
        out = []
        for t in target:
            for s in source:
                if t.poly is None or s.poly is None:
                    continue
                prob = apply_math("exp", t.poly)
                if prob is None:
                    continue
                poly = alg.mul(prob, alg.add(t.poly, s.poly, -1.0))
                if not elementwise:
                    poly = over_vocab(poly)
                    if poly is None or not poly.terms:
                        continue
                fact = replace(t, poly=poly, origin=self.here(node), origin_path=self.module.path)
                out.append(fact if elementwise else replace(fact, aggregation=Aggregation.SUM))
        return tuple(out)


def registered_names(func: cst.FunctionDef) -> frozenset:
    """The string literals listed in a registering decorator of `func` (`@register_loss(Settings(names=["k1",
    "k3"]))`): the names a registry runs it under."""
    names: set = set()
    for decorator in func.decorators:
        if "register" not in dotted(decorator.decorator.func if isinstance(decorator.decorator, cst.Call)
                                    else decorator.decorator).lower():
            continue
        for node in _subtree(decorator.decorator):
            if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
                names |= set(string_literals(node) or ())
    return frozenset(names)


def _subtree(node: cst.CSTNode):
    yield node
    for child in node.children:
        yield from _subtree(child)


def _chain_leaves(stmt: cst.If) -> bool:
    """Whether every branch of an if/elif chain without a final else returns or raises."""
    return _leaves(stmt.body) and (stmt.orelse is None or isinstance(stmt.orelse, cst.If) and _chain_leaves(stmt.orelse))


def _otherwise(label: tuple | None) -> tuple:
    """The labels that hold where the test labelled `label` is false: () where labels cannot say it
    (the values other than some literals)."""
    values = negated(label[1]) if label is not None else None
    return ((label[0], values),) if values is not None else ()


def _either(left: tuple | None, right: tuple | None) -> tuple | None:
    """The label of `a or b` for tests of one switch: the union of their literals or patterns, or a negated
    pattern that the other side's literals all take (`not kind.endswith("+") or kind in ("k2", "mse")`)."""
    if left is None or right is None or left[0] != right[0]:
        return None
    for one, other in ((left[1], right[1]), (right[1], left[1])):
        if all(is_negated_pattern(v) for v in one) and all(not is_pattern(v) and not is_negated_pattern(v)
                                                            and takes(v, one) for v in other):
            return left[0], one
    kinds = {(is_pattern(v), is_negated_pattern(v)) for v in left[1] + right[1]}
    return (left[0], tuple(dict.fromkeys(left[1] + right[1]))) if len(kinds) == 1 and (False, True) not in kinds \
        else None


def spelled(facts: tuple, strings: tuple) -> tuple:
    """The switch values that make an alternative of `facts` equal one of `strings`: the strings, or, for
    the switch with its end cut off under an endswith test (`kind[:-1]` where `kind.endswith("+")`), the
    strings with that end put back (`kind[:-1] == "k3"` is `kind == "k3+"`); none where the cut is unknown."""
    out: list = []
    for f in operands(facts):
        if f.role != "str" or not f.cut:
            out += strings
            continue
        ends = [v[1:] for name, values in f.labels if name == f.name for v in values
                if is_pattern(v) and len(v) - 1 == f.cut]
        out += [string + end for string in strings for end in ends]
    return tuple(dict.fromkeys(out))


def _constant(fact: Fact) -> bool:
    """A number (a literal, or arithmetic of literals): no tensor of the trainer."""
    return fact.role == "tensor" and fact.poly is not None and fact.poly.is_const()


def _leaves(body: cst.BaseSuite) -> bool:
    """Whether a block always ends in `return` or `raise`."""
    last = body.body[-1] if body.body else None
    if isinstance(last, cst.SimpleStatementLine):
        last = last.body[-1] if last.body else None
    return isinstance(last, (cst.Return, cst.Raise))


def _chain(node: cst.CSTNode) -> list:
    """The parts of an attribute / subscript / call chain, outermost first: `self.stats[k]` -> [stats[k], stats, self]."""
    out = []
    while isinstance(node, (cst.Attribute, cst.Subscript, cst.Call)):
        out.append(node)
        node = node.func if isinstance(node, cst.Call) else node.value
    out.append(node)
    return out
