"""The rule pages in klaudit/rules: their structure, and their examples run as lint tests.

Each page's bad example must give exactly the findings its `# <- KLxxx` markers name (all of the
page's own code), and its good example none.
"""

from __future__ import annotations

import re
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest
from click.testing import CliRunner

from klaudit import cli
from klaudit.cli import main
from klaudit.config import FILE_CODES, INCOMPLETE_CODE, UNUSED_SUPPRESSION_CODE, Settings
from klaudit.lint.autofix import NOT_MECHANICAL
from klaudit.lint.engine import lint_paths
from klaudit.rules import RULES, parse_header

SECTIONS = ("What it flags", "Why", "Bad", "Good", "Fix", "Fix safety", "When this is fine")
MARKER = re.compile(r"#\s*<-\s*(KL\d{3}(?:\s+KL\d{3})*)\s*$")
CODES = sorted(RULES)


def page_text(code: str) -> str:
    return resources.files("klaudit").joinpath("rules", f"{code}.md").read_text(encoding="utf-8")


def sections(text: str) -> dict[str, str]:
    """Body of every `## Heading`, keyed by heading, in page order."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {heading.strip(): body for heading, body in zip(parts[1::2], parts[2::2])}


def example(code: str, heading: str) -> str:
    """The first ```python block of a section."""
    match = re.search(r"```python\n(.*?)```", sections(page_text(code))[heading], flags=re.DOTALL)
    assert match, f"{code}: no python example under '## {heading}'"
    return match.group(1)


def markers(source: str) -> Counter:
    expected: Counter = Counter()
    for number, text in enumerate(source.splitlines(), start=1):
        match = MARKER.search(text)
        if match:
            expected.update((number, marked) for marked in match.group(1).split())
    return expected


def lint_source(source: str, path: Path) -> Counter:
    """Findings of every rule, the informational ones (off by default) included."""
    path.write_text(source, encoding="utf-8")
    result = lint_paths([str(path)], settings=Settings().with_overrides(select=["ALL"]))
    assert result.errors == []
    return Counter((finding.line, finding.code) for finding in result.findings)


def test_every_rule_has_a_page_and_every_page_a_rule():
    pages = {entry.name[:-3] for entry in resources.files("klaudit").joinpath("rules").iterdir()
             if entry.name.endswith(".md")}
    assert pages == set(RULES)


def test_marker_pattern_reads_codes():
    assert markers("x = 1\nloss = kl  # <- KL002 KL002\n") == Counter({(2, "KL002"): 2})


@pytest.mark.parametrize("code", CODES)
def test_the_registry_reads_the_page_header(code):
    lines = page_text(code).splitlines()
    rule = RULES[code]
    assert lines[0] == f"# {code} {rule.name}" and lines[2] == rule.summary and rule.summary.endswith(".")


@pytest.mark.parametrize("header", ["KL012 kl-new\n\nSummary.", "# KL012 Kl_New\n\nSummary.", "# KL013 kl-new\n\nSummary.",
                                    "# KL012 kl-new\nSummary.", "# KL012 kl-new\n\n"])
def test_a_malformed_page_header_is_refused(header):
    with pytest.raises(ValueError, match="KL012.md must open with"):
        parse_header("KL012", header)


def test_every_code_the_catalog_and_the_configuration_name_has_a_rule():
    from klaudit.catalog import CATALOG
    from klaudit.config import FILE_CODES, INFORMATIONAL_CODES, UNUSED_SUPPRESSION_CODE

    named = {row.rule for row in CATALOG if row.rule} | set(FILE_CODES) | set(INFORMATIONAL_CODES)
    assert named | {UNUSED_SUPPRESSION_CODE} <= set(RULES)


@pytest.mark.parametrize("code", CODES)
def test_page_has_the_sections_in_order(code):
    assert tuple(sections(page_text(code))) == SECTIONS


@pytest.mark.parametrize("code", [code for code in CODES if code not in FILE_CODES + (UNUSED_SUPPRESSION_CODE,)])
def test_page_points_at_the_catalog_and_the_estimators(code):
    parts = sections(page_text(code))
    row_pointer = re.search(r"kl-math\.md .*?§8,?\s+rows?\s+\d", parts["Why"], flags=re.DOTALL)
    assert row_pointer, f"{code}: 'Why' must name the row of kl-math.md §8"
    assert "klaudit.estimators." in parts["Fix"]
    safety = " ".join(parts["Fix safety"].split())
    lint_options = {option for param in cli.lint_command.params for option in param.opts}
    assert set(re.findall(r"--[a-z-]+", safety)) <= lint_options  # a page promises only options that exist
    if code.startswith("KL0"):  # a verdict's fix changes what is optimised: unsafe, applied only when asked
        assert "nsafe" in safety
        if code in NOT_MECHANICAL:  # no mechanical fix is safe for these
            assert "never applies it" in safety and "--fix" not in safety
        else:
            assert "--fix --unsafe-fixes" in safety and "says why" in safety
    assert f"# noqa: {code}" in parts["When this is fine"]


# KL099's cause (a spent budget, a 400-level chain) does not fit in a page's example: tests/lint/test_limits.py
@pytest.mark.parametrize("code", [code for code in CODES if code != INCOMPLETE_CODE])
def test_bad_example_gives_exactly_its_marked_findings(code, tmp_path):
    source = example(code, "Bad")
    expected = markers(source)
    assert expected, f"{code}: the bad example marks no line"
    assert {marked for _, marked in expected} == {code}
    assert lint_source(source, tmp_path / f"{code.lower()}_bad.py") == expected


@pytest.mark.parametrize("code", CODES)
def test_good_example_gives_no_finding(code, tmp_path):
    source = example(code, "Good")
    assert markers(source) == Counter()
    assert lint_source(source, tmp_path / f"{code.lower()}_good.py") == Counter()


@pytest.mark.parametrize("code", ["KL000", "KL002"])
def test_klaudit_rule_prints_the_page(code):
    result = CliRunner().invoke(main, ["rule", code])
    assert result.exit_code == 0
    assert result.output.strip() == page_text(code).strip()
