"""The lint rules, one home each: the page `klaudit/rules/<CODE>.md`.

A page opens with `# <CODE> <kebab-case-name>`, a blank line and the one-line summary; then come
What it flags, Why, the Bad and Good examples (which run as tests), Fix, Fix safety and When this
is fine. The registry below is read from those headers, so a rule's code, name and summary are
written once. Which configurations a rule judges is data of the catalog (`klaudit.catalog.CATALOG`,
each row names its rule); `KL0xx` codes are verdicts, KL000/KL099 are about files and `KL1xx` are
informational.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

_TITLE = re.compile(r"^# (KL\d{3}) ([a-z0-9]+(?:-[a-z0-9]+)*)$")


@dataclass(frozen=True)
class Rule:
    """A lint rule: a stable code, a kebab-case name and a one-line summary, from its page."""

    code: str
    name: str
    summary: str

    @property
    def page(self) -> str:
        """The whole page, as `klaudit rule CODE` prints it."""
        return _page_text(self.code)


def _page_text(code: str) -> str:
    return resources.files(__name__).joinpath(f"{code}.md").read_text(encoding="utf-8")


def parse_header(code: str, text: str) -> Rule:
    """The rule a page declares; ValueError when its first lines are not `# CODE name`, blank, summary."""
    lines = text.splitlines()
    title = _TITLE.match(lines[0]) if lines else None
    if title is None or title.group(1) != code or len(lines) < 3 or lines[1] or not lines[2].strip():
        raise ValueError(f"klaudit/rules/{code}.md must open with '# {code} <kebab-case-name>', a blank line "
                         f"and a one-line summary")
    return Rule(code, title.group(2), lines[2].strip())


def _load() -> dict[str, Rule]:
    pages = sorted(entry.name for entry in resources.files(__name__).iterdir()
                   if re.fullmatch(r"KL\d{3}\.md", entry.name))
    return {name[:-3]: parse_header(name[:-3], _page_text(name[:-3])) for name in pages}


RULES: Mapping[str, Rule] = _load()
