"""`klaudit lint` on the realistic fixtures: every planted pitfall, and nothing on the fixed twins.

A line of `fixtures/bad/` that must be reported ends with `# <- KLxxx` (the code repeated once per
finding on that line); the expected findings of a file are exactly the multiset of (line, code) of
its markers. Its twin in `fixtures/fixed/` must give no finding. fixtures/README.md states where
the markers go.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from klaudit.config import FILE_CODES
from klaudit.frameworks import CONFIG_SUFFIXES
from klaudit.lint.engine import lint_paths
from klaudit.lint.findings import Finding
from klaudit.lint.notebooks import NOTEBOOK_SUFFIX, read_notebook
from klaudit.rules import RULES

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
BAD = FIXTURES / "bad"
FIXED = FIXTURES / "fixed"
MARKER = re.compile(r"#\s*<-\s*(KL\d{3}(?:\s+KL\d{3})*)\s*$")
MIN_PAIRS = 15


def python_files(root: Path) -> list[str]:
    """Paths of the .py files under `root`, relative to it, in POSIX form."""
    return sorted(path.relative_to(root).as_posix() for path in root.rglob("*.py"))


LINTED_SUFFIXES = (*CONFIG_SUFFIXES, NOTEBOOK_SUFFIX)


def linted_files(root: Path) -> list[str]:
    """The Python files, the framework configurations (launch scripts, YAML) and the notebooks under `root`."""
    configs = [path.relative_to(root).as_posix() for path in root.rglob("*") if path.name.endswith(LINTED_SUFFIXES)]
    return sorted(python_files(root) + configs)


def fixture_pairs(root: Path) -> list[str]:
    """Top-level fixtures: single files, and packages (directories with an __init__.py)."""
    return sorted(
        entry.name for entry in root.iterdir()
        if (entry.is_file() and entry.name.endswith((".py", *LINTED_SUFFIXES))) or (entry / "__init__.py").is_file()
    )


def source_lines(path: Path) -> list[str]:
    """The lines findings are counted in: a notebook's code cells joined (klaudit.lint.notebooks)."""
    if path.name.endswith(NOTEBOOK_SUFFIX):
        notebook = read_notebook(str(path), path.read_bytes())
        assert not isinstance(notebook, Finding), notebook
        return notebook.text.splitlines()
    return path.read_text(encoding="utf-8").splitlines()


def expected_findings(path: Path) -> Counter:
    """The multiset of (line, code) that the markers of `path` ask for."""
    expected: Counter = Counter()
    for number, text in enumerate(source_lines(path), start=1):
        match = MARKER.search(text)
        if match:
            expected.update((number, code) for code in match.group(1).split())
    return expected


@cache
def linted(root: Path) -> tuple[dict[str, Counter], tuple[str, ...]]:
    """Lint one fixture tree once: (relative path -> Counter of (line, code)), internal errors."""
    result = lint_paths([str(root)])
    by_file: dict[str, Counter] = {}
    for finding in result.findings:
        relative = Path(finding.path).resolve().relative_to(root).as_posix()
        by_file.setdefault(relative, Counter())[(finding.line, finding.code)] += 1
    return by_file, tuple(result.errors)


def describe(path: Path, pairs: Counter) -> str:
    """One line per (line, code), with the source line, for a readable failure."""
    lines = source_lines(path)
    return "\n".join(
        f"    {path.name}:{line}: {code} x{count}  | {lines[line - 1].strip() if 0 < line <= len(lines) else ''}"
        for (line, code), count in sorted(pairs.items())
    )


def test_marker_pattern_reads_repeated_codes():
    line = "        kl_loss = masked_mean(kld, mask)  # <- KL001 KL003 KL003"
    assert MARKER.search(line).group(1).split() == ["KL001", "KL003", "KL003"]
    assert MARKER.search("loss = x  # KL001 is discussed elsewhere") is None


def test_bad_and_fixed_hold_the_same_files():
    assert linted_files(BAD) == linted_files(FIXED)


def test_there_are_enough_fixture_pairs():
    assert len(fixture_pairs(BAD)) >= MIN_PAIRS, fixture_pairs(BAD)


def test_every_rule_is_planted_somewhere():
    planted = {code for relative in linted_files(BAD) for _, code in expected_findings(BAD / relative)}
    # files and KL1xx: no KL code
    wanted = {code for code in RULES if code.startswith("KL0") and code not in FILE_CODES}
    assert wanted - planted == set()
    assert planted <= set(RULES)


@pytest.mark.parametrize("name", fixture_pairs(BAD))
def test_every_bad_fixture_plants_a_pitfall(name):
    files = [BAD / name] if (BAD / name).is_file() else sorted((BAD / name).rglob("*.py"))
    assert sum(sum(expected_findings(path).values()) for path in files) > 0


@pytest.mark.parametrize("relative", linted_files(FIXED))
def test_fixed_fixtures_carry_no_marker(relative):
    assert expected_findings(FIXED / relative) == Counter()


@pytest.mark.parametrize("relative", python_files(BAD) + python_files(FIXED))
def test_fixture_has_a_module_docstring(relative):
    path = (BAD if (BAD / relative).exists() else FIXED) / relative
    assert path.read_text(encoding="utf-8").lstrip().startswith('"""'), f"{path} needs a docstring"


@pytest.mark.parametrize("root", [BAD, FIXED], ids=["bad", "fixed"])
def test_linting_the_fixtures_raises_no_internal_error(root):
    _, errors = linted(root)
    assert errors == ()


@pytest.mark.parametrize("relative", linted_files(BAD))
def test_bad_fixture_reports_exactly_its_markers(relative):
    path = BAD / relative
    expected = expected_findings(path)
    actual = linted(BAD)[0].get(relative, Counter())
    missing, unexpected = expected - actual, actual - expected
    assert not missing and not unexpected, (
        f"{relative}: findings differ from the markers\n"
        f"  missing:\n{describe(path, missing) or '    -'}\n"
        f"  unexpected:\n{describe(path, unexpected) or '    -'}"
    )


@pytest.mark.parametrize("relative", linted_files(FIXED))
def test_fixed_fixture_reports_nothing(relative):
    path = FIXED / relative
    actual = linted(FIXED)[0].get(relative, Counter())
    assert not actual, f"{relative}: the fixed twin still reports\n{describe(path, actual)}"
