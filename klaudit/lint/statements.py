"""Statements: blocks, loops, `with`, `try`, `if`/`elif`/`else` and `match`, returns.

Statements are walked in order. An `if` whose test the analysis decides runs one branch; otherwise
both run and their environments are joined, each branch's values labelled with the switch value
that selects it (klaudit.lint.conditions says which). Statements after `if test: return` run where
the test is false. Loops run twice, so that values carried from one iteration to the next are
seen; a `with torch.no_grad()` block makes its new tensors carry no gradient.
"""

from __future__ import annotations

from typing import cast

import libcst as cst

from klaudit.lint import roles
from klaudit.lint.conditions import where_false
from klaudit.lint.containers import rows
from klaudit.lint.evidence import note_assignment
from klaudit.lint.facts import (
    Fact,
    as_reference,
    compatible,
    detach_all,
    join_envs,
    loss_part,
    merge_labels,
    negated,
    operands,
    replace,
    with_loss_part,
)
from klaudit.lint.flowstate import FlowState
from klaudit.lint.syntax import (
    case_strings,
    dotted,
    handles_one_sequence,
    int_literal,
    is_no_grad_block,
    is_reference_block,
    last_name,
    walk,
)

# the kinds of assignment statement, compared by type(): a failed isinstance on a LibCST class is costly
_ASSIGNMENTS = frozenset((cst.Assign, cst.AnnAssign, cst.AugAssign))


