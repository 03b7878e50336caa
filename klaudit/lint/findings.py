"""A finding: one rule violated at one place, as every output format reports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from klaudit.lint.edits import Fix

if TYPE_CHECKING:
    from klaudit.lint.facts import Labels


@dataclass(frozen=True, order=True)
class Finding:
    """A rule violation. Lines and columns are 1-based, as ruff and flake8 print them.

    `line`/`column` point where the KL estimate enters the loss or reward; `end_line` and
    `end_column` close that expression. `origin_line` names the line where the estimator is
    computed when that is elsewhere (None otherwise). `fix` is the replacement the catalog
    recommends, written as a call of `klaudit.estimators`. `related` lists the other places of the
    finding as (path, line, column, what), e.g. where the estimator is computed. `autofix` is the
    mechanical rewrite `--fix` applies, when one can be built from what the analysis inferred;
    otherwise `no_autofix` says why there is none. `framework`: for a finding on a framework's flags (a launch
    script, a config), the framework and release they were judged for, as the message names them; empty for a
    finding on the KL code itself.
    """

    path: str
    line: int
    column: int
    code: str
    message: str
    end_line: int
    end_column: int
    fix: str = ""
    origin_line: int | None = None
    related: tuple[tuple[str, int, int, str], ...] = ()  # (path, line, column, what is there)
    switches: tuple[Labels, ...] = field(default=(), compare=False)  # the switch values of each verdict merged here
    autofix: Fix | None = field(default=None, compare=False)
    no_autofix: str = field(default="", compare=False)
    framework: str = field(default="", compare=False)
