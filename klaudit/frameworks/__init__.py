"""Framework configurations: the KL flags users set in launch scripts and YAML files.

Most users who fine-tune with RL pick their KL estimator with a flag. Each framework module maps its
flags, with the framework's defaults for the flags left out, to a catalog configuration; the
catalog's verdicts then apply at the line of the flag, with the same codes and words as the
findings in Python code, and the fix as a flag change where the framework has a right one.
Known: verl's Hydra flags (launch scripts, YAML) and TRL's GRPOConfig (Python).
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from klaudit.catalog import defects
from klaudit.describe import describe
from klaudit.frameworks import trl, verl
from klaudit.frameworks.calls import config_calls
from klaudit.frameworks.fixes import flag_fix
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
    return _findings(path, judged, f"{verl.NAME} {verl.VERSION}", lambda rule, row_fix: verl.FIXES.get(rule, row_fix),
                     _Fixer(text, "shell", verl.FLAG_FIXES, verl.NO_FLAG_FIX))


def mentions_config_class(source: str) -> bool:
    """The pre-filter for Python files: a framework configuration class is named."""
    return any(name in source for name in trl.CONFIG_CLASSES)


def lint_python(path: str, module: cst.Module, source: str) -> list[Finding]:
    """The findings of the framework configuration objects a Python module builds."""
    if not mentions_config_class(source):
        return []
    found = []
    for settings in config_calls(module, trl.CONFIG_CLASSES, trl.KEYS):
        judged = trl.judge(settings)
        if judged is not None:
            found.extend(_findings(path, judged, f"{trl.NAME} {trl.VERSION}", lambda rule, _: trl.fix(rule),
                                   _Fixer(source, "python", trl.FLAG_FIXES, trl.NO_FLAG_FIX)))
    return found


class _Fixer:
    """The flag fixes of one file: `flags` maps a rule to the (key, value) that fixes it."""

    def __init__(self, text: str, style: str, flags: dict, otherwise: str) -> None:
        self.text, self.style, self.flags, self.otherwise = text, style, flags, otherwise

    def __call__(self, rule: str, judged: Judged):
        """(Fix or None, why there is none)."""
        if rule not in self.flags:
            return None, self.otherwise
        key, value = self.flags[rule]
        setting = judged.anchors.get(rule)
        if setting is None:
            return None, f"{key} is not set in this file: add {key.rsplit('.', 1)[-1]}={value} where the run is configured"
        style = "yaml" if self.style != "python" and _is_yaml_line(self.text, setting) else self.style
        fixed = flag_fix(self.text, setting, value, style, f"Set {key.rsplit('.', 1)[-1]} to {value}")
        return (fixed, "") if fixed is not None else (None, f"the value of {key} is not a literal klaudit can replace")


def _is_yaml_line(text: str, setting) -> bool:
    """Whether the setting's text reads `key: value` (YAML) rather than `key=value` (a command line)."""
    lines = text.splitlines()
    span = lines[setting.line - 1][setting.column - 1: setting.end_column - 1] if 0 < setting.line <= len(lines) else ""
    colon, equals = span.find(":"), span.find("=")
    return colon >= 0 and (equals < 0 or colon < equals)


def _findings(path: str, judged: Judged, framework: str, fix: Callable[[str, str], str], fixer: _Fixer) -> list[Finding]:
    findings = []
    for row in defects(judged.config):
        if row.rule is None:
            continue
        where = judged.where(row.rule)
        message = f"{describe(judged.config)}: {row.explanation} [{framework}: {judged.flags}]"
        autofix, why = fixer(row.rule, judged)
        findings.append(Finding(path, where.line, where.column, row.rule, message, where.line, where.end_column,
                                fix(row.rule, row.fix), autofix=autofix, no_autofix=why))
    return findings
