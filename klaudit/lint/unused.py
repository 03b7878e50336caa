"""KL101: suppression comments that name a klaudit code but suppress nothing on their line.

Only klaudit's own codes are judged (a `# noqa: E501` is another linter's business, a bare `# noqa`
may be too). A code is unused when it is enabled (or is no klaudit code at all) and no finding of
that code starts or ends on the comment's line. The fix removes the unused codes, and the whole
directive when none is left; it changes no behaviour, so it is safe.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from klaudit.config import UNUSED_SUPPRESSION_CODE
from klaudit.lint.edits import SAFE, Edit, Fix
from klaudit.lint.findings import Finding
from klaudit.rules import RULES

_KLAUDIT_CODE = re.compile(r"^KL\d{3}$", re.IGNORECASE)
_SEPARATOR = r"\s*[,\s]\s*"
_NOQA = re.compile(r"#\s*noqa\s*:\s*(?P<codes>[A-Za-z]+[0-9]+(?:\s*[,\s]\s*[A-Za-z]+[0-9]+)*)", re.IGNORECASE)
_IGNORE = re.compile(r"#\s*klaudit:\s*ignore\[\s*(?P<codes>[A-Za-z]+[0-9]+(?:\s*[,\s]\s*[A-Za-z]+[0-9]+)*)\s*\]",
                     re.IGNORECASE)


@dataclass(frozen=True)
class Directive:
    """One `# noqa: ...` or `# klaudit: ignore[...]` inside a comment, with its place in the line."""

    line: int
    column: int  # 1-based start of the directive
    end_column: int  # 1-based, exclusive
    codes: tuple[str, ...]  # as written
    comment_start: int  # 1-based column where the comment starts
    noqa: bool  # a noqa directive (else a klaudit: ignore[...] one)


def directives(source: str) -> list[Directive]:
    """The directives that name codes, from Python's tokenizer (a `# noqa` in a string is no comment)."""
    found: list[Directive] = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return found
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        line, start = token.start
        for pattern, noqa in ((_NOQA, True), (_IGNORE, False)):
            for match in pattern.finditer(token.string):
                codes = tuple(re.split(_SEPARATOR, match.group("codes").strip()))
                found.append(Directive(line, start + match.start() + 1, start + match.end() + 1, codes,
                                       start + 1, noqa))
    return found


def might_have_directives(source: str) -> bool:
    return ("noqa" in source or "klaudit:" in source) and "KL" in source.upper()


def unused_suppressions(path: str, source: str, raw: Sequence[Finding], enabled: Iterable[str]) -> list[Finding]:
    """KL101 for each directive naming klaudit codes that suppress nothing, with the fix that removes them.
    `raw` are the file's findings before suppressions were applied."""
    enabled = frozenset(enabled)
    used = {(line, finding.code) for finding in raw for line in {finding.line, finding.end_line}}
    lines = source.splitlines()
    out = []
    for directive in directives(source):
        ours = [code for code in directive.codes if _KLAUDIT_CODE.match(code)]
        if UNUSED_SUPPRESSION_CODE in (code.upper() for code in ours):
            continue  # the comment is kept as written on purpose
        unused = [code for code in ours if (directive.line, code.upper()) not in used
                  and (code.upper() in enabled or code.upper() not in RULES)]
        if not unused:
            continue
        names = ", ".join(code.upper() + ("" if code.upper() in RULES else " (no such code)") for code in unused)
        message = f"unused suppression: {names} suppresses nothing on this line"
        fix = Fix(SAFE, f"Remove the unused {'code' if len(unused) == 1 else 'codes'} from the comment",
                  (_removal(directive, unused, lines[directive.line - 1]),))
        out.append(Finding(path, directive.line, directive.column, UNUSED_SUPPRESSION_CODE, message,
                           directive.line, directive.end_column, autofix=fix))
    return out


def _removal(directive: Directive, unused: list[str], line: str) -> Edit:
    """The edit that leaves the directive with its used codes, or removes it (and an emptied comment)."""
    kept = [code for code in directive.codes if code not in unused]
    if kept:
        rewritten = f"# noqa: {', '.join(kept)}" if directive.noqa else f"# klaudit: ignore[{', '.join(kept)}]"
        return Edit(directive.line, directive.column, directive.line, directive.end_column, rewritten)
    rest = (line[directive.comment_start - 1: directive.column - 1] + line[directive.end_column - 1:]).strip()
    if rest in ("", "#"):  # the comment held only the directive: remove it and the spaces before it
        start = directive.comment_start
        while start > 1 and line[start - 2] in " \t":
            start -= 1
        return Edit(directive.line, start, directive.line, len(line) + 1, "")
    end = directive.end_column
    while end - 1 < len(line) and line[end - 1] in " \t":
        end += 1
    # the directive opened the comment: the rest of the comment keeps a `#` of its own
    opening = "# " if directive.column == directive.comment_start else ""
    return Edit(directive.line, directive.column, directive.line, end, opening)
