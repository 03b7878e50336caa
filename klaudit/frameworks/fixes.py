"""Flag changes as fixes: the value of a flag set in a launch script, a YAML file or a framework
configuration call, replaced where the file sets it (klaudit.lint.edits)."""

from __future__ import annotations

from klaudit.frameworks.settings import Setting
from klaudit.lint.edits import UNSAFE, Edit, Fix

_SEPARATORS = {"yaml": ":", "shell": "=", "python": "="}


def flag_fix(text: str, setting: Setting, value: str, style: str, message: str) -> Fix | None:
    """The edit that sets the flag at `setting` to `value`, keeping its quotes; None when the flag's
    text is not `key<separator>value` on one line as read."""
    lines = text.splitlines()
    if not 0 < setting.line <= len(lines):
        return None
    line = lines[setting.line - 1]
    span = line[setting.column - 1: setting.end_column - 1]
    separator = span.find(_SEPARATORS[style])
    if separator < 0:
        return None
    start = separator + 1
    while start < len(span) and span[start] in " \t":
        start += 1
    old = span[start:].rstrip().rstrip(",").rstrip()
    if not old:
        return None
    quote = old[0] if old[0] in "\"'" and old[-1] == old[0] and len(old) > 1 else ""
    if style == "python" and not quote:
        return None  # a keyword set to something other than a string literal
    column = setting.column + start
    return Fix(UNSAFE, message, (Edit(setting.line, column, setting.line, column + len(old), f"{quote}{value}{quote}"),))
