"""What every output format says about a rule: its severity, its page and the page's address."""

from __future__ import annotations

from importlib import resources

from klaudit.catalog import RULES
from klaudit.config import INFORMATIONAL_CODES

# Rule pages live in the package (klaudit/rules/KLxxx.md); the URL is that file in the repository.
RULE_URL = "https://github.com/klaudit/klaudit/blob/main/klaudit/rules/{code}.md"


def rule_url(code: str) -> str:
    return RULE_URL.format(code=code)


def severity(code: str) -> str:
    """"info" for the informational codes (they never fail a run), "error" for the verdicts."""
    return "info" if code in INFORMATIONAL_CODES else "error"


def rule_page(code: str) -> str:
    """The rule's page shipped in the package, or a short page built from its catalog entry."""
    page = resources.files("klaudit").joinpath("rules", f"{code}.md")
    if page.is_file():
        return page.read_text(encoding="utf-8")
    rule = RULES[code]
    return f"# {rule.code} {rule.name}\n\n{rule.summary}\n"