class StatementFlow(FlowState):
    """The statements of a function body, for klaudit.lint.flow.FunctionRun."""

    def block(self, body: cst.BaseSuite) -> None:
        if type(body) is cst.SimpleStatementSuite:
            for small in body.body:
                self.small(small)
            return
        for stmt in body.body:
            if self.statement(stmt):
                return  # the statements after it never run

    def statement(self, stmt: cst.CSTNode) -> bool:
        """Interpret `stmt`; whether it surely leaves the block (an `if` decided true whose body returns)."""
        self._memo = {}
        self.read = set()
        self.stmt = stmt
        if type(stmt) is cst.SimpleStatementLine:
            for small in stmt.body:
                self.small(small)
        elif type(stmt) is cst.If:
            return self.if_statement(stmt)
        elif type(stmt) is cst.For or type(stmt) is cst.While:
            reverse = isinstance(stmt, cst.For) and _runs_backwards(stmt.iter)
            elements_iterated = rows(self.expr(stmt.iter)) if isinstance(stmt, cst.For) else ()
            reused = self.reused
            self.reused = reused or self.module.loop_reuses_samples(stmt, self.cls)
            self.loop_variables.append(frozenset(node.value for node in walk(stmt.target) if type(node) is cst.Name)
                                       if isinstance(stmt, cst.For) else frozenset())
            self.batch_indices.append({} if reverse else _batch_index(stmt))
            self.position_indices.append(_position_index(stmt))
            one_sequence = handles_one_sequence(stmt)
            self.one_sequence_loops += one_sequence
            self.running_loops.append(stmt)
            for _ in range(2):  # twice, so that values carried from one iteration to the next are seen
                if isinstance(stmt, cst.For):
                    # loop variables, bound again at each iteration: the elements of what is iterated, else
                    # roles from their names (`for k in kl: k *= -beta` scales each element once)
                    self.assign_target(stmt.target, elements_iterated, rhs=stmt.iter)
                if reverse:
                    self.reverse_loop[id(stmt)] = stmt
                self.block(stmt.body)
                self.reverse_loop.pop(id(stmt), None)
            self.reused = reused
            self.loop_variables.pop()
            self.batch_indices.pop()
            self.position_indices.pop()
            self.one_sequence_loops -= one_sequence
            self.running_loops.pop()
            # training loops run: the state after the body, not a join with the state before it
            if stmt.orelse is not None:
                self.block(stmt.orelse.body)
        elif isinstance(stmt, cst.With):
            saved = self.no_grad
            if is_no_grad_block(stmt):
                self.no_grad = True
            for item in stmt.items:
                if item.asname is not None:
                    self.assign_target(item.asname.name, ())
            before = dict(self.env) if is_reference_block(stmt) else None
            self.block(stmt.body)
            self.no_grad = saved
            if before is not None:
                self.env.update({name: as_reference(value) for name, value in self.env.items()
                                 if before.get(name) is not value})
        elif isinstance(stmt, cst.Try):
            before = dict(self.env)
            self.block(stmt.body)
            raised = join_envs(before, self.env)  # an exception may stop the body anywhere
            if stmt.orelse is not None:
                self.block(stmt.orelse.body)
            ends = [self.env]
            for handler in stmt.handlers:  # each handler from where the body stopped, not after another
                self.env = dict(raised)
                self.block(handler.body)
                ends.append(self.env)
            self.env = ends[0]
            for end in ends[1:]:
                self.env = join_envs(self.env, end)
            if stmt.finalbody is not None:
                self.block(stmt.finalbody.body)
        elif isinstance(stmt, cst.Match):
            self.match_statement(stmt)
        elif isinstance(stmt, cst.FunctionDef):
            self.define(stmt)
        return False

    def if_statement(self, stmt: cst.If) -> bool:
        """Interpret an if/elif/else chain; whether the branch it surely takes returns or raises."""
        label, decided = self.condition(stmt.test)
        # a test of None is decided from what the analysis holds, which is never sure that an unexplained
        # value is not None: the statements after the branch it takes are still interpreted
        sure = not self.tests_none(stmt.test)
        if decided is True:
            self.block(stmt.body)
            return sure and _leaves(stmt.body)
        if decided is False:
            if isinstance(stmt.orelse, cst.If):
                return self.if_statement(stmt.orelse) and sure
            if stmt.orelse is not None:
                self.block(stmt.orelse.body)
                return sure and _leaves(stmt.orelse.body)
            return False
        before = dict(self.env)
        saved = self.labels
        self.labels = merge_labels(self.labels, self.holding(stmt.test))
        self.block(stmt.body)
        self.labels = saved
        after_body = self.env
        self.env = dict(before)
        otherwise = where_false(label)  # the switch values where the test is false, where labels can say so
        if type(stmt.orelse) is cst.If:
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
            # `if flag: kl = kl * ratio` without else: where the test is false, kl keeps its old value (one the
            # analysis cannot explain too: it holds there only, not beside the body's in a later `r - r.sum(0)`)
            for name, facts in before.items():
                if after_body.get(name) != facts:
                    self.env[name] = tuple(replace(f, labels=merge_labels(f.labels, otherwise))
                                           for f in operands(facts))
        self.env = join_envs(after_body, self.env)
        if _chain_leaves(stmt):
            # `if test: return` (or an elif chain whose every branch returns, without else): the statements
            # after it run only where every test is false
            branch: cst.BaseSuite | cst.If | cst.Else | None = stmt
            while isinstance(branch, cst.If):
                self.labels = merge_labels(self.labels, self.negation(branch.test))
                branch = branch.orelse
        return False

    def tests_none(self, test: cst.BaseExpression) -> bool:
        """`x is None`, `x is not None`, `not exists(x)`: a test of whether a value is None."""
        return any(isinstance(node, cst.ComparisonTarget) and isinstance(node.operator, (cst.Is, cst.IsNot))
                   or isinstance(node, cst.Call) and self.none_test(node.func) is not None for node in walk(test))

    def match_statement(self, stmt: cst.Match) -> None:
        subject = self.expr(stmt.subject)
        name = next((f.name for f in subject if f.role == "str"), last_name(stmt.subject))
        before = dict(self.env)
        merged = dict(before)
        saved = self.labels
        earlier: tuple[str, ...] = ()  # the strings of the cases above, which a catch-all case is none of
        for case in stmt.cases:
            values = case_strings(case.pattern)
            self.env = dict(before)
            label = values or (negated(earlier) if _catches_all(case) and earlier else None)
            if label:
                self.labels = merge_labels(saved, ((name, label),))
            earlier += values if case.guard is None else ()
            self.block(case.body)
            self.labels = saved
            merged = join_envs(merged, self.env)
        self.env = merged

    def summed_over_the_loop(self, small: cst.Assign, value: tuple) -> tuple:
        """`total = total + x` run again by the loop, `total` holding only what `x` made before: the sum over the
        iterations of the same term, not twice it (a trajectory's log-prob summed over its denoising steps stays
        log pi of the trajectory, which exp of a log-ratio needs at coefficient 1)."""
        name = cast("cst.Name", small.targets[0].target).value
        added = self.expr(_added_term(small))
        polys = {f.poly for f in added if f.role == "tensor"}
        held = [f for f in self.env.get(name, ()) if f.role == "tensor"]
        if held and polys and all(f.poly in polys for f in held):
            return added
        return value

    def small(self, small: cst.CSTNode) -> None:
        self._memo = {}
        self.read = set()
        self.stmt = small
        if type(small) is cst.Assign:
            value = self.loop_carried(small) or self.expr(small.value)
            if self.loop_variables and _adds_to_itself(small):
                value = self.summed_over_the_loop(small, _counted_over_the_loop(value))
            for target in small.targets:
                self.assign_target(target.target, value, small, rhs=small.value)
        elif type(small) is cst.AnnAssign and small.value is not None:
            self.assign_target(small.target, self.expr(small.value), small, rhs=small.value)
        elif type(small) is cst.AugAssign and type(small.target) is cst.Subscript:
            self.add_into_positions(small)
        elif type(small) is cst.AugAssign:
            value = self.loop_carried(small) or self.binary(self.expr(small.target), self.added_in_place(small), small.operator, small)
            if self.loop_variables and type(small.operator) is cst.AddAssign:
                value = _counted_over_the_loop(value)
            self.assign_target(small.target, value, small, rhs=small.value, augmented=True)
        if self.record and type(small) in _ASSIGNMENTS:
            note_assignment(self, small)
        if type(small) is cst.Expr:
            self.expr(small.value)
        elif type(small) is cst.Return and small.value is not None:
            value = self.expr(small.value)
            value = tuple(replace(f, labels=merge_labels(f.labels, self.labels)) for f in value
                          if compatible(f.labels, self.labels))
            if self.loss_function:
                value = with_loss_part(value, self.sink("loss", loss_part(value), small))
            else:
                self.returned(small.value)
            self.settle(value)
            self.returns.extend(value)

    def added_in_place(self, small: cst.AugAssign) -> tuple:
        """What `x += y` adds to x. Under no_grad the in-place update keeps x's own gradient (autograd does not
        record it, and does not undo what x had): only y is without one, cut where it had one (row 1c: `loss +=
        beta * kl` in a `with torch.no_grad():` block adds a KL term that has no gradient)."""
        added = self.expr(small.value)
        return detach_all(added) if self.no_grad else added

    def add_into_positions(self, small: cst.AugAssign) -> None:
        """`x[idx] += y` changes some positions of x, which keeps its meaning (a score added at the last
        token of a k1 reward); when y carries a KL term, x now holds it too (`returns[j, t] += kl[j, t]`
        filling a zero buffer)."""
        added = self.added_in_place(small)
        if any(f.poly is not None and f.poly.atoms() for f in added):
            if self.fills_by_loop(small.target):
                value = added  # each pass writes its own positions: the buffer holds what is written
            else:
                value = self.binary(self.expr(small.target), added, small.operator, small)
            self.assign_target(small.target, value, small, rhs=small.value, augmented=True)

    def fills_by_loop(self, target: cst.BaseAssignTargetExpression) -> bool:
        """`buffer[i, start - offset:end - offset] += chunk` inside `for start in range(...)`: positions picked by
        the innermost loop's variable, a different part at each pass (a chunked fill of a zero buffer, ColossalChat's
        memory_efficient_logprob), not a sum over the passes (`total[i] += kl[i, t]` over t)."""
        innermost = self.loop_variables[-1] if self.loop_variables else frozenset()
        return type(target) is cst.Subscript and bool(innermost) and any(type(node) is cst.Name and node.value in innermost
                                       for element in target.slice for node in walk(element))

    def returned(self, node: cst.BaseExpression) -> None:
        """A reward returned by a function that is not a loss goes on to be used by its caller, also as
        an entry of a dict filled here (`data["rewards_with_kl"] = r; return data`); a returned metrics
        dict (`return loss, metrics`) only records statistics."""
        parts = [e.value for e in node.elements] if isinstance(node, (cst.Tuple, cst.List)) else [node]
        for part in parts:
            if not roles.is_metrics_name(last_name(part)):
                self.hand_on(self.expr(part))
                if type(part) is cst.Name:
                    entries = f"{part.value}["
                    for name, value in self.env.items():
                        if name.startswith(entries):
                            self.confirm(value)


