"""Assignments: what a target holds after `x = value`, `x += value`, `a, b = pair`, `x.f = value`.

A target named like a loss, reward or advantage is a sink (klaudit.lint.sinks); a value the analysis
could not explain takes the meaning its target's name gives (`ref_log_probs = ...`); a value stored
into an attribute or key of an object that leaves the function is used where the analysis cannot
follow it. In a reversed loop, `running = r[:, t] + gamma * running` is a reward-to-go.
"""

from __future__ import annotations

from typing import cast

import libcst as cst

from klaudit.catalog import Position
from klaudit.lint import algebra as alg
from klaudit.lint import roles
from klaudit.lint.algebra import Atom, Poly
from klaudit.lint.containers import as_row
from klaudit.lint.facts import Fact, compatible, detach_all, merge_labels, rename_logprobs, replace, tensor
from klaudit.lint.flowstate import FlowState
from klaudit.lint.syntax import (
    fills_padding,
    is_a_call,
    is_converted_data_read,
    is_data_read,
    is_empty_container,
    is_literal_array,
    is_packed_row,
    is_tensor_factory,
    is_test,
    is_zero_tensor,
    last_name,
    mentions,
    string_key,
    walk,
)
from klaudit.lint.tensors import log_sum_exp

# Values whose meaning the analysis knows, which a target's name does not override (`seq_mask =
# mask.sum(-1)` holds each sequence's length, whatever its name says).
EXPLAINED_ROLES = ("tensor", "mask", "function", "length", "ntokens", "lse", "lse-vocab")


def _explained(fact: Fact) -> bool:
    """Whether the analysis knows what a value is, so that the name it is stored under cannot say otherwise: one of
    EXPLAINED_ROLES, or a list of tensors it computed (a helper's per-sequence log-probs of the reference model,
    `old_logprobs_list, _ = get_token_logprobs(self.reference, ...)`)."""
    return fact.role in EXPLAINED_ROLES or fact.role == "tuple" and any(
        item.role == "tensor" and item.poly is not None and bool(item.poly.atoms()) for part in fact.items for item in part)


