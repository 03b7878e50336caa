"""Which of a TRL GRPO trainer's switch branches a project runs: the values its configurations give.

TRL's GRPOTrainer, and a project's edited copy or subclass of it, reads its switches from the GRPOConfig it is
handed: the KL term is added only under `if self.beta != 0.0` (at beta = 0 the reference model is not even
loaded), and `self.loss_type` picks how the per-token loss is reduced. Where every configuration the project
builds or launches leaves beta at 0 (TRL's default from 0.19 on, or a copy's own default), or sets loss_type
to "dapo", the `beta != 0` or `loss_type == "grpo"` branch never trains, and a verdict that holds only under
it says nothing about the project's runs.

The values are read, conservatively, from everything that may set a key: each `GRPOConfig(...)` call (or a
call of a class deriving from it), with its class's default where it leaves the key out and an unknown value
after `**kwargs`; a script that parses GRPOConfig from its command line (its default, and the values below);
every `--key` option and YAML `key:` in the project's launch scripts, configurations and Python text (a DPO
launch's `--beta` counts too: it can only keep a verdict); and `config.key = ...` written to an object named
as a configuration. A value that is not a literal keeps every verdict.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from klaudit.frameworks.trainers import CLASS_HEADER
from klaudit.frameworks.trl import BETA, LOSS_TYPE

if TYPE_CHECKING:
    from klaudit.lint.facts import Labels

KEYS = (BETA, LOSS_TYPE)
Runs = Mapping[str, tuple["str | None", ...]]  # key -> every value the project's configurations give it


def _written(key: str) -> tuple[re.Pattern, re.Pattern, re.Pattern]:
    # `--beta 0.04`, `--beta=0.04`, `"--beta", "0.04"` (an argv list), `--beta $BETA` (computed: unknown)
    option = re.compile(rf"--{key}(?![\w-])(?:[ \t]*=[ \t]*|[ \t]+|[\"'][ \t]*,[ \t]*)([^\s,)\]\\]*)")
    yaml = re.compile(rf"^[ \t]*(?:[\w.]+\.)?{key}[ \t]*:[ \t]*([^\s#]*)", re.MULTILINE)
    # `training_args.beta = 0.1`, `cfg.grpo.beta = 0.1`: written to an object named as a configuration (not the
    # trainer's own `self.beta = args.beta`, nor `ctx.beta` of an autograd function)
    attribute = re.compile(rf"(?<![\w.])(?:self\.)?\w*(?:arg|conf|cfg|param|setting)\w*(?:\.\w+)*\.{key}[ \t]*=(?!=)"
                           rf"[ \t]*([^\n#;]*)", re.IGNORECASE)
    return option, yaml, attribute


_WRITTEN = {key: _written(key) for key in KEYS}


def written_values(text: str, key: str, *, yaml: bool = False) -> Iterator[str | None]:
    """The values of `key` that `text` writes as an option, a YAML key (`yaml`: the text is a YAML file) or an
    attribute of a configuration object: the literal, or None where it is computed. An option or key with
    nothing after it (`"--beta",` of an argparse definition) writes none."""
    option, yaml_key, attribute = _WRITTEN[key]
    for match in option.finditer(text):
        if match.group(1):
            yield literal(match.group(1), bare=True)
    for match in attribute.finditer(text):
        yield literal(match.group(1).strip(), bare=False)
    for match in yaml_key.finditer(text) if yaml else ():
        if match.group(1):
            yield literal(match.group(1), bare=True)


def literal(written: str, bare: bool) -> str | None:
    """A quoted string's text, a number, or (`bare`: a shell word or YAML scalar) a word; None for anything else,
    which is computed (`args.beta`, `$BETA`, `${oc.env:BETA}`, a Python name) or not understood."""
    if len(written) >= 2 and written[0] == written[-1] and written[0] in "\"'":
        return written[1:-1]
    return written if _number(written) or bare and re.fullmatch(r"[A-Za-z_][\w.-]*", written) else None


# a label of beta tested against a number: `beta == 0` (its values (True,) or (False,)), `beta > 0`
_TEST = re.compile(r"^beta (==|>=|<=|>|<) (-?[\d.]+(?:e-?\d+)?)$")
_COMPARE = {"==": lambda a, b: a == b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
            "<": lambda a, b: a < b, "<=": lambda a, b: a <= b}


def holds(labels: Labels, runs: Runs) -> bool:
    """Whether a path taken under switch `labels` can run in one of the project's configurations: beta's tests of a
    number are true at one of its betas, and loss_type's values take one of its loss types (each key apart). An
    unknown value, or a label that is no such test, holds."""
    return _beta_holds(labels, runs.get(BETA, (None,))) and _loss_type_holds(labels, runs.get(LOSS_TYPE, (None,)))


def _beta_holds(labels: Labels, betas: tuple[str | None, ...]) -> bool:
    tests = [(match, values) for name, values in labels if (match := _TEST.match(name)) is not None and _truths(values)]
    flags = [values for name, values in labels if name == BETA and _truths(values)]  # `if self.beta:`
    if not tests and not flags or None in betas:
        return True
    numbers = [float(beta) for beta in betas if beta is not None and _number(beta)]
    if len(numbers) < len(betas):
        return True  # a word where a number belongs: not understood
    return any(all(_COMPARE[match.group(1)](value, float(match.group(2))) in values for match, values in tests)
               and all((value != 0) in values for values in flags) for value in numbers)


def _loss_type_holds(labels: Labels, loss_types: tuple[str | None, ...]) -> bool:
    from klaudit.lint.facts import takes  # the analysis's own reading of a label's values

    chosen = [values for name, values in labels if name == LOSS_TYPE and not _truths(values)]
    if not chosen or None in loss_types:
        return True
    return any(all(takes(value, values) for values in chosen) for value in loss_types if value is not None)


def _truths(values: tuple) -> bool:
    return all(isinstance(value, bool) for value in values)


def _number(text: str | None) -> bool:
    return text is not None and re.fullmatch(r"-?[\d.]+(?:e-?\d+)?", text) is not None


# `self.beta = args.beta` in a trainer's `__init__`: an edited copy of TRL's GRPOTrainer (in a module that names GRPO:
# TRL's DPOTrainer reads its own beta, the preference loss's temperature, the same way)
_FROM_CONFIG = re.compile(r"\bself\.beta[ \t]*=[ \t]*(?:self\.)?args\.beta\b")


def is_grpo_trainer_module(path: str, source: str, subclasses: Collection[str]) -> bool:
    """Whether the module at `path` defines a GRPO trainer that reads its switches from TRL's GRPOConfig: a copy of
    TRL's GRPOTrainer, or a class deriving from it (`subclasses`); not TRL's own modules, which every user
    configures."""
    if "trl" in Path(path).parts[:-1]:
        return False
    return _FROM_CONFIG.search(source) is not None and "GRPO" in source or any(
        name in subclasses for name, _ in CLASS_HEADER.findall(source))
