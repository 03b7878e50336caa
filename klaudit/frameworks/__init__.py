"""Framework configurations: the KL flags users set in launch scripts and YAML files.

Most users who fine-tune with RL pick their KL estimator with a flag. Each framework module maps its
flags, with the framework's defaults for the flags left out, to a catalog configuration; the
catalog's verdicts then apply at the line of the flag, with the same codes and words as the
findings in Python code, and the fix as a flag change where the framework has a right one.
Known: verl's Hydra flags (launch scripts, YAML) and TRL's GRPOConfig (Python).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import libcst as cst

from klaudit.catalog import defects
from klaudit.describe import describe
from klaudit.frameworks import trl, verl
from klaudit.frameworks.calls import config_calls
from klaudit.frameworks.settings import Judged, shell_overrides, yaml_settings
from klaudit.lint.findings import Finding

SHELL_SUFFIXES = (".sh", ".bash")
YAML_SUFFIXES = (".yaml", ".yml")
CONFIG_SUFFIXES = SHELL_SUFFIXES + YAML_SUFFIXES


def mentions_flags(text: str) -> bool:
    """The cheap pre-filter: a file that names none of the framework's KL keys is not read further."""
    return any(key.rsplit(".", 1)[-1] in text for key in verl.KL_KEYS)


def lint_config(path: str, text: str) -> list[Finding]:
    """The findings of one launch script or YAML file (one configuration per file)."""
    if not mentions_flags(text):
        return []
    settings = shell_overrides(text)
    if path.endswith(YAML_SUFFIXES):  # a YAML config, or one whose `run:` block holds a launch command
        settings = {**yaml_settings(text), **settings}
    judged = verl.judge(settings)
    if judged is None:
        return []
    return _findings(path, judged, f"{verl.NAME} {verl.VERSION}", lambda rule, row_fix: verl.FIXES.get(rule, row_fix))


def mentions_config_class(source: str) -> bool:
    """The pre-filter for Python files: a framework configuration class is named."""
    return any(name in source for name in trl.CONFIG_CLASSES)


# A call of a configuration class as the syntax tree sees it (`GRPOConfig(`, `trl.GRPOConfig (`,
# `(GRPOConfig)(`): its name, then only blanks, closing brackets, comments or line continuations, then `(`.
_CONFIG_CALL = re.compile("(?:" + "|".join(trl.CONFIG_CLASSES) + r")(?:[\s)\\]|#[^\n]*+)*+\(")


def lint_python(path: str, module: cst.Module, source: str) -> list[Finding]:
    """The findings of the framework configuration objects a Python module builds."""
    if _CONFIG_CALL.search(source) is None:  # cheap, and spares the positions of the whole tree
        return []
    found = []
    for settings in config_calls(module, trl.CONFIG_CLASSES, trl.KEYS, source):
        judged = trl.judge(settings)
        if judged is not None:
            found.extend(_findings(path, judged, f"{trl.NAME} {trl.VERSION}", lambda rule, _: trl.fix(rule)))
    return found


def _findings(path: str, judged: Judged, framework: str, fix: Callable[[str, str], str]) -> list[Finding]:
    findings = []
    for row in defects(judged.config):
        if row.rule is None:
            continue
        where = judged.where(row.rule)
        message = f"{describe(judged.config)}: {row.explanation} [{framework}: {judged.flags}]"
        findings.append(Finding(path, where.line, where.column, row.rule, message, where.line, where.end_column,
                                fix(row.rule, row.fix)))
    return findings
