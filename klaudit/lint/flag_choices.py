"""A trainer class an entry script picks by a flag that every launch of the script sets the other way.

R1-V and its forks choose the trainer in the entry script, `trainer_cls = Qwen2VLGRPOTrainer if not
training_args.use_vllm else Qwen2VLGRPOVLLMTrainer`, from TRL's `use_vllm`. kokolerk/TON's launches all pass
`--use_vllm true`: the class the other value picks is built by no run of that script.

Read conservatively: the script has at least one launch among the project's shell scripts (a command naming it, by
its path or the path's tail), and each launch writes the flag with a literal (`--use_vllm true`, a bare
`--use_vllm`). A launch that leaves it out decides nothing: the README of such a fork often has its users add it
(OuyangKun10/SpaceR's vLLM trainer, reviewed as live), and so does a value held in a variable, or a default of the
flag written in the project's Python code (a configuration class of its own, `use_vllm: bool = True`).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from klaudit.frameworks.settings import PYTHON_SCRIPT, launched_scripts, only_command, truthy

FLAG = "use_vllm"
_GIVEN = re.compile(rf"--{FLAG}(?:[ \t]*=[ \t]*|[ \t]+)([^\s\\]+)|--{FLAG}(?=\s*(?:\\\s*)?$)", re.MULTILINE)
# a default a configuration class of the project gives: `use_vllm: bool = True`, `use_vllm: bool = field(default=True)`
_WRITTEN = re.compile(rf"\b{FLAG}\s*:[^=\n]*=\s*(?:field\(\s*default\s*=\s*)?(\w+)")


def picks_only_unlaunched(cls: str, script: str, text: str, launchers: Mapping[str, str],
                          code: Iterable[str]) -> bool:
    """Whether every use of class `cls` in the entry script at `script` (its Python `text`) is an alternative of a
    conditional on the flag that none of the script's launches among `launchers` (shell path -> text) selects, and it
    has one; `code`: the project's Python texts, where a default of the flag of its own leaves the flag open."""
    picked = _picked_when(cls, text)
    if picked is None or any(value != "False" for source in code if FLAG in source
                             for value in _WRITTEN.findall(source)):
        return False
    given = list(_launch_values(script, launchers))
    return bool(given) and all(value is not None and value != picked for value in given)


def _picked_when(cls: str, text: str) -> bool | None:
    """The value of the flag at which the script picks `cls` where it names it only as an alternative of
    `A if ...use_vllm else B` (or of `not ...use_vllm`), besides imports; None otherwise."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return None
    chosen: set[bool] = set()
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.IfExp) and (on := _tests_flag(node.test)) is not None:
            for branch, value in ((node.body, on), (node.orelse, not on)):
                if isinstance(branch, ast.Name) and branch.id == cls:
                    chosen.add(value)
                    inside.add(id(branch))
    named = [node for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id == cls]
    if len(chosen) != 1 or any(id(node) not in inside for node in named):
        return None
    return chosen.pop()


def _tests_flag(test: ast.expr) -> bool | None:
    """True for `args.use_vllm`, False for `not args.use_vllm`; None for any other test."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _tests_flag(test.operand)
        return None if inner is None else not inner
    return True if isinstance(test, ast.Attribute) and test.attr == FLAG else None


def _launch_values(script: str, launchers: Mapping[str, str]) -> Iterable[bool | None]:
    """The flag's value in each command of `launchers` that runs the script at `script` (the file a command runs, as
    `launched_scripts` finds it, or a tail of its path the command writes): the literal given; None where it is
    computed or left out."""
    for launcher, text in launchers.items():
        found = {offset for offset, path in launched_scripts(launcher, text) if _same_file(path, script)}
        found.update(match.start() for match in PYTHON_SCRIPT.finditer(text) if _names(match.group(1), launcher, script))
        for offset in sorted(found):
            given = list(_GIVEN.finditer(only_command(text, offset)))
            if not given:
                yield None
                continue
            word = given[-1].group(1)
            yield True if word is None or word.startswith("--") else truthy(word.strip("\"'"))


def _same_file(path: Path, script: str) -> bool:
    return os.path.normpath(path.resolve()) == os.path.normpath(os.path.abspath(script))


def _names(written: str, launcher: str, script: str) -> bool:
    """Whether a launcher's `written` path (`./src/open_r1/grpo.py`) names the script: relative to the launcher's
    folder, or a tail of the script's path of two parts at least (the file and its folder)."""
    written = os.path.normpath(written)
    if os.path.normpath(os.path.join(os.path.dirname(launcher), written)) == os.path.normpath(script):
        return True
    parts = written.split(os.sep)
    return len(parts) >= 2 and os.path.normpath(script).endswith(os.sep + os.sep.join(parts[-2:]))
