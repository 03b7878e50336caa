"""`--output-format github`: one GitHub Actions workflow command per finding, shown as an
annotation on the pull request's diff.

`::error file=F,line=L,col=C,endLine=L2,endColumn=C2,title=T::MESSAGE`. GitHub reads `%`, CR and
LF escaped as `%25`, `%0D`, `%0A` in the message, and additionally `:` and `,` as `%3A`, `%2C` in
the properties (they separate the properties from each other and from the message).
"""

from __future__ import annotations

from collections.abc import Sequence

from klaudit.lint.findings import Finding
from klaudit.lint.report import ReportOptions, checkout_path, with_help
from klaudit.lint.rulebook import severity
from klaudit.rules import RULES

# An informational finding (KL099, KL100) is a notice: it never fails a run, so it is not an error.
_COMMAND = {"error": "error", "info": "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(finding: Finding) -> str:
    properties = {
        "file": checkout_path(finding.path),
        "line": finding.line,
        "col": finding.column,
        "endLine": finding.end_line,
        "endColumn": finding.end_column,
        "title": f"{finding.code} ({RULES[finding.code].name})",
    }
    listed = ",".join(f"{key}={escape_property(str(value))}" for key, value in properties.items())
    return f"::{_COMMAND[severity(finding.code)]} {listed}::{escape_data(with_help(finding))}"


def format_github(findings: Sequence[Finding], options: ReportOptions) -> str:
    """One annotation line per finding, nothing else (an empty run prints nothing)."""
    return "\n".join(annotation(finding) for finding in findings)
