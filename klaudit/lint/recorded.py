"""Whether a loss-named value is only ever logged.

`k1_losses = logp - teacher_logp` followed only by `metrics = {"k1": Metric(MEAN, k1_losses.mean())}`
(a verl fork's distillation loss, tenth fresh set) names a loss but never reaches one: its every
later read records a statistic. Such a value is no loss term of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from klaudit.lint import roles
from klaudit.lint.assignments import records_metrics
from klaudit.lint.syntax import child_nodes, last_name

# A method that ends the value's gradient: what follows is a number or a detached copy for the logs.
_DETACHING = frozenset(("item", "detach", "cpu", "tolist", "numpy"))


def only_recorded(func: cst.FunctionDef, assignment: cst.CSTNode) -> bool:
    """Whether the name bound by `assignment` (a statement of `func`) is read afterwards, and every read
    records a statistic: inside a metrics call or container, or detached (`.item()`, `.detach()`)."""
    if not isinstance(assignment, (cst.Assign, cst.AnnAssign)):
        return False
    targets = [t.target for t in assignment.targets] if isinstance(assignment, cst.Assign) else [assignment.target]
    if len(targets) != 1 or type(targets[0]) is not cst.Name:
        return False
    name = targets[0].value
    reads = list(_reads_after(func, assignment, name))
    return bool(reads) and all(reads)


def _reads_after(func: cst.FunctionDef, assignment: cst.CSTNode, name: str) -> Iterator[bool]:
    """For each read of `name` after `assignment` (until it is bound again): whether it only records."""
    seen = False
    stack: list[cst.CSTNode] = []

    def visit(node: cst.CSTNode) -> Iterator[bool]:
        nonlocal seen
        if node is assignment:
            seen = True
            return
        if type(node) is cst.Del:
            return  # `del loss, ratio`: freed, not read
        if seen and type(node) is cst.Name and node.value == name and not _is_store(stack, node):
            yield _records(stack, node)
            return
        stack.append(node)
        for child in child_nodes(node):  # the fields keep the code's order of statements
            yield from visit(child)
        stack.pop()
        if seen and _binds(node, name):
            raise _Rebound

    try:
        yield from visit(func.body)
    except _Rebound:
        return


class _Rebound(Exception):
    """The name is bound again: later reads are of another value."""


def _binds(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, (cst.Assign, cst.AnnAssign)) and any(
        type(t) is cst.Name and t.value == name
        for t in ([t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]))


def _is_store(stack: list[cst.CSTNode], node: cst.Name) -> bool:
    """`name = ...`: the name as an assignment target, not a read."""
    parent = stack[-1] if stack else None
    return isinstance(parent, cst.AssignTarget) and parent.target is node or (
        isinstance(parent, cst.AnnAssign) and parent.target is node)


def _records(stack: list[cst.CSTNode], node: cst.CSTNode) -> bool:
    """Whether the read `node`, under the ancestors `stack` (outermost first), only records a statistic:
    detached (`.item()`), or inside a metrics call whose result is only kept as a statistic too (stored
    in a metrics container, or a statement of its own such as `wandb.log(...)`). A metrics-named wrapper
    handed on as a loss (`LossOutput(primary_loss=WeightedMetric(loss, n))`) records nothing."""
    child = node
    logged = False  # passed through a call that records statistics
    for parent in reversed(stack):
        if isinstance(parent, cst.Attribute) and parent.value is child and parent.attr.value in _DETACHING:
            return True
        if isinstance(parent, cst.Call) and parent.func is not child and roles.is_metrics_name(last_name(parent.func)):
            logged = True
        if isinstance(parent, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in parent.targets] if isinstance(parent, cst.Assign) else [parent.target]
            return all(records_metrics(t) for t in targets)
        if isinstance(parent, cst.Expr):
            return logged  # `wandb.log({"kl": kl_loss})`, `print(kl_loss)`: a statement of its own
        if isinstance(parent, (cst.Return, cst.BaseCompoundStatement)):
            return False  # returned, or used by a statement (`kl_loss.backward()`, `if kl_loss > x:`)
        child = parent
    return False