def _runs_backwards(iterated: cst.BaseExpression) -> bool:
    """`reversed(...)`, or `range(start, stop, -1)`: a loop from the last token to the first."""
    if not isinstance(iterated, cst.Call):
        return False
    name = dotted(iterated.func)
    if "reversed" in name:
        return True
    step = iterated.args[2].value if name == "range" and len(iterated.args) == 3 else None
    return (isinstance(step, cst.UnaryOperation) and isinstance(step.operator, cst.Minus)
            and isinstance(step.expression, cst.Integer))


def _batch_index(loop: cst.For | cst.While) -> dict[str, bool]:
    """The variable of `for i in range(n)` or `for i, item in enumerate(items)` that counts the sequences of a
    batch: neither the variable nor what the loop counts to is spelled as positions or other parts (`range(len(trajs))`,
    `range(B)`, not `range(T)`, `range(x.size(1))`, `enumerate(rewards)` or `for chunk_idx in range(num_chunks)`). It
    picks one sequence's row where it indexes a per-token tensor's first axis with the others sliced (`x[i, :L]`,
    `x[i:i + 1]`); alone (`x[i]`) only as the index of the items enumerated, since `range(n)` also counts the entries of
    a list of micro-batches (open-instruct's `ref_logprobs_BT[i]`). Maps the variable to whether it does so alone."""
    if not isinstance(loop, cst.For) or type(loop.iter) is not cst.Call or not loop.iter.args:
        return {}
    name, target = dotted(loop.iter.func), loop.target
    if name == "range" and len(loop.iter.args) == 1 and type(target) is cst.Name:
        index, alone = target.value, False
    elif name == "enumerate" and type(target) is cst.Tuple and type(first := target.elements[0].value) is cst.Name:
        index, alone = first.value, True
    else:
        return {}
    if roles.counts_positions(index) or _bound_counts_positions(loop.iter.args[0].value):
        return {}
    return {index: alone}


