"""Inline suppressions: `# noqa`, `# noqa: KL002,KL003` and `# klaudit: ignore[KL002]`.

Comments are taken from the parsed module (the CST's Comment nodes), so a `# noqa` inside a
string literal is not a comment and suppresses nothing. As in ruff, `# noqa:` followed by no
valid code is not a directive; a bare `# noqa` silences every code on its line.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

import libcst
from libcst.metadata import MetadataWrapper, PositionProvider

from klaudit.lint.findings import Finding

_CODE = r"[A-Za-z]+[0-9]+"
_CODE_LIST = rf"{_CODE}(?:\s*[,\s]\s*{_CODE})*"
_NOQA = re.compile(rf"#\s*noqa\b(?P<colon>\s*:\s*(?P<codes>{_CODE_LIST})?)?", re.IGNORECASE)
_KLAUDIT_IGNORE = re.compile(rf"#\s*klaudit:\s*ignore\[\s*(?P<codes>{_CODE_LIST})\s*\]", re.IGNORECASE)

# line -> codes silenced there; None silences every code.
SuppressionTable = Mapping[int, Optional[frozenset[str]]]


def _codes(text: str) -> frozenset[str]:
    return frozenset(code.upper() for code in re.findall(_CODE, text))


def parse_comment(comment: str) -> Optional[frozenset[str]]:
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


class _CommentCollector(libcst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.table: dict[int, Optional[frozenset[str]]] = {}

    def visit_Comment(self, node: libcst.Comment) -> None:
        silenced = parse_comment(node.value)
        if silenced is not None and not silenced:
            return
        line = self.get_metadata(PositionProvider, node).start.line
        previous = self.table.get(line, frozenset())
        self.table[line] = None if silenced is None or previous is None else previous | silenced


def suppression_table(module: libcst.Module) -> SuppressionTable:
    """The suppression directives of a parsed module, by line."""
    collector = _CommentCollector()
    MetadataWrapper(module, unsafe_skip_copy=True).visit(collector)
    return collector.table


def is_suppressed(finding: Finding, table: SuppressionTable) -> bool:
    """True if a directive on the finding's first or last line silences its code."""
    for line in {finding.line, finding.end_line}:
        if line in table and (table[line] is None or finding.code in table[line]):
            return True
    return False
