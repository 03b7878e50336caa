"""Update loops: a loop that takes several optimizer steps on samples drawn before it.

`for inner in range(K): loss = pg + beta * kl; loss.backward(); optimizer.step()`, with the completions and
the reference's log-probs computed once before the loop, trains every step after the first on samples of an
older policy (kl-math.md section 8, rows 22 and 23), whether or not the code forms a ratio to them. Read
from the loop's text alone, and only where nothing in the loop could draw new samples: it generates nothing
(no call named like a generation or a rollout), takes no `next(...)` batch of an iterator, and computes no
reference log-probs (which are recomputed for each new batch of samples).
"""

from __future__ import annotations

import libcst as cst

from klaudit.lint import algebra as alg
from klaudit.lint import roles
from klaudit.lint.syntax import child_nodes, dotted, int_literal, last_name, params


def reuses_samples(loop: cst.For | cst.While, module: cst.Module) -> bool:
    """Whether `loop` is `for ... in range(n)` (n not 1) whose body takes an optimizer step, draws no samples and
    computes no reference log-probs: each step after the first trains on the samples of an older policy. A count
    read from a setting (`range(args.num_ppo_epochs)`) that the classes of `module` default to 1 is one round."""
    if not isinstance(loop, cst.For) or not _several_rounds(loop.iter, module):
        return False
    steps = False
    for node in _body_nodes(loop.body):
        if type(node) is cst.Call:
            name = last_name(node.func) or ""
            if name == "step" and type(node.func) is cst.Attribute and roles.names_optimizer(last_name(node.func.value)):
                steps = True
            elif roles.draws_samples(name) or name == "next" and type(node.func) is cst.Name:
                return False  # a generation or a rollout, or the next batch of a data iterator
        elif type(node) is cst.Name and roles.names_reference_model(node.value):
            return False  # the reference model run anew: on samples drawn here
        elif type(node) in (cst.Assign, cst.AnnAssign, cst.AugAssign) and any(
                roles.tensor_role(name) in (alg.REF, alg.REF_LOGITS) for name in _targets(node)):
            return False  # the reference's log-probs computed here: for samples drawn here
    return steps


def _targets(node: cst.Assign | cst.AnnAssign | cst.AugAssign) -> list[str]:
    """The names an assignment binds (`a, b = ...`: both)."""
    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
    names = []
    for target in targets:
        parts = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]
        names += [name for part in parts if (name := last_name(part))]
    return names


def _several_rounds(iterated: cst.BaseExpression, module: cst.Module) -> bool:
    """`range(k)` with k not the literal 1, nor a setting the module's classes all default to 1. A mini-batch loop,
    `range(start, stop, step)`, is left out: how many batches it makes is the batch sizes' (often one)."""
    if type(iterated) is not cst.Call or dotted(iterated.func) != "range" or len(iterated.args) != 1:
        return False
    count = iterated.args[0].value
    literal = int_literal(count)
    if literal is None and type(count) is cst.Attribute:
        literal = _field_default(module, count.attr.value)
    return literal not in (0, 1)


def _field_default(module: cst.Module, name: str) -> int | None:
    """The integer the classes of `module` default the setting `name` to, as a field (`num_ppo_epochs: int = 1`,
    `= field(default=1, ...)`) or as a parameter of their methods (`def __init__(self, ppo_steps: int = 1)`), where
    every such default agrees; None when none is written or they differ."""
    found = set()
    for stmt in module.body:
        if not isinstance(stmt, cst.ClassDef):
            continue
        for line in stmt.body.body:
            small = line.body[0] if isinstance(line, cst.SimpleStatementLine) and line.body else None
            if isinstance(small, cst.AnnAssign) and type(small.target) is cst.Name and small.target.value == name:
                found.add(_default_of(small.value))
            elif isinstance(line, cst.FunctionDef):
                found.update(_default_of(param.default) for param in params(line)
                             if param.name.value == name and param.default is not None)
    return found.pop() if len(found) == 1 else None


def _default_of(value: cst.BaseExpression | None) -> int | None:
    if type(value) is cst.Call and last_name(value.func) == "field":
        value = next((arg.value for arg in value.args if arg.keyword is not None and arg.keyword.value == "default"), None)
    return int_literal(value) if value is not None else None


def _body_nodes(body: cst.BaseSuite):
    """Every node of a loop body, except those of the functions, classes and lambdas it defines."""
    stack: list[cst.CSTNode] = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        yield node
        stack.extend(child_nodes(node))
