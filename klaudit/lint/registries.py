"""Registries filled by decorators: `@register_policy_loss("vanilla")` stores the function it decorates
in a module-level dict (`POLICY_LOSS_REGISTRY[name] = func`), and `get_policy_loss_fn(mode)` returns
`POLICY_LOSS_REGISTRY[mode]`. verl picks its policy, advantage and distillation losses so; SkyRL its
advantage estimators (`@register_advantage_estimator("no_op")`).

The dict is empty where it is written; what it holds is known from the decorators. A registry of losses
or KL terms (its name says so) is read as the table {registered name: function}, so that a lookup with a
key the analysis does not know is a dispatch over every entry, each labelled by its name
(klaudit.lint.containers).
"""

from __future__ import annotations

import libcst as cst

from klaudit.lint import roles
from klaudit.lint.syntax import dotted, string_literals, walk


def registries(module: cst.Module) -> dict[str, list[tuple[str, cst.FunctionDef]]]:
    """{registry name: [(registered name, function), ...]} for the module-level dicts that a decorator of
    the module fills, in the order the functions are defined."""
    # only the registries of losses or KL terms: following every registered function is the costly part,
    # and an advantage estimator's or a reward manager's registry adds nothing a KL verdict reads
    empty = {name for name, value in _module_assignments(module)
             if _is_empty_dict(value) and ("loss" in name.lower() or roles.might_contain_kl(name))}
    if not empty:
        return {}
    functions = [stmt for stmt in module.body if isinstance(stmt, cst.FunctionDef)]
    fillers = {func.name.value: filled for func in functions if (filled := _filled(func, empty))}
    tables: dict[str, list[tuple[str, cst.FunctionDef]]] = {}
    for func in functions:
        for decorator in func.decorators:
            call = decorator.decorator
            name = dotted(call.func if isinstance(call, cst.Call) else call).split(".")[-1]
            for registry in fillers.get(name, ()):
                for key in (_registered_names(call) if isinstance(call, cst.Call) else []) or [func.name.value]:
                    tables.setdefault(registry, []).append((key, func))
    return tables


def _registered_names(call: cst.Call) -> list[str]:
    """The names a decorator call registers under: its first argument (`register_policy_loss("vanilla")`),
    or a `name`/`names` argument at any depth (`register(Settings(names=["k1", "kl"]))`)."""
    positional = [arg.value for arg in call.args if arg.keyword is None]
    if positional and (names := string_literals(positional[0])):
        return names
    for node in walk(call):
        if isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value in ("name", "names"):
            return string_literals(node.value) or []
    return []


def _module_assignments(module: cst.Module):
    """(name, value) of the module-level `NAME = value` and `NAME: type = value` statements."""
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
                yield small.targets[0].target.value, small.value
            elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value is not None:
                yield small.target.value, small.value


def _is_empty_dict(value: cst.BaseExpression) -> bool:
    """`{}` or `dict()`."""
    return (isinstance(value, cst.Dict) and not value.elements) or (
        isinstance(value, cst.Call) and dotted(value.func) == "dict" and not value.args)


def _filled(func: cst.FunctionDef, dicts: set[str]) -> set[str]:
    """The dicts among `dicts` that `func` (a decorator factory, with its nested functions) stores into."""
    filled = set()
    for node in walk(func):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                if isinstance(target.target, cst.Subscript) and isinstance(target.target.value, cst.Name) \
                        and target.target.value.value in dicts:
                    filled.add(target.target.value.value)
    return filled


def passes_rewards_through(module: cst.Module) -> bool:
    """Whether `module` registers an advantage estimator (`@register_advantage_estimator("no_op")`,
    `@register_adv_est(...)`) that returns the token rewards it is given as the advantages: a reward the module
    computes then reaches each token's score alone, with no sum over the later tokens (SkyRL's on-policy
    distillation example, whose launches select it)."""
    for func in module.body:
        if not isinstance(func, cst.FunctionDef) or not any(_registers_advantages(d.decorator) for d in func.decorators):
            continue
        rewards = {param.name.value for param in func.params.params if roles.sink_of_name(param.name.value) == "reward"}
        for node in walk(func.body):
            if isinstance(node, cst.Return) and node.value is not None:
                first = node.value.elements[0].value if isinstance(node.value, cst.Tuple) else node.value
                if isinstance(first, cst.Name) and first.value in rewards:
                    return True
    return False


def _registers_advantages(decorator: cst.BaseExpression) -> bool:
    name = dotted(decorator.func if isinstance(decorator, cst.Call) else decorator).split(".")[-1].lower()
    return name.startswith("register") and "adv" in name
