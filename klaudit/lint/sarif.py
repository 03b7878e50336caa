"""`--output-format sarif`: the findings as a SARIF 2.1.0 log, the format code-scanning services
(GitHub code scanning, IDE viewers) import.

One run: the tool's driver lists every rule of the catalog (name, summary, page), and each finding
is a result with its rule, level, message, the region of the KL term and, as related locations, the
finding's other places (where the estimator is computed). Columns count code points, as the lint
counts them; an end column is the one after the region, as SARIF defines it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from klaudit import __version__
from klaudit.lint.findings import Finding
from klaudit.lint.report import ReportOptions, with_help
from klaudit.lint.rulebook import rule_page, rule_url, severity
from klaudit.rules import RULES

SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SOURCE_ROOT = "%SRCROOT%"  # the working directory of the run; relative URIs are resolved against it
_LEVEL = {"error": "error", "info": "note"}


def _artifact(path: str) -> dict:
    """A path under the working directory as a relative URI on SOURCE_ROOT, elsewhere a file: URI."""
    absolute = Path(os.path.abspath(path))
    try:
        relative = absolute.relative_to(Path.cwd())
    except ValueError:
        return {"uri": absolute.as_uri()}
    return {"uri": quote(relative.as_posix()), "uriBaseId": SOURCE_ROOT}


def _location(path: str, region: dict) -> dict:
    return {"physicalLocation": {"artifactLocation": _artifact(path), "region": region}}


def _rule(code: str) -> dict:
    rule = RULES[code]
    return {
        "id": code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "helpUri": rule_url(code),
        "help": {"text": f"{rule.summary} See {rule_url(code)}", "markdown": rule_page(code)},
        "defaultConfiguration": {"level": _LEVEL[severity(code)]},
    }


def _result(finding: Finding, rule_index: int) -> dict:
    region = {"startLine": finding.line, "startColumn": finding.column,
              "endLine": finding.end_line, "endColumn": finding.end_column}
    result = {
        "ruleId": finding.code,
        "ruleIndex": rule_index,
        "level": _LEVEL[severity(finding.code)],
        "message": {"text": with_help(finding)},
        "locations": [_location(finding.path, region)],
    }
    if finding.autofix is not None:
        result["fixes"] = [_fix(finding)]
    if finding.related:
        result["relatedLocations"] = [
            {"id": number, "message": {"text": what},
             **_location(path, {"startLine": line, "startColumn": column})}
            for number, (path, line, column, what) in enumerate(finding.related)
        ]
    return result


def _fix(finding: Finding) -> dict:
    """The finding's fix as a SARIF fix: one artifact change, a replacement per edit (an insertion
    deletes an empty region)."""
    assert finding.autofix is not None
    return {
        "description": {"text": f"{finding.autofix.message} ({finding.autofix.applicability})"},
        "artifactChanges": [{
            "artifactLocation": _artifact(finding.path),
            "replacements": [
                {"deletedRegion": {"startLine": edit.line, "startColumn": edit.column,
                                   "endLine": edit.end_line, "endColumn": edit.end_column},
                 "insertedContent": {"text": edit.content}}
                for edit in finding.autofix.edits
            ],
        }],
    }


def format_sarif(findings: Sequence[Finding], options: ReportOptions) -> str:
    codes = list(RULES)
    log = {
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "klaudit",
                "version": __version__,
                "informationUri": "https://github.com/klaudit/klaudit",
                "rules": [_rule(code) for code in codes],
            }},
            "originalUriBaseIds": {SOURCE_ROOT: {"uri": Path.cwd().as_uri() + "/"}},
            "columnKind": "unicodeCodePoints",
            "results": [_result(finding, codes.index(finding.code)) for finding in findings],
        }],
    }
    return json.dumps(log, indent=2)
