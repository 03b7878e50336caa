"""Reading the flags a user sets, with the line and column of each: launch scripts and YAML files.

A setting is a dotted key (`actor_rollout_ref.actor.kl_loss_type`) with its literal value. A value
that is not a literal (`$KL_TYPE`, `${oc.env:...}`) is kept as None: the key is set, to something
the reader cannot know, so no verdict rests on the framework's default for it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml

from klaudit.catalog import Config


@dataclass(frozen=True)
class Setting:
    value: str | None  # None: set, but not to a literal (a variable the reader cannot resolve)
    line: int
    column: int  # where the key starts
    end_column: int  # just after the value


@dataclass(frozen=True)
class Judged:
    """A configuration some flags select, where to report it, and the flags that decide it."""

    config: Config
    anchor: Setting  # the flag a user changes, unless `anchors` names another for a rule
    flags: str
    anchors: Mapping[str, Setting] = field(default_factory=dict)  # rule code -> its flag

    def where(self, rule: str) -> Setting:
        return self.anchors.get(rule, self.anchor)


# `key=value` as a Hydra override in a shell command (`+key=value` and `++key=value` add keys)
_OVERRIDE = re.compile(r"(?<![\w.$-])\+{0,2}(?P<key>[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)+)=(?P<value>\"[^\"\n]*\"|'[^'\n]*'|\$\{\w+\}|[^\s\\;|&)]+)")


# `name=value` shell variable assignments, whose `$name` / `${name}` an override may use
_VARIABLE = re.compile(r"^\s*(?:export\s+)?(?P<name>[A-Za-z_]\w*)=(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\s;|&#]*)")
_REFERENCE = re.compile(r"^\$(?:\{(?P<braced>[A-Za-z_]\w*)\}|(?P<plain>[A-Za-z_]\w*))$")


def _literal(value: str) -> str | None:
    if "$" in value:
        return None
    try:
        parts = shlex.split(value)
    except ValueError:
        return None
    return parts[0] if len(parts) == 1 else None


def shell_overrides(text: str) -> dict[str, Setting]:
    """Dotted `key=value` overrides anywhere in a script; the last one of a key wins, as in Hydra.
    A value that is a shell variable assigned a literal earlier (`kl_loss_type=k3` ... `...=${kl_loss_type}`)
    takes that literal, and the setting points at the assignment, the line a user edits."""
    found: dict[str, Setting] = {}
    variables: dict[str, Setting] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        assigned = _VARIABLE.match(code)
        if assigned is not None and "." not in assigned.group("name"):
            value = _literal(assigned.group("value"))
            if value is not None:
                variables[assigned.group("name")] = Setting(value, number, assigned.start("name") + 1,
                                                            assigned.end() + 1)
        for match in _OVERRIDE.finditer(code):
            reference = _REFERENCE.match(match.group("value"))
            if reference is not None:
                setting = variables.get(reference.group("braced") or reference.group("plain"))
                if setting is not None:
                    found[match.group("key")] = setting
                    continue
            found[match.group("key")] = Setting(_literal(match.group("value")), number, match.start("key") + 1,
                                                match.end() + 1)
    return found


def yaml_settings(text: str) -> dict[str, Setting]:
    """Every scalar of a YAML file under its dotted key path; {} for a file YAML cannot read (or
    nests past the YAML parser's recursion)."""
    found: dict[str, Setting] = {}
    try:
        documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except (yaml.YAMLError, RecursionError):
        return found
    for document in documents:
        stack = [("", document)]
        while stack:
            prefix, node = stack.pop()
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if isinstance(key, yaml.ScalarNode):
                        stack.append((f"{prefix}.{key.value}" if prefix else str(key.value), (key, value)))
            elif isinstance(node, tuple):
                key, value = node
                if isinstance(value, yaml.ScalarNode):
                    literal = None if "${" in str(value.value) else str(value.value)
                    found[prefix] = Setting(literal, key.start_mark.line + 1, key.start_mark.column + 1,
                                            value.end_mark.column + 1)
                else:
                    stack.append((prefix, value))
    return found
