"""Inline suppressions: `# noqa`, `# noqa: KL002,KL003` and `# klaudit: ignore[KL002]`.

Comments are taken from Python's tokenizer (COMMENT tokens), so a `# noqa` inside a string
literal is not a comment and suppresses nothing. The tokenizer is used rather than a walk of the
CST with position metadata, which cost as much as the whole analysis of a large file. As in ruff, `# noqa:` followed by no
valid code is not a directive; a bare `# noqa` silences every code on its line.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Mapping
from dataclasses import replace

from klaudit.lint.findings import Finding

_CODE = r"[A-Za-z]+[0-9]+"
_CODE_LIST = rf"{_CODE}(?:\s*[,\s]\s*{_CODE})*"
_NOQA = re.compile(rf"#\s*noqa\b(?P<colon>\s*:\s*(?P<codes>{_CODE_LIST})?)?", re.IGNORECASE)
_KLAUDIT_IGNORE = re.compile(rf"#\s*klaudit:\s*ignore\[\s*(?P<codes>{_CODE_LIST})\s*\]", re.IGNORECASE)
# What every directive starts with: a text without it has none, and is not tokenized.
_DIRECTIVE_START = re.compile(r"#\s*(?:noqa|klaudit:)", re.IGNORECASE)

# line -> codes silenced there; None silences every code.
SuppressionTable = Mapping[int, frozenset[str] | None]


def _codes(text: str) -> frozenset[str]:
    return frozenset(code.upper() for code in re.findall(_CODE, text))


def parse_comment(comment: str) -> frozenset[str] | None:
    """The codes one comment silences: None for every code, an empty set for none."""
    silenced: set[str] = set()
    for match in _NOQA.finditer(comment):
        if match.group("colon") is None:
            return None
        if match.group("codes"):
            silenced |= _codes(match.group("codes"))
    for match in _KLAUDIT_IGNORE.finditer(comment):
        silenced |= _codes(match.group("codes"))
    return frozenset(silenced)


def suppression_table(source: str) -> SuppressionTable:
    """The suppression directives of a source text that parses, by line."""
    table: dict[int, frozenset[str] | None] = {}
    if _DIRECTIVE_START.search(source) is None:
        return table
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):  # the CST parser accepted it; be lenient anyway
        return table
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        silenced = parse_comment(token.string)
        if silenced is not None and not silenced:
            continue
        line = token.start[0]
        previous = table.get(line, frozenset())
        table[line] = None if silenced is None or previous is None else previous | silenced
    return table


def comment_table(text: str) -> SuppressionTable:
    """The directives of a file whose comments start at `#` (shell, YAML), by line."""
    table: dict[int, frozenset[str] | None] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if "#" in line:
            silenced = parse_comment(line[line.index("#"):])
            if silenced is None or silenced:
                table[number] = silenced
    return table


def is_suppressed(finding: Finding, table: SuppressionTable) -> bool:
    """True if a directive on the finding's first or last line silences its code."""
    for line in {finding.line, finding.end_line}:
        if line in table:
            silenced = table[line]
            if silenced is None or finding.code in silenced:
                return True
    return False


def without_suppressed_edits(finding: Finding, table: SuppressionTable) -> Finding:
    """The finding without its fix when the fix would edit a line that carries a suppression
    directive (suppressed code is never touched, even by the fix of another finding)."""
    fix = finding.autofix
    if fix is None or not any(line in table for edit in fix.edits for line in range(edit.line, edit.end_line + 1)
                              if edit.line != edit.end_line or edit.column != edit.end_column):
        return finding
    return replace(finding, autofix=None, no_autofix="the fix would edit a line with a suppression comment")
