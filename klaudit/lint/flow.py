"""Abstract interpretation of one function: what each expression holds, and where KL terms end up.

Every expression evaluates to a tuple of `Fact`s: the alternatives it may hold (switch branches
stay apart, labelled by the literal that selects them). A tensor fact carries a symbolic
polynomial (klaudit.lint.algebra) plus how it was clamped, reduced and sliced. Statements are
walked in order; `if` branches are joined; loops run twice; calls into functions of the linted
tree are interpreted by klaudit.lint.modules.Analyzer with the caller's argument facts. The
result of a function is its returned facts and its sinks: the loss, reward and advantage
expressions that KL terms reach.

`FunctionRun` is assembled from parts over the shared state of klaudit.lint.flowstate, each in
its own module:

  statements   blocks, loops, `with`, `try`, `if`/`match` branches and their labels, returns
  assignments  what a target holds after an assignment; names that say what a value is
  conditions   which switch value an `if` test selects (`kind in (...)`, `kind.endswith("+")`, `not`)
  expressions  names, literals, attributes, subscripts, displays, comprehensions
  arithmetic   unary and binary operators on KL terms
  calls        which function a call runs, and the binding of its arguments
  library      a table of torch, numpy and framework functions and tensor methods
  reductions   sums, means, aggregations and math functions of tensors
  sinks        where KL terms reach a loss, reward or advantage; the use of each term (KL100)
  containers   string-keyed containers and records
  callables    functions held as values: closures, partials, dispatch tables, callable objects
"""

from __future__ import annotations

import libcst as cst

from klaudit.lint.arithmetic import ArithmeticFlow
from klaudit.lint.assignments import AssignmentFlow
from klaudit.lint.callables import CallableFlow, Callee, closure_of
from klaudit.lint.calls import CallFlow
from klaudit.lint.conditions import ConditionFlow
from klaudit.lint.containers import ContainerFlow
from klaudit.lint.expressions import ExpressionFlow
from klaudit.lint.facts import (
    Fact,
    Outcome,
    as_rollout_data,
    detach_all,
    param_facts,
    registry_switches,
    replace,
    within_registry,
)
from klaudit.lint.library import LibraryFlow
from klaudit.lint.recorded import only_recorded
from klaudit.lint.reductions import ReductionFlow
from klaudit.lint.sinks import SinkFlow
from klaudit.lint.statements import StatementFlow
from klaudit.lint.syntax import dotted, params, string_literals, walk


class FunctionRun(StatementFlow, AssignmentFlow, ConditionFlow, ExpressionFlow, ArithmeticFlow, CallFlow,
                  LibraryFlow, ReductionFlow, SinkFlow, ContainerFlow, CallableFlow):
    """One interpretation of one function body."""

    def run(self) -> Outcome:
        self.block(self.func.body)
        unexplained = [fact for origin, fact in self.formed.items() if origin not in self.settled]
        sinks = self.sinks + [part for node, part in self.loss_parts.items() if not only_recorded(self.func, node)]
        names = registered_names(self.func)
        returned = _without_zero_fallbacks(tuple(dict.fromkeys(self.returns)))
        if names:  # a function a registry runs under these names: its dispatch switch takes only them
            values = [returned] + [sink.facts for sink in sinks]
            keys = registry_switches(values, names)
            sinks = [replace(sink, facts=within_registry(sink.facts, names, keys)) for sink in sinks]
            return Outcome(within_registry(values[0], names, keys), sinks, unexplained)
        return Outcome(returned, sinks, unexplained)

    def define(self, func: cst.FunctionDef) -> None:
        """A function defined inside this one (a loss closure, a callback): analysed where it is
        defined, its enclosing variables holding their facts there; its sinks are this function's.
        The name holds it, so that a call of it is interpreted with the caller's arguments."""
        closure = closure_of(self.env)
        self.env[func.name.value] = (Fact(role="function", callee=Callee(self.module, func, self.cls, closure)),)
        env = dict(closure)
        if self.module.differentiates_functions:
            # MLX, JAX: the enclosing scope's arrays are constants to the loss closure that a gradient is taken of,
            # and log-probs computed there, before it, are the rollout's
            env = {name: as_rollout_data(detach_all(value)) for name, value in env.items()}
        env.update((param.name.value, param_facts(param)) for param in params(func))
        run = FunctionRun(self.analyzer, self.module, func, self.cls, env, record=self.record)
        run.no_grad = run.no_grad or self.no_grad
        run.caller_on_fresh_samples = self.on_fresh_samples()  # a closure with no step follows the function's
        run.labels = self.labels  # it exists only on the path where its definition runs
        for sink in run.run().sinks:
            self.sinks.append(replace(sink, order=len(self.sinks)))
        self.settled.update(run.settled)  # an enclosing variable the closure uses has that use


def registered_names(func: cst.FunctionDef) -> frozenset:
    """The string literals listed in a registering decorator of `func` (`@register_loss(Settings(names=["k1",
    "k3"]))`): the names a registry runs it under."""
    names: set = set()
    for decorator in func.decorators:
        if "register" not in dotted(decorator.decorator.func if isinstance(decorator.decorator, cst.Call)
                                    else decorator.decorator).lower():
            continue
        for node in walk(decorator.decorator):
            if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
                names |= set(string_literals(node) or ())
    return frozenset(names)


def _without_zero_fallbacks(returned: tuple) -> tuple:
    """The values a function returns, less an exact zero returned on the same switch values as a value that holds
    log-probs (`return torch.tensor(0.0, requires_grad=True)` when the response selects no token): the degenerate
    case of that value, with nothing to learn from, not another value. Kept apart, the zero pairs with the other
    side of a later difference (`new_lp - ref_lp` then holds a lone `new_lp` and a lone `-ref_lp`), and a sum over
    a loop joins those into a log-ratio of its own, a second finding on the same term."""
    held = {f.labels for f in returned if f.role == "tensor" and f.poly is not None and f.poly.atoms()}
    return tuple(f for f in returned if not (f.role == "tensor" and f.poly is not None and not f.poly.terms
                                             and f.labels in held))
