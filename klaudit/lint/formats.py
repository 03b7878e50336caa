"""The lint's output formats by the name `--output-format` takes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from klaudit.lint.ci_reports import format_gitlab, format_junit
from klaudit.lint.findings import Finding
from klaudit.lint.github import format_github
from klaudit.lint.report import ReportOptions, format_concise, format_grouped, format_json, format_text
from klaudit.lint.sarif import format_sarif

FORMATTERS: dict[str, Callable[[Sequence[Finding], ReportOptions], str]] = {
    "text": format_text,
    "full": format_text,  # ruff's name for the format with the source shown
    "concise": format_concise,
    "grouped": format_grouped,
    "json": format_json,
    "github": format_github,
    "gitlab": format_gitlab,
    "junit": format_junit,
    "sarif": format_sarif,
}
