"""What `klaudit lint` says about each bad fixture, word for word, kept beside it as
`fixtures/bad/<fixture>.snap`: the message, the suggested fix and the automatic fix (or why there is
none). Which findings are right is tested by the markers (test_fixtures.py); these snapshots make a
change of wording visible in review (tests/conftest.py says how to regenerate them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fixtures import BAD, fixture_pairs

from klaudit.lint.engine import lint_paths
from klaudit.lint.findings import Finding

REPOSITORY = BAD.parents[1]


def rendered(finding: Finding) -> str:
    """One finding as text, with paths relative to the repository so the snapshot reads the same anywhere."""
    location = Path(finding.path).resolve().relative_to(BAD).as_posix()
    lines = [f"{location}:{finding.line}:{finding.column}: {finding.code} {finding.message}"]
    if finding.fix:
        lines.append(f"  help: {finding.fix}")
    if finding.autofix is not None:
        edits = "; ".join(f"{e.line}:{e.column}-{e.end_line}:{e.end_column} -> {e.content!r}"
                          for e in finding.autofix.edits)
        lines.append(f"  fix ({finding.autofix.applicability}): {finding.autofix.message}: {edits}")
    elif finding.no_autofix:
        lines.append(f"  no automatic fix: {finding.no_autofix}")
    return "\n".join(lines).replace(f"{REPOSITORY}/", "")


@pytest.mark.parametrize("name", fixture_pairs(BAD))
def test_the_words_of_each_finding(name, snapshot):
    findings = lint_paths([str(BAD / name)]).findings
    snapshot(BAD / f"{name}.snap", "".join(rendered(finding) + "\n" for finding in findings))
