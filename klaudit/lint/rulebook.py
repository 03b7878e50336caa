"""What every output format says about a rule: its severity, its page and the page's address."""

from __future__ import annotations

from klaudit.config import INFORMATIONAL_CODES
from klaudit.rules import RULES

# Rule pages live in the package (klaudit/rules/KLxxx.md); the URL is that file in the repository.
RULE_URL = "https://github.com/klaudit/klaudit/blob/main/klaudit/rules/{code}.md"


def rule_url(code: str) -> str:
    return RULE_URL.format(code=code)


def severity(code: str) -> str:
    """"info" for the informational codes (they never fail a run), "error" for the verdicts."""
    return "info" if code in INFORMATIONAL_CODES else "error"


def rule_page(code: str) -> str:
    """The rule's page shipped in the package (klaudit.rules)."""
    return RULES[code].page
