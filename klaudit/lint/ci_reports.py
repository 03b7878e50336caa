"""`--output-format gitlab` and `--output-format junit`: the reports GitLab CI and JUnit-reading CI
systems (Jenkins, GitLab's test reports, Azure Pipelines) show beside a merge request or a build.

GitLab's code quality report is a JSON array of issues: `description`, `check_name`, `fingerprint`,
`severity` and `location` (`path` and `positions.begin/end` with `line` and `column`). The fingerprint
identifies an issue across runs, so it hashes the file, the code and the message, not the line (a
finding that moves is the same issue), with a count for identical findings in one file.

JUnit's XML has one test suite per linted file with findings and one failed test case per finding;
a run without findings is one passing test case, as ruff writes it. Both name files relative to the
working directory, the checkout in CI.
"""

from __future__ import annotations

import hashlib
import json
import re
import xml.etree.ElementTree as ElementTree
from collections import Counter, defaultdict
from collections.abc import Sequence

from klaudit.lint.findings import Finding
from klaudit.lint.report import ReportOptions, checkout_path, with_help
from klaudit.lint.rulebook import severity
from klaudit.rules import RULES

# GitLab's severities: a verdict is a defect of the training objective; KL099/KL100 are informational.
_GITLAB_SEVERITY = {"error": "major", "info": "info"}
# Characters XML 1.0 cannot hold even escaped (control characters a switch value read from the source may
# carry): shown as U+FFFD, so that the report stays well-formed.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def _xml_text(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def format_gitlab(findings: Sequence[Finding], options: ReportOptions) -> str:
    seen: Counter[tuple[str, str, str]] = Counter()
    issues = []
    for finding in findings:
        path = checkout_path(finding.path)
        identity = (path, finding.code, finding.message)
        seen[identity] += 1
        fingerprint = hashlib.sha256("\0".join((*identity, str(seen[identity]))).encode()).hexdigest()
        issues.append({
            "description": f"{finding.code} {finding.message}",
            "check_name": f"{finding.code} ({RULES[finding.code].name})",
            "fingerprint": fingerprint,
            "severity": _GITLAB_SEVERITY[severity(finding.code)],
            "location": {"path": path, "positions": {
                "begin": {"line": finding.line, "column": finding.column},
                "end": {"line": finding.end_line, "column": finding.end_column}}},
        })
    return json.dumps(issues, indent=2)


def format_junit(findings: Sequence[Finding], options: ReportOptions) -> str:
    by_file: dict[str, list[Finding]] = defaultdict(list)
    for finding in findings:
        by_file[checkout_path(finding.path)].append(finding)
    suites = ElementTree.Element("testsuites", name="klaudit", tests=str(max(len(findings), 1)),
                                 failures=str(len(findings)), errors="0")
    if not findings:
        suite = ElementTree.SubElement(suites, "testsuite", name="klaudit", tests="1", failures="0", errors="0")
        ElementTree.SubElement(suite, "testcase", name="No findings", classname="klaudit")
    for path, found in by_file.items():
        suite = ElementTree.SubElement(suites, "testsuite", name=path, tests=str(len(found)),
                                       failures=str(len(found)), errors="0")
        for finding in found:
            case = ElementTree.SubElement(suite, "testcase", name=f"klaudit.{finding.code}", classname=path,
                                          file=path, line=str(finding.line))
            failure = ElementTree.SubElement(case, "failure", message=_xml_text(finding.message), type=finding.code)
            failure.text = _xml_text(f"{path}:{finding.line}:{finding.column}: {finding.code} {with_help(finding)}")
    ElementTree.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(suites, encoding="unicode")
