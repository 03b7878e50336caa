"""Output formats for lint findings: `text` (for people) and `json` (ruff-compatible, for tools).

Every format is a function `(findings, options) -> str` registered in FORMATTERS, so `github`
and `sarif` slot in as two more entries.
"""

from __future__ import annotations

import io
import json
import os
import tokenize
from dataclasses import dataclass
from typing import Callable, Sequence

import click

from klaudit.lint.findings import Finding

# Rule pages live in the package (klaudit/rules/KLxxx.md); the URL is that file in the repository.
RULE_URL = "https://github.com/klaudit/klaudit/blob/main/klaudit/rules/{code}.md"


@dataclass(frozen=True)
class ReportOptions:
    """How to render: colours (only on a terminal) and terse lines (`--quiet`)."""

    color: bool = False
    quiet: bool = False


def rule_url(code: str) -> str:
    return RULE_URL.format(code=code)


# Control characters (a binary file's bytes) are shown as U+FFFD, one for one, so that the
# terminal is not disturbed and the caret stays aligned; tabs and line ends are kept.
_PRINTABLE = {code: "\ufffd" for code in (*range(0x20), 0x7F) if chr(code) not in "\t\n\r"}


def _read_lines(path: str) -> list[str]:
    """The lines of a linted file, decoded as Python decodes it; [] if it cannot be read."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding, errors="replace").translate(_PRINTABLE).splitlines()
    except (OSError, SyntaxError, LookupError):
        return []


def _caret_line(source_line: str, column: int, end_column: int) -> str:
    """Spaces (tabs kept, so the caret lines up) up to `column`, then ^ to `end_column`."""
    prefix = "".join("\t" if char == "\t" else " " for char in source_line[: column - 1])
    width = max(end_column - column, 1)
    return prefix + "^" * width


def format_text(findings: Sequence[Finding], options: ReportOptions) -> str:
    """`path:line:col: CODE message`, the source line with a caret, the origin and the fix."""
    def style(text: str, **kwargs: object) -> str:
        return click.style(text, **kwargs) if options.color else text

    out: list[str] = []
    cache: dict[str, list[str]] = {}
    for finding in findings:
        head = (f"{style(finding.path, bold=True)}:{finding.line}:{finding.column}: "
                f"{style(finding.code, fg='red', bold=True)} {finding.message}")
        out.append(head)
        if options.quiet:
            continue
        lines = cache.setdefault(finding.path, _read_lines(finding.path))
        gutter = len(str(max(finding.line, finding.origin_line or 0)))
        bar = style(" " * gutter + " |", fg="blue")
        if 0 < finding.line <= len(lines):
            source_line = lines[finding.line - 1]
            end_column = finding.end_column if finding.end_line == finding.line else len(source_line) + 1
            out.append(bar)
            out.append(style(f"{finding.line:>{gutter}} |", fg="blue") + f" {source_line}")
            out.append(bar + " " + style(_caret_line(source_line, finding.column, end_column), fg="red"))
        if finding.origin_line and 0 < finding.origin_line <= len(lines):
            out.append(style(" " * gutter + " = ", fg="blue")
                       + f"note: the estimator is computed at line {finding.origin_line}:")
            out.append(style(f"{finding.origin_line:>{gutter}} |", fg="blue")
                       + f" {lines[finding.origin_line - 1]}")
        if finding.fix:
            out.append(style(" " * gutter + " = ", fg="blue") + style("help", bold=True) + f": {finding.fix}")
        out.append("")
    if not options.quiet:
        out.append(summary(findings))
    return "\n".join(out)


def summary(findings: Sequence[Finding]) -> str:
    """"Found 3 errors in 2 files." or "All checks passed!"."""
    if not findings:
        return "All checks passed!"
    files = len({finding.path for finding in findings})
    errors = "error" if len(findings) == 1 else "errors"
    return f"Found {len(findings)} {errors} in {files} {'file' if files == 1 else 'files'}."


def format_json(findings: Sequence[Finding], options: ReportOptions) -> str:
    """A JSON array in the shape of `ruff check --output-format json` (fix is null for now), plus
    `related`: the finding's other places (file, line, column, what), e.g. the estimator's definition."""
    return json.dumps([
        {
            "cell": None,
            "code": finding.code,
            "end_location": {"column": finding.end_column, "row": finding.end_line},
            "filename": os.path.abspath(finding.path),
            "fix": None,
            "location": {"column": finding.column, "row": finding.line},
            "message": finding.message,
            "noqa_row": finding.line,
            "url": rule_url(finding.code),
            "related": [
                {"filename": os.path.abspath(where), "location": {"column": column, "row": line}, "what": what}
                for where, line, column, what in finding.related
            ],
        }
        for finding in findings
    ], indent=2)


FORMATTERS: dict[str, Callable[[Sequence[Finding], ReportOptions], str]] = {
    "text": format_text,
    "json": format_json,
}