def _position_index(loop: cst.For | cst.While) -> frozenset[str]:
    """The variable of `for pos in range(x.size(1))` (or of a loop counting to a name spelled as positions, or of a
    variable spelled so) that counts a sequence's positions; empty for any other loop."""
    if not isinstance(loop, cst.For) or type(loop.target) is not cst.Name or type(loop.iter) is not cst.Call \
            or dotted(loop.iter.func) != "range" or not loop.iter.args:
        return frozenset()
    index = loop.target.value
    counts = roles.counts_positions(index) or any(_bound_counts_positions(arg.value) for arg in loop.iter.args[:2])
    return frozenset({index}) if counts else frozenset()


def _bound_counts_positions(bound: cst.BaseExpression) -> bool:
    """Whether a loop bound reads as a sequence's positions: a size along an axis after the first (`x.size(1)`,
    `x.shape[-1]`; `x.size(0)` counts the rows), else a name spelled so (`seq_len`, `len(rewards)`)."""
    axes = [int_literal(node.args[0].value) if node.args else None for node in walk(bound)
            if type(node) is cst.Call and last_name(node.func) == "size"]
    axes += [int_literal(element.slice.value) if isinstance(element.slice, cst.Index) else None
             for node in walk(bound) if type(node) is cst.Subscript and last_name(node.value) == "shape"
             for element in node.slice]
    if axes:
        return any(axis != 0 for axis in axes)
    called = {id(node.func) for node in walk(bound) if type(node) is cst.Call}  # `len`, `int`: not what is counted
    return any(type(node) is cst.Name and id(node) not in called and roles.counts_positions(node.value)
               or type(node) is cst.Attribute and id(node) not in called and roles.counts_positions(node.attr.value)
               for node in walk(bound))


def _chain_leaves(stmt: cst.If) -> bool:
    """Whether every branch of an if/elif chain without a final else returns or raises."""
    return _leaves(stmt.body) and (stmt.orelse is None or isinstance(stmt.orelse, cst.If) and _chain_leaves(stmt.orelse))


def _leaves(body: cst.BaseSuite) -> bool:
    """Whether a block always ends in `return` or `raise`."""
    last = body.body[-1] if body.body else None
    if type(last) is cst.SimpleStatementLine:
        last = last.body[-1] if last.body else None
    return type(last) is cst.Return or type(last) is cst.Raise


def _added_term(assign: cst.Assign) -> cst.BaseExpression:
    """The term `total = total + x` (or `x + total`) adds to the running sum."""
    value = cast("cst.BinaryOperation", assign.value)
    name = cast("cst.Name", assign.targets[0].target).value
    return value.right if type(value.left) is cst.Name and value.left.value == name else value.left


def _adds_to_itself(assign: cst.Assign) -> bool:
    """`total = total + x` (or `x + total`): the `total += x` of a running sum, spelt out."""
    value = assign.value
    return (len(assign.targets) == 1 and type(name := assign.targets[0].target) is cst.Name
            and type(value) is cst.BinaryOperation and type(value.operator) is cst.Add
            and any(type(side) is cst.Name and side.value == name.value for side in (value.left, value.right)))


def _counted_over_the_loop(value: tuple) -> tuple:
    """`total += mask.sum()` in a loop over the sequences, `mask` one sequence's row: their lengths added up, the
    batch's token count (a vector of every row's lengths, `m.sum(dim=1)` added over chunks, stays lengths)."""
    return tuple(Fact(role="ntokens", labels=f.labels) if f.role == "length" and f.row else f for f in value)


def _catches_all(case: cst.MatchCase) -> bool:
    """`case _:` or `case other:` with no guard: the values no case above takes."""
    return isinstance(case.pattern, cst.MatchAs) and case.pattern.pattern is None and case.guard is None
