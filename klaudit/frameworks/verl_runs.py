"""Whether a project's runs of verl ever put the KL in the reward: the values its launches give `use_kl_in_reward`.

verl's trainer subtracts the KL penalty from the token-level rewards (`apply_kl_penalty`) only under `if
self.config.algorithm.use_kl_in_reward:`, whose default is false. A project that launches verl, and whose every
launch, YAML file and configuration assignment leaves that flag false, never runs a function it calls only under
that test (its own edited copy of the trainer's `apply_kl_penalty` included), so the verdicts on the KL reward
computed there say nothing about the project's runs.

Read conservatively: a launch whose value is computed (`algorithm.use_kl_in_reward=$USE_KL`, unresolved), a YAML
key or assignment that is not plainly false, or a project with no launch of verl at all (a library, or a fork used
by others) keeps every verdict. A function counts as gated when each call of it the project's Python code makes,
by its name (`apply_kl_penalty(...)`, `self.apply_kl_penalty(...)`), lies in the body of an `if` whose test reads
the flag, and it is called at least once.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping

from klaudit.frameworks.trl_runs import written_values

FLAG = "use_kl_in_reward"
_OFF = frozenset({"false", "False", "0", "no", "off"})
# Python that sets it: `cfg.algorithm.use_kl_in_reward = False`, `use_kl_in_reward: bool = False`, a keyword argument
_ASSIGNED = re.compile(rf"(?<!\w){FLAG}[ \t]*(?::[ \t]*\w+[ \t]*)?=(?!=)[ \t]*(?P<value>[^\s#,;)]*)")


def reward_always_off(launched: Iterable[str | None], configs: Iterable[str], code: Iterable[str]) -> bool:
    """Whether every run leaves the KL reward off: at least one launch of verl, each giving the flag a literal false
    (`launched`: each launch's value, "false" where it leaves verl's default; None where computed), and every YAML
    text (`configs`) and Python text (`code`) of the project that sets it setting it to a literal false."""
    values = list(launched)
    if not values or any(value is None or value not in _OFF for value in values):
        return False
    written = [value for text in configs if FLAG in text for value in written_values(text, FLAG, yaml=True)]
    written += [match.group("value").strip("\"'") for text in code if FLAG in text for match in _ASSIGNED.finditer(text)
                if "#" not in text[text.rfind("\n", 0, match.start()) + 1:match.start()]]  # not in a comment
    return all(value is not None and value in _OFF for value in written)


def gated_functions(sources: Mapping[str, str]) -> frozenset[str]:
    """The names of the functions every call of which, in `sources` (path -> Python text), lies in the body of an
    `if` whose test reads `use_kl_in_reward`; each is called at least once."""
    gated: set[str] = set()
    for text in sources.values():
        if FLAG in text:
            gated |= {name for call, under in _calls(text) if under for name in [_called_name(call)] if name}
    if not gated:
        return frozenset()
    for text in sources.values():
        if any(f"{name}(" in text for name in gated):
            gated -= {_called_name(call) for call, under in _calls(text) if not under}
    return frozenset(gated)


def _calls(text: str) -> list[tuple[ast.Call, bool]]:
    """Each call of a module's code, with whether it lies in the body (not the `else`) of an `if` that needs the flag on."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return []
    found: list[tuple[ast.Call, bool]] = []
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, under = stack.pop()
        if isinstance(node, ast.Call):
            found.append((node, under))
        if isinstance(node, ast.If):
            stack += [(node.test, under)] + [(child, under or _requires_flag(node.test)) for child in node.body] + [
                (child, under) for child in node.orelse]
            continue
        stack += [(child, under) for child in ast.iter_child_nodes(node)]
    return found


def _requires_flag(test: ast.expr) -> bool:
    """Whether a test is true only with the flag on: the flag itself (`config.algorithm.use_kl_in_reward`), or an
    `and` of which it is a part."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_requires_flag(part) for part in test.values)
    return isinstance(test, ast.Attribute) and test.attr == FLAG or isinstance(test, ast.Name) and test.id == FLAG


def _called_name(call: ast.Call) -> str | None:
    return call.func.id if isinstance(call.func, ast.Name) else call.func.attr if isinstance(
        call.func, ast.Attribute) else None


def function_spans(source: str, names: frozenset[str]) -> list[tuple[int, int]]:
    """(first line, last line) of each function or method of `source` named in `names`."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return []
    return [(node.lineno, node.end_lineno or node.lineno) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names]
