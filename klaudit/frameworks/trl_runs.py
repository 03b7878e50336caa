"""Whether a project's TRL GRPO trainer ever takes a branch: the values its configurations give beta and num_iterations.

TRL's GRPOTrainer, and a project's edited copy or subclass of it, adds its KL term only under
`if self.beta != 0.0`, with `self.beta = args.beta` read from the GRPOConfig it is handed; at beta = 0 the
reference model is not even loaded. Where every configuration the project builds or launches leaves beta at 0
(TRL's default from 0.19 on, or a copy's own default), that branch of the trainer's methods never trains, and a
verdict that holds only under it says nothing about the project's runs. So with `num_iterations` (default 1): its
loss compares the policy with stored log-probs only `if self.num_iterations > 1`, and a verdict of older samples
that holds only there says nothing about a project that never sets it above 1.

The values are read, conservatively, from everything that may set a key: each `GRPOConfig(...)` call (or a call of
a class deriving from it) outside the trainer modules themselves (TRL's own `GRPOConfig(f"{model_name}-GRPO")`
fallback is no run of the project), with its class's default where it leaves the key out and an unknown value after
`**kwargs`; a script that parses GRPOConfig from its command line (its default, and the values below); every
`--beta` option and YAML `beta:` in the project's launch scripts, configurations and Python text (a DPO launch's
beta counts too: it can only keep a verdict); and `config.beta = ...` written to an object named as a
configuration. A value that is not a number keeps every verdict. Only the methods of the trainer classes are judged
so (a helper's own `beta` parameter, a generalized JSD's interpolation, is another quantity), and only these keys:
which `loss_type` a library trainer's user picks is that user's choice.

So with the first PPOTrainer's `kl_penalty` (TRL up to 0.11), which an edited copy of that trainer reads as
`self.config.kl_penalty` to pick its estimator: where every `PPOConfig(...)` call of the project outside TRL's own
modules gives it a literal (or leaves it at "kl") and no launch, YAML file or assignment writes another, a branch
for an estimator none of them names (`abs`, `mse`) never runs.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from klaudit.frameworks.trl import BETA, ITERATIONS

if TYPE_CHECKING:
    from klaudit.lint.facts import Labels

Values = tuple["str | None", ...]  # every value the project's configurations give a key: a number's text, None where computed
Runs = Mapping[str, Values]  # by key (beta, num_iterations)

KEYS = (BETA, ITERATIONS)


@functools.cache
def _spellings(key: str) -> tuple[re.Pattern, re.Pattern, re.Pattern]:
    """How a text writes `key`: `--beta 0.04`, `--beta=0.04`, `"--beta", "0.04"` (an argv list), `--beta $BETA`
    (computed: unknown); a YAML key; `training_args.beta = 0.1`, `cfg.grpo.beta = 0.1`, written to an object named as
    a configuration (not the trainer's own `self.beta = args.beta`, nor `ctx.beta` of an autograd function)."""
    option = re.compile(rf"--{key}(?![\w-])(?:[ \t]*=[ \t]*|[ \t]+|[\"'][ \t]*,[ \t]*)([^\s,)\]\\]*)")
    yaml_key = re.compile(rf"^[ \t]*(?:[\w.]+\.)?{key}[ \t]*:[ \t]*([^\s#]*)", re.MULTILINE)
    attribute = re.compile(rf"(?<![\w.])(?:self\.)?\w*(?:arg|conf|cfg|param|setting)\w*(?:\.\w+)*\.{key}[ \t]*=(?!=)"
                           r"[ \t]*([^\n#;]*)", re.IGNORECASE)
    return option, yaml_key, attribute


def written_values(text: str, key: str = BETA, *, yaml: bool = False) -> Iterator[str | None]:
    """The values of `key` that `text` writes as an option, a YAML key (`yaml`: the text is a YAML file) or an
    attribute of a configuration object: the literal, or None where it is computed. An option or key with nothing
    after it (`"--beta",` of an argparse definition), or a YAML key that copies the same key of another section,
    writes none."""
    option, yaml_key, attribute = _spellings(key)
    for match in option.finditer(text):
        if match.group(1):
            yield _literal(match.group(1), bare=True)
    for match in attribute.finditer(text):
        yield _literal(match.group(1).strip(), bare=False)
    for match in yaml_key.finditer(text) if yaml else ():
        if match.group(1):
            copied = _same_key_copied(match.group(1), key)
            if copied is None:
                yield _literal(match.group(1), bare=True)
            elif copied:
                yield _literal(copied, bare=True)


def _same_key_copied(written: str, key: str) -> str | None:
    """Where a YAML value interpolates the same key of another section (verl's generated `loss_agg_mode:
    ${actor_rollout_ref.actor.loss_agg_mode}`, or `${oc.select:actor_rollout_ref.actor.loss_agg_mode,token-mean}`),
    the default it falls back on ("" where none): it writes no other value of its own. None for another value."""
    copied = re.fullmatch(rf"\$\{{(?:oc\.select:)?(?:[\w.]+\.)?{re.escape(key.rsplit('.', 1)[-1])}(?:,([^{{}}]*))?\}}",
                          written.strip("\"'"))
    return None if copied is None else (copied.group(1) or "").strip()


def _literal(written: str, bare: bool) -> str | None:
    """A quoted string's text, a number, or (`bare`: a shell word or YAML scalar) a word; None for anything else,
    which is computed (`args.beta`, `$BETA`, `${oc.env:BETA}`, a Python name) or not understood."""
    if len(written) >= 2 and written[0] == written[-1] and written[0] in "\"'":
        return written[1:-1]
    return written if _number(written) or bare and re.fullmatch(r"[A-Za-z_][\w.-]*", written) else None


# a label of a key tested against a number: `beta == 0` (its values (True,) or (False,)), `num_iterations > 1`
_TEST = re.compile(r"^(\w+) (==|>=|<=|>|<) (-?[\d.]+(?:e-?\d+)?)$")
_COMPARE = {"==": lambda a, b: a == b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
            "<": lambda a, b: a < b, "<=": lambda a, b: a <= b}


def holds(labels: Labels, runs: Runs) -> bool:
    """Whether a path taken under switch `labels` can run at the project's values: each key's tests of a number
    are true at one of its values. An unknown value, or a label that is no such test, holds."""
    return all(_holds_at(labels, key, values) for key, values in runs.items())


def _holds_at(labels: Labels, key: str, values: Values) -> bool:
    tests = [(match, truths) for name, truths in labels
             if (match := _TEST.match(name)) is not None and match.group(1) == key and _truths(truths)]
    flags = [truths for name, truths in labels if name == key and _truths(truths)]  # `if self.beta:`
    if not tests and not flags or None in values:
        return True
    numbers = [float(value) for value in values if value is not None and _number(value)]
    if len(numbers) < len(values):
        return True  # a word where a number belongs: not understood
    return any(all(_COMPARE[match.group(2)](value, float(match.group(3))) in truths for match, truths in tests)
               and all((value != 0) in truths for truths in flags) for value in numbers)


def _truths(values: tuple) -> bool:
    return all(isinstance(value, bool) for value in values)


def _number(text: str | None) -> bool:
    return text is not None and re.fullmatch(r"-?[\d.]+(?:e-?\d+)?", text) is not None


# `self.beta = args.beta` in a trainer's `__init__`: an edited copy of TRL's GRPOTrainer
_FROM_CONFIG = re.compile(r"\bself\.beta[ \t]*=[ \t]*(?:self\.)?args\.beta\b")


def trainer_methods(path: str, source: str, subclasses: Collection[str]) -> list[tuple[int, int]]:
    """(first line, last line) of each method of the GRPO trainers the module at `path` defines that reads beta from
    TRL's GRPOConfig: a class deriving from TRL's GRPOTrainer (`subclasses`), or a class named for GRPO, or naming
    GRPOConfig (SpaceR's `SGRLVRTrainer`, whose `args: GRPOConfig = None`), whose own code sets `self.beta = args.beta`
    (an edited copy; TRL's DPOTrainer reads its preference temperature the same way, from a DPOConfig), or a class
    deriving from one such class of the module (Unsloth's generated `UnslothGRPOTrainer(_UnslothGRPOTrainer)`). A
    method with a `beta` parameter of its own is left out, and so are TRL's own modules, which every user configures."""
    if "trl" in Path(path).parts[:-1] or "beta" not in source:
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return []
    spans = []
    trainers: set[str] = set()
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        text = ast.get_source_segment(source, node) or ""
        if node.name not in subclasses and not (("GRPO" in node.name or "GRPOConfig" in text) and _FROM_CONFIG.search(text)) \
                and not any(isinstance(base, ast.Name) and base.id in trainers for base in node.bases):
            continue
        trainers.add(node.name)
        spans += [(item.lineno, item.end_lineno or item.lineno) for item in node.body
                  if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and BETA not in {arg.arg for arg in (*item.args.posonlyargs, *item.args.args, *item.args.kwonlyargs)}]
    return spans


PPO_PENALTY = "kl_penalty"  # the first PPOTrainer's estimator (klaudit.frameworks.trl_ppo)
PPO_DEFAULT_PENALTY = "kl"
# an edited copy of the first PPOTrainer: it picks its estimator from its configuration
_READS_PENALTY = re.compile(r"\bself\.config\.kl_penalty\b")


def reads_ppo_penalty(source: str) -> bool:
    """Whether a module is (or edits) the first PPOTrainer, picking its KL estimator by `self.config.kl_penalty`."""
    return _READS_PENALTY.search(source) is not None


def penalty_holds(labels: Labels, penalties: Values) -> bool:
    """Whether a path taken under switch `labels` runs at one of the project's `kl_penalty` values; an unknown
    value, or labels that do not test it, hold."""
    from klaudit.lint.facts import takes

    tests = [values for name, values in labels if name == PPO_PENALTY]
    known = [value for value in penalties if value is not None]
    return not tests or len(known) < len(penalties) or any(all(takes(value, values) for values in tests)
                                                           for value in known)