class AssignmentFlow(FlowState):
    """Assignments to names, tuples, attributes and keys, for klaudit.lint.flow.FunctionRun."""

    def loop_carried(self, small: cst.Assign | cst.AugAssign) -> tuple:
        """`running = r[:, t] + gamma * running` or `running += r[:, t]` in a reversed loop: the
        reward-to-go of this step's terms. The running sum may be carried in a second name the body
        sets from the first (`a_t = delta[:, t] + gamma * lam * a_next` ... `a_next = a_t`), or in a chained
        assignment that also stores it (`adv[t] = last = delta + gamma * lam * last`); a product
        (`running = running * mask[:, t]`) is no step of the recursion."""
        if not self.reverse_loop:
            return ()
        names = [target.target.value for target in small.targets if type(target.target) is cst.Name] \
            if type(small) is cst.Assign else []
        if names:  # `advantages[t] = last_gae = delta + gamma * lam * last_gae`: the name is the running sum
            name = next((name for name in names if _sums_with(small.value, name)), names[0])
            if not _sums_with(small.value, name):
                name = next((carrier for loop in self.reverse_loop.values() for carrier in _set_from(loop.body, name)
                             if _sums_with(small.value, carrier)), "")
                if not name:
                    return ()
        elif (type(small) is cst.AugAssign and type(small.target) is cst.Name
              and type(small.operator) in (cst.AddAssign, cst.SubtractAssign)):
            name = small.target.value
        else:
            return ()
        saved = self.env.get(name)
        self.env[name] = ()
        if isinstance(small, cst.AugAssign):  # running += r[t]: this step's terms added to the running sum
            value = self.binary((), self.expr(small.value), small.operator, small)
        else:
            value = self.expr(small.value)
        if saved is not None:
            self.env[name] = saved
        self.confirm(value)  # rewards summed into returns (a GAE or reward-to-go recursion) are rewards
        return tuple(replace(f, poly=alg.accumulate(f.poly, alg.TO_GO)) if f.poly is not None else f for f in value)

    def assign_target(self, target: cst.CSTNode, value: tuple, node=None, rhs=None, augmented=False) -> None:
        # type() comparisons, as in klaudit.lint.syntax: a failed isinstance on a LibCST class is costly
        if type(target) is cst.Tuple or type(target) is cst.List:
            parts = [f for f in value if f.role == "tuple"]
            for index, element in enumerate(target.elements):
                sub: tuple = ()
                for part in parts:
                    if index < len(part.items):
                        sub += part.items[index]
                parallel = type(rhs) in (cst.Tuple, cst.List) and len(rhs.elements) == len(target.elements)
                self.assign_target(element.value, sub, node, rhs=rhs.elements[index].value if parallel else rhs)
            return
        if type(target) is cst.Subscript and rhs is not None and not augmented and fills_padding(target, rhs):
            return  # `ratio[~mask] = 1`: a masked_fill, written as an assignment
        name = last_name(target)
        if rhs is not None and name and not any(_explained(f) for f in value) \
                and not is_literal_array(rhs) and not is_empty_container(rhs):
            value = self.from_name(name, rhs) or value  # the analysis could not explain it: the name can
        if rhs is not None and name and roles.names_kl(name) and not any(f.is_kl() for f in value):
            value = self.log_ratio_against_unknown(rhs) or value
        if self.no_grad and not augmented:  # an in-place update keeps the gradient its target had (statements.added)
            value = detach_all(value)
        if type(target) is cst.Name and self.one_sequence_at_a_time():
            value = tuple(as_row(f) for f in value)  # a tensor of the one sequence being run: its row, wherever it goes
        if self.labels:
            value = tuple(replace(f, labels=merge_labels(f.labels, self.labels)) for f in value
                          if compatible(f.labels, self.labels))
        if type(target) is cst.Name and rhs is not None:
            value = rename_logprobs(value, name, is_converted_data_read(rhs), called=is_a_call(rhs))
            if is_packed_row(rhs):
                value = tuple(replace(f, packed=True) if f.role == "tensor" else f for f in value)
        if name and roles.names_pair_logprobs(name):  # a preference pair's log-probs: no KL is made of them
            value = tuple(f for f in value if f.role != "tensor" or f.poly is None or not f.poly.atoms())
        kind = roles.sink_of_name(name) if name else None
        if kind == "loss" and type(target) is cst.Name and name in self.python_numbers():
            kind = None  # `total_loss += loss.item()`: a number kept for the log is no loss, whatever it is named
        if kind is None and type(target) is cst.Subscript and roles.sink_of_name(last_name(target.value)) == "reward":
            kind = "reward"  # `rewards["total"] = rewards["total"] - beta * kl`: an entry of a dict of rewards
        if kind == "reward" and node is not None:
            value = self.reward_candidate(value, node)
        elif kind == "loss" and node is not None:
            value = self.loss_candidate(value, node)
        elif kind is not None and node is not None:
            value = self.sink(kind, value, node)
        if type(target) is cst.Attribute or type(target) is cst.Subscript:
            self.stored_outside(target, value)
        self.track(value)
        key = string_key(target) if type(target) is cst.Subscript else None
        if type(target) is cst.Name:
            self.env[name] = value
        elif type(target) is cst.Subscript and key is not None:
            self.store_key(target, key, value)
        elif type(target) is cst.Subscript and (buffer := _buffer_written(target)) is not None:
            base = buffer
            held = self.env.get(base, ())
            if any(f.poly is not None and f.poly.has_grad() for f in value):  # a buffer now holds a differentiable value
                held = tuple(f for f in held if f.poly is None or not f.poly.atoms() or f.poly.has_grad())
            # one sequence's row written at its place (`out[i, :n] = x[i, s:e]`): the buffer holds every sequence's
            value = tuple(replace(f, row=False) if f.row else f for f in value)
            if any(f.position is Position.LAST for f in value) and _indexed_by(target, self.position_indices):
                # `token_logp[:, pos] = logits[:, -1]...` in a loop over the positions: each position written in
                # turn, the last of each context being that position
                value = tuple(replace(f, position=Position.ALL) if f.position is Position.LAST else f for f in value)
            if rhs is not None and _reads_its_own_place(target, rhs):
                # `rewards[:, -1] = rewards[:, -1] + score`: a score added where the KL already is, as `+=` adds it;
                # the KL at every position stays what the buffer holds, not the one place read back (a new term
                # added there is kept)
                kept = {f.poly for f in held}
                value = tuple(f for f in value if not (f.is_kl() and f.poly in kept))
            self.env[base] = tuple(dict.fromkeys(held + value))
        elif type(target) is cst.Attribute and type(target.value) is cst.Name and target.value.value == "self":
            self.env["self." + name] = value
        elif type(target) is cst.Attribute and type(target.value) is cst.Name:
            self.env[f"{target.value.value}.{name}"] = value
            self.collect(name, value)

    def in_a_test(self) -> bool:
        """Whether the function analysed is a test (`def test_...`), whose inputs are numbers chosen to stand for what
        their names say."""
        return is_test(self.func)

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
        if roles.tensor_role(name) is not None:  # where the rhs was read from matters only then
            if roles.names_reference_outputs(name) and is_zero_tensor(rhs) and not self.in_a_test():
                # zeros for the reference's log-probs: log 1 of a one-hot label (an SFT loss spelt as a KL to it), or a
                # buffer that a fill names again; in a test they stand for the reference (NeMo RL's loss tests)
                return (tensor(Poly.const(0.0)),)
            grad = not self.no_grad and not is_data_read(rhs) and not is_tensor_factory(rhs)
            poly = roles.named_tensor(name, grad=grad)
            if poly is not None:
                return (tensor(poly),)
        if roles.is_mask_name(name):
            return (Fact(role="mask"),)
        if roles.names_lengths(name) and is_data_read(rhs):  # read from the batch: each sequence's length
            return (Fact(role="length"),)
        if roles.names_log_sum_exp(name) and type(rhs) is cst.Call:
            # a helper out of sight given the logits (RL2's tensor-parallel `compute_logsumexp(logits, mesh)`)
            return log_sum_exp(tuple(f for arg in rhs.args for f in self.expr(arg.value)), keepdim=False)
        return ()

    def stored_outside(self, target: cst.Attribute | cst.Subscript, value: tuple) -> None:
        """`data.batch["token_level_rewards"] = r`, `experience.rewards = r`: the value leaves the function,
        to be used where the analysis cannot follow, unless the container only records metrics or is
        a dict local to this function."""
        holder = target.value
        if records_metrics(holder):
            self.settle(value)  # a logged statistic
            return
        if isinstance(holder, cst.Name) and any(f.role == "dict" for f in self.env.get(holder.value, ())):
            return
        self.confirm(value)


