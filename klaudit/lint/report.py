"""The output formats for people and for tools that read ruff: `text`, `concise`, `grouped`, `json`,
and the `--statistics` table.

Every format is a function `(findings, options) -> str`; klaudit.lint.formats registers them by name.
"""

from __future__ import annotations

import io
import json
import os
import tokenize
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import click

from klaudit.lint.edits import SAFE
from klaudit.lint.findings import Finding
from klaudit.lint.notebooks import NOTEBOOK_SUFFIX, read_notebook
from klaudit.lint.rulebook import rule_url, severity
from klaudit.rules import RULES


@dataclass(frozen=True)
class ReportOptions:
    """How to render: colours (only on a terminal) and terse lines (`--quiet`). `sources` holds the
    text of files that are not on disk as linted (stdin), by the path they are reported under."""

    color: bool = False
    quiet: bool = False
    sources: Mapping[str, str] = field(default_factory=dict)


def checkout_path(path: str) -> str:
    """The path relative to the working directory (the checkout, in CI), posix style; absolute when the
    file lies outside it: how CI annotations and reports name a file."""
    relative = os.path.relpath(os.path.abspath(path))
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return os.path.abspath(path).replace(os.sep, "/")
    return relative.replace(os.sep, "/")


def with_help(finding: Finding) -> str:
    """The message and, on a line of its own, the fix: what an annotation shows in full."""
    return f"{finding.message}\nhelp: {finding.fix}" if finding.fix else finding.message


# Control characters (a binary file's bytes) are shown as U+FFFD, one for one, so that the
# terminal is not disturbed and the caret stays aligned; tabs and line ends are kept.
_PRINTABLE = {code: "\ufffd" for code in (*range(0x20), 0x7F) if chr(code) not in "\t\n\r"}


