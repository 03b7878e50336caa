"""CONTRIBUTING.md's "Adding a rule" stays true: every file it names exists, and every rule has them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from klaudit import catalog
from klaudit.config import FILE_CODES
from klaudit.rules import RULES

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "CONTRIBUTING.md"
MARKER = re.compile(r"#\s*<-\s*((?:KL\d{3}\s*)+)$", re.MULTILINE)
VERDICT_CODES = sorted(code for code in RULES if code.startswith("KL0") and code not in FILE_CODES)


def adding_a_rule() -> str:
    text = GUIDE.read_text(encoding="utf-8")
    return text.split("## Adding a rule", 1)[1].split("\n## ", 1)[0]


def test_every_file_the_guide_names_exists():
    named = set(re.findall(r"`((?:klaudit|tests|docs|fixtures)/[\w./-]+?\.(?:py|md))`", adding_a_rule()))
    assert len(named) >= 8
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing


@pytest.mark.parametrize("code", sorted(RULES))
def test_every_rule_has_a_page(code):
    assert (ROOT / "klaudit" / "rules" / f"{code}.md").is_file()


@pytest.mark.parametrize("code", VERDICT_CODES)
def test_every_verdict_rule_has_rows_a_table_entry_and_a_fixture(code):
    rows = [row for row in catalog.CATALOG if row.rule == code]
    assert rows, f"{code}: no catalog row"
    table = (ROOT / "docs" / "kl-math.md").read_text(encoding="utf-8")
    assert re.search(rf"\|\s*{code}\s*\|", table), f"{code}: not in the table of docs/kl-math.md §8"
    planted = {
        path.name
        for path in (ROOT / "fixtures" / "bad").rglob("*.py")
        if any(code in found.split() for found in MARKER.findall(path.read_text(encoding="utf-8")))
    }
    assert planted, f"{code}: no fixtures/bad file marks it"
    twins = [name for name in planted if (ROOT / "fixtures" / "fixed" / name).exists()
             or any((ROOT / "fixtures" / "fixed").rglob(name))]
    assert twins, f"{code}: no fixed twin of {sorted(planted)}"
