"""Update loops: a loop that takes several optimizer steps on samples drawn before it.

`for inner in range(K): loss = pg + beta * kl; loss.backward(); optimizer.step()`, with the completions and
the reference's log-probs computed once before the loop, trains every step after the first on samples of an
older policy (kl-math.md section 8, rows 22 and 23), whether or not the code forms a ratio to them. Read
from the loop's text alone, and only where nothing in the loop could draw new samples: it generates nothing
(no call named like a generation or a rollout), takes no `next(...)` batch of an iterator, and computes no
reference log-probs (which are recomputed for each new batch of samples).
"""

from __future__ import annotations

import re

import libcst as cst

from klaudit.lint import algebra as alg
from klaudit.lint import roles
from klaudit.lint.syntax import child_nodes, dotted, int_literal, last_name

# a call that may draw new samples: model.generate, llm.generate, collect_rollouts, make_experience ...
_DRAWS_SAMPLES = re.compile(r"generat|rollout|collect|experience|^sample_|_sample$|^sample$|play|episode|env_step",
                            re.IGNORECASE)
_OPTIMIZER = re.compile(r"(^|_)(optim|optimizer|optimiser|opt)(_|$|\d)|optimizer$", re.IGNORECASE)


def reuses_samples(loop: cst.For | cst.While) -> bool:
    """Whether `loop` is `for ... in range(n)` (n not 1) whose body takes an optimizer step, draws no samples and
    computes no reference log-probs: each step after the first trains on the samples of an older policy."""
    if not isinstance(loop, cst.For) or not _several_rounds(loop.iter):
        return False
    steps = False
    for node in _body_nodes(loop.body):
        if type(node) is cst.Call:
            name = last_name(node.func) or ""
            if name == "step" and type(node.func) is cst.Attribute and _OPTIMIZER.search(last_name(node.func.value) or ""):
                steps = True
            elif _DRAWS_SAMPLES.search(name) or name == "next" and type(node.func) is cst.Name:
                return False  # a generation or a rollout, or the next batch of a data iterator
        elif type(node) is cst.Name and _reference_model(node.value):
            return False  # the reference model run anew: on samples drawn here
        elif type(node) in (cst.Assign, cst.AnnAssign, cst.AugAssign) and any(
                roles.tensor_role(name) in (alg.REF, alg.REF_LOGITS) for name in _targets(node)):
            return False  # the reference's log-probs computed here: for samples drawn here
    return steps


def _reference_model(name: str) -> bool:
    """`ref_model`, `reference_policy`, `teacher`: a reference model, not its log-probs (`ref_logprobs`)."""
    return roles.is_reference_model(name) and roles.tensor_role(name) is None


def _targets(node: cst.Assign | cst.AnnAssign | cst.AugAssign) -> list[str]:
    """The names an assignment binds (`a, b = ...`: both)."""
    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
    names = []
    for target in targets:
        parts = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]
        names += [name for part in parts if (name := last_name(part))]
    return names


def _several_rounds(iterated: cst.BaseExpression) -> bool:
    """`range(k)`, `range(a, b)`: a count of rounds that is not the literal 1."""
    if type(iterated) is not cst.Call or dotted(iterated.func) != "range" or not 1 <= len(iterated.args) <= 3:
        return False
    if len(iterated.args) == 1:
        return int_literal(iterated.args[0].value) not in (0, 1)
    return True


def _body_nodes(body: cst.BaseSuite):
    """Every node of a loop body, except those of the functions, classes and lambdas it defines."""
    stack: list[cst.CSTNode] = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        yield node
        stack.extend(child_nodes(node))