def _read_lines(path: str) -> list[str]:
    """The lines of a linted file, decoded as Python decodes it (a notebook's code cells joined, as
    its findings count them); [] if it cannot be read."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        if path.endswith(NOTEBOOK_SUFFIX):
            notebook = read_notebook(path, data)
            return [] if isinstance(notebook, Finding) else notebook.text.translate(_PRINTABLE).splitlines()
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding, errors="replace").translate(_PRINTABLE).splitlines()
    except (OSError, SyntaxError, LookupError):
        return []


def _caret_line(source_line: str, column: int, end_column: int) -> str:
    """Spaces (tabs kept, so the caret lines up) up to `column`, then ^ to `end_column`."""
    prefix = "".join("\t" if char == "\t" else " " for char in source_line[: column - 1])
    width = max(end_column - column, 1)
    return prefix + "^" * width


def _styler(options: ReportOptions):
    def style(text: str, **kwargs: Any) -> str:
        return click.style(text, **kwargs) if options.color else text
    return style


def _head(finding: Finding, options: ReportOptions) -> str:
    """`path:line:col: CODE message`, the first line of a finding in every text format."""
    style = _styler(options)
    return (f"{style(finding.path, bold=True)}:{finding.line}:{finding.column}: "
            f"{style(finding.code, fg='red', bold=True)} {finding.message}")


def format_text(findings: Sequence[Finding], options: ReportOptions) -> str:
    """`path:line:col: CODE message`, the source line with a caret, the origin and the fix."""
    style = _styler(options)
    out: list[str] = []
    cache: dict[str, list[str]] = {}
    for finding in findings:
        out.append(_head(finding, options))
        if options.quiet:
            continue
        if finding.path not in cache:
            known = options.sources.get(finding.path)
            cache[finding.path] = (_read_lines(finding.path) if known is None
                                   else known.translate(_PRINTABLE).splitlines())
        lines = cache[finding.path]
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
        if finding.autofix is not None:
            out.append(style(" " * gutter + " = ", fg="blue") + style("fix", bold=True)
                       + f" ({finding.autofix.applicability}): {finding.autofix.message}")
        elif finding.no_autofix:
            out.append(style(" " * gutter + " = ", fg="blue") + f"no automatic fix: {finding.no_autofix}")
        out.append("")
    if not options.quiet:
        out.append(summary(findings))
        hint = fixable_hint(findings)
        if hint:
            out.append(hint)
    return "\n".join(out)


def fixable_hint(findings: Sequence[Finding]) -> str:
    """"[*] 2 fixable with `--fix --unsafe-fixes`." (as ruff says it), or "" when nothing is."""
    safe = sum(1 for f in findings if f.autofix is not None and f.autofix.applicability == SAFE)
    unsafe = sum(1 for f in findings if f.autofix is not None and f.autofix.applicability != SAFE)
    parts = []
    if safe:
        parts.append(f"[*] {safe} fixable with `--fix`.")
    if unsafe:
        parts.append(f"[*] {unsafe} fixable with `--fix --unsafe-fixes` (the fix changes what is optimised: review it).")
    return "\n".join(parts)


def format_concise(findings: Sequence[Finding], options: ReportOptions) -> str:
    """One `path:line:col: CODE message` line per finding, then the summary (not with --quiet)."""
    out = [_head(finding, options) for finding in findings]
    if not options.quiet:
        out.append(summary(findings))
    return "\n".join(out)


def format_grouped(findings: Sequence[Finding], options: ReportOptions) -> str:
    """The findings under their file's name, `line:col CODE message` indented and aligned, as ruff's
    grouped format prints them, then the summary (not with --quiet)."""
    style = _styler(options)
    out: list[str] = []
    by_path: dict[str, list[Finding]] = {}
    for finding in findings:
        by_path.setdefault(finding.path, []).append(finding)
    for path, group in by_path.items():
        out.append(style(path, bold=True) + ":")
        places = [f"{finding.line}:{finding.column}" for finding in group]
        width = max(len(place) for place in places)
        out.extend(f"  {place:<{width}} {style(finding.code, fg='red', bold=True)} {finding.message}"
                   for place, finding in zip(places, group))
        out.append("")
    if not options.quiet:
        out.append(summary(findings))
    return "\n".join(out).rstrip("\n")


def summary(findings: Sequence[Finding]) -> str:
    """"Found 3 errors in 2 files." or "All checks passed!"."""
    if not findings:
        return "All checks passed!"
    files = len({finding.path for finding in findings})
    errors = "error" if len(findings) == 1 else "errors"
    return f"Found {len(findings)} {errors} in {files} {'file' if files == 1 else 'files'}."


def format_json(findings: Sequence[Finding], options: ReportOptions) -> str:
    """A JSON array in the shape of `ruff check --output-format json` (`fix`: applicability, message and
    edits, or null), plus `related`: the finding's other places (file, line, column, what), e.g. the
    estimator's definition, the rule's `name`, `severity` ("error" for a verdict, "info" for the
    informational codes), `no_fix_reason` (why no fix is offered, or null) and `framework` (for a finding on a
    framework's flags, the framework and release they were judged for; null for one on the KL code)."""
    return json.dumps([
        {
            "cell": None,
            "code": finding.code,
            "end_location": {"column": finding.end_column, "row": finding.end_line},
            "filename": os.path.abspath(finding.path),
            "fix": finding.autofix.to_json() if finding.autofix is not None else None,
            "location": {"column": finding.column, "row": finding.line},
            "message": finding.message,
            "noqa_row": finding.line,
            "url": rule_url(finding.code),
            "name": RULES[finding.code].name,
            "severity": severity(finding.code),
            "no_fix_reason": finding.no_autofix or None,
            "framework": finding.framework or None,
            "related": [
                {"filename": os.path.abspath(where), "location": {"column": column, "row": line}, "what": what}
                for where, line, column, what in finding.related
            ],
        }
        for finding in findings
    ], indent=2)


def statistics(findings: Sequence[Finding]) -> list[tuple[str, int]]:
    """(code, count) for each code found, the most frequent first, ties by code."""
    counts = Counter(finding.code for finding in findings)
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def format_statistics(findings: Sequence[Finding], options: ReportOptions) -> str:
    """`--statistics`: a line per code, `count  code  name`, counts right-aligned, as ruff prints it."""
    rows = statistics(findings)
    if not rows:
        return "" if options.quiet else summary(findings)
    width = max(len(str(count)) for _, count in rows)
    style = _styler(options)
    return "\n".join(f"{count:>{width}}\t{style(code, fg='red', bold=True)}\t{RULES[code].name}"
                     for code, count in rows)


def format_statistics_json(findings: Sequence[Finding], options: ReportOptions) -> str:
    """`--statistics --output-format json`: [{"code", "name", "count"}], the most frequent first."""
    return json.dumps([{"code": code, "name": RULES[code].name, "count": count}
                       for code, count in statistics(findings)], indent=2)