def _indexed_by(target: cst.Subscript, indices: list[frozenset[str]]) -> bool:
    """Whether a subscript store's index names one of the loop variables `indices` (`out[active, pos]`)."""
    names = frozenset().union(*indices)
    return any(isinstance(element.slice, cst.Index) and type(element.slice.value) is cst.Name
               and element.slice.value.value in names for element in target.slice)


def _reads_its_own_place(target: cst.Subscript, rhs: cst.CSTNode) -> bool:
    """Whether `rhs` reads the very place the subscript store writes (`x[i, j] = x[i, j] + y`)."""
    return any(type(node) is cst.Subscript and node.deep_equals(target) for node in walk(rhs))


def _buffer_written(target: cst.Subscript) -> str | None:
    """The name of the array a subscript store writes into: `out[i, :n] = ...`, and `adv[i][:-1] = ...` (a row's
    slice, NumPy's spelling of the same place)."""
    node: cst.BaseExpression = target
    while type(node) is cst.Subscript:
        node = node.value
    return node.value if type(node) is cst.Name else None


_CHAIN_LINKS = (cst.Attribute, cst.Subscript, cst.Call)  # the nodes an access chain goes through


def records_metrics(node: cst.CSTNode) -> bool:
    """Whether some part of an access chain names a metrics holder (`self.stats[k]`, `metrics["r"]`,
    `self.log`): what goes there, or is made to go there, is a statistic."""
    return any(roles.is_metrics_name(last_name(part)) for part in access_chain(node))


def access_chain(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The parts of an attribute / subscript / call chain, outermost first: `self.stats[k]` -> [stats[k], stats, self]."""
    out: list[cst.CSTNode] = []
    while type(node) in _CHAIN_LINKS:  # type(): see klaudit.lint.syntax
        out.append(node)
        node = node.func if type(node) is cst.Call else cast("cst.Attribute | cst.Subscript", node).value
    out.append(node)
    return out


def _sums_with(value: cst.BaseExpression, name: str) -> bool:
    """Whether `name` is a term of a sum in `value` (`r + gamma * running`, `(r + gamma * running) * m`): a step of
    a running sum, where `running * mask` is none."""
    return any(type(node) is cst.BinaryOperation and type(node.operator) in (cst.Add, cst.Subtract)
               and mentions(node, name) for node in walk(value))


def _set_from(body: cst.BaseSuite, name: str) -> list[str]:
    """The names a loop body sets to `name` alone (`a_next = a_t`): the carriers of its value to the next iteration."""
    return [assign.targets[0].target.value for line in body.body if type(line) is cst.SimpleStatementLine
            for assign in line.body if type(assign) is cst.Assign and len(assign.targets) == 1
            and type(assign.targets[0].target) is cst.Name and type(assign.value) is cst.Name
            and assign.value.value == name]
