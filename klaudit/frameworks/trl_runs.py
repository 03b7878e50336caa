"""Whether a project's TRL GRPO trainer ever takes its KL branch: the beta values its configurations give.

TRL's GRPOTrainer, and a project's edited copy or subclass of it, adds its KL term only under
`if self.beta != 0.0`, with `self.beta = args.beta` read from the GRPOConfig it is handed; at beta = 0 the
reference model is not even loaded. Where every configuration the project builds or launches leaves beta at 0
(TRL's default from 0.19 on, or a copy's own default), that branch of the trainer's methods never trains, and a
verdict that holds only under it says nothing about the project's runs.

The values are read, conservatively, from everything that may set beta: each `GRPOConfig(...)` call (or a call of
a class deriving from it) outside the trainer modules themselves (TRL's own `GRPOConfig(f"{model_name}-GRPO")`
fallback is no run of the project), with its class's default where it leaves beta out and an unknown value after
`**kwargs`; a script that parses GRPOConfig from its command line (its default, and the values below); every
`--beta` option and YAML `beta:` in the project's launch scripts, configurations and Python text (a DPO launch's
beta counts too: it can only keep a verdict); and `config.beta = ...` written to an object named as a
configuration. A value that is not a number keeps every verdict. Only the methods of the trainer classes are judged
so (a helper's own `beta` parameter, a generalized JSD's interpolation, is another quantity), and only beta: which
`loss_type` a library trainer's user picks is that user's choice.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from klaudit.frameworks.trl import BETA

if TYPE_CHECKING:
    from klaudit.lint.facts import Labels

Betas = tuple["str | None", ...]  # every beta the project's configurations give: a number's text, None where computed

# `--beta 0.04`, `--beta=0.04`, `"--beta", "0.04"` (an argv list), `--beta $BETA` (computed: unknown)
_OPTION = re.compile(r"--beta(?![\w-])(?:[ \t]*=[ \t]*|[ \t]+|[\"'][ \t]*,[ \t]*)([^\s,)\]\\]*)")
_YAML_KEY = re.compile(r"^[ \t]*(?:[\w.]+\.)?beta[ \t]*:[ \t]*([^\s#]*)", re.MULTILINE)
# `training_args.beta = 0.1`, `cfg.grpo.beta = 0.1`: written to an object named as a configuration (not the trainer's
# own `self.beta = args.beta`, nor `ctx.beta` of an autograd function)
_ATTRIBUTE = re.compile(r"(?<![\w.])(?:self\.)?\w*(?:arg|conf|cfg|param|setting)\w*(?:\.\w+)*\.beta[ \t]*=(?!=)"
                        r"[ \t]*([^\n#;]*)", re.IGNORECASE)


def written_betas(text: str, *, yaml: bool = False) -> Iterator[str | None]:
    """The betas `text` writes as an option, a YAML key (`yaml`: the text is a YAML file) or an attribute of a
    configuration object: the literal, or None where it is computed. An option or key with nothing after it
    (`"--beta",` of an argparse definition) writes none."""
    for match in _OPTION.finditer(text):
        if match.group(1):
            yield _literal(match.group(1), bare=True)
    for match in _ATTRIBUTE.finditer(text):
        yield _literal(match.group(1).strip(), bare=False)
    for match in _YAML_KEY.finditer(text) if yaml else ():
        if match.group(1):
            yield _literal(match.group(1), bare=True)


def _literal(written: str, bare: bool) -> str | None:
    """A quoted string's text, a number, or (`bare`: a shell word or YAML scalar) a word; None for anything else,
    which is computed (`args.beta`, `$BETA`, `${oc.env:BETA}`, a Python name) or not understood."""
    if len(written) >= 2 and written[0] == written[-1] and written[0] in "\"'":
        return written[1:-1]
    return written if _number(written) or bare and re.fullmatch(r"[A-Za-z_][\w.-]*", written) else None


# a label of beta tested against a number: `beta == 0` (its values (True,) or (False,)), `beta > 0`
_TEST = re.compile(r"^beta (==|>=|<=|>|<) (-?[\d.]+(?:e-?\d+)?)$")
_COMPARE = {"==": lambda a, b: a == b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
            "<": lambda a, b: a < b, "<=": lambda a, b: a <= b}


def holds(labels: Labels, betas: Betas) -> bool:
    """Whether a path taken under switch `labels` can run at one of the project's `betas`: beta's tests of a number
    are true at one of them. An unknown beta, or a label that is no such test, holds."""
    tests = [(match, values) for name, values in labels if (match := _TEST.match(name)) is not None and _truths(values)]
    flags = [values for name, values in labels if name == BETA and _truths(values)]  # `if self.beta:`
    if not tests and not flags or None in betas:
        return True
    numbers = [float(beta) for beta in betas if beta is not None and _number(beta)]
    if len(numbers) < len(betas):
        return True  # a word where a number belongs: not understood
    return any(all(_COMPARE[match.group(1)](value, float(match.group(2))) in values for match, values in tests)
               and all((value != 0) in values for values in flags) for value in numbers)


def _truths(values: tuple) -> bool:
    return all(isinstance(value, bool) for value in values)


def _number(text: str | None) -> bool:
    return text is not None and re.fullmatch(r"-?[\d.]+(?:e-?\d+)?", text) is not None


# `self.beta = args.beta` in a trainer's `__init__`: an edited copy of TRL's GRPOTrainer
_FROM_CONFIG = re.compile(r"\bself\.beta[ \t]*=[ \t]*(?:self\.)?args\.beta\b")


def trainer_methods(path: str, source: str, subclasses: Collection[str]) -> list[tuple[int, int]]:
    """(first line, last line) of each method of the GRPO trainers the module at `path` defines that reads beta from
    TRL's GRPOConfig: a class deriving from TRL's GRPOTrainer (`subclasses`), or a class named for GRPO whose own code
    sets `self.beta = args.beta` (an edited copy; TRL's DPOTrainer reads its preference temperature the same way). A
    method with a `beta` parameter of its own is left out, and so are TRL's own modules, which every user configures."""
    if "trl" in Path(path).parts[:-1] or "beta" not in source:
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return []
    spans = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        text = ast.get_source_segment(source, node) or ""
        if node.name not in subclasses and not ("GRPO" in node.name and _FROM_CONFIG.search(text)):
            continue
        spans += [(item.lineno, item.end_lineno or item.lineno) for item in node.body
                  if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and BETA not in {arg.arg for arg in (*item.args.posonlyargs, *item.args.args, *item.args.kwonlyargs)}]
    return spans
