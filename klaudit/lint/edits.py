"""Fixes as data: text edits with an applicability and a message, and how they are applied.

A `Fix` is what ruff's JSON calls `fix`: `{"applicability", "message", "edits": [{"content",
"location", "end_location"}]}`. Locations are 1-based (row, column) with columns counted in
characters, the end exclusive; an insertion has `location == end_location`. Applying fixes never
trusts them: each one must leave a file that Python and LibCST parse, or it is dropped and reported.
"""

from __future__ import annotations

import ast
import difflib
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import libcst as cst

SAFE, UNSAFE = "safe", "unsafe"


@dataclass(frozen=True, order=True)
class Edit:
    """Replace the text from (line, column) up to (end_line, end_column) with `content`."""

    line: int
    column: int
    end_line: int
    end_column: int
    content: str

    def to_json(self) -> dict:
        return {"content": self.content, "location": {"row": self.line, "column": self.column},
                "end_location": {"row": self.end_line, "column": self.end_column}}


@dataclass(frozen=True)
class Fix:
    """The edits that fix one finding. `applicability` is "safe" (behaviour kept) or "unsafe" (what
    is optimised changes, as every KL fix does by design)."""

    applicability: str
    message: str
    edits: tuple[Edit, ...]

    def to_json(self) -> dict:
        return {"applicability": self.applicability, "message": self.message,
                "edits": [edit.to_json() for edit in self.edits]}


def line_starts(text: str) -> list[int]:
    """The character offset at which each line of `text` starts (index 0 is line 1): the line of an
    offset is bisect_right(line_starts, offset)."""
    return list(itertools.accumulate([len(line) + 1 for line in text.split("\n")][:-1], initial=0))


def _span(edit: Edit, starts: list[int], size: int) -> tuple[int, int]:
    def offset(line: int, column: int) -> int:
        if line - 1 >= len(starts):
            return size
        return min(starts[line - 1] + column - 1, size)
    return offset(edit.line, edit.column), offset(edit.end_line, edit.end_column)


def apply_edits(text: str, edits: Iterable[Edit]) -> str:
    """`text` with the edits applied (identical edits once); overlapping edits raise ValueError."""
    starts = line_starts(text)
    crlf = "\r\n" in text  # a file with Windows line ends keeps them in the inserted lines
    spans = sorted({(*_span(edit, starts, len(text)),
                     edit.content.replace("\r\n", "\n").replace("\n", "\r\n") if crlf else edit.content)
                    for edit in edits})
    out, position = [], 0
    for start, end, content in spans:
        if start < position:
            raise ValueError("overlapping edits")
        out.append(text[position:start])
        out.append(content)
        position = end
    out.append(text[position:])
    return "".join(out)


def parses(path: str, text: str) -> bool:
    """Whether a fixed file still parses: Python's parser and LibCST for Python, any text otherwise."""
    if not path.endswith((".py", ".pyi")) and path != "-":
        return True
    try:
        ast.parse(text)
        cst.parse_module(text)
    except (SyntaxError, ValueError, cst.ParserSyntaxError, RecursionError):
        return False
    return True


@dataclass
class Applied:
    """The outcome of fixing one file."""

    text: str
    fixed: list  # the findings whose fix was applied
    dropped: list  # (finding, why) whose fix was not applied


def apply_fixes(path: str, text: str, findings: Sequence, allowed: Iterable[str]) -> Applied:
    """Apply the fixes of `findings` (each with `.autofix`) whose applicability is in `allowed`.

    Fixes are taken in the order of the findings; one that overlaps an edit already taken (other
    than the very same edit, e.g. the shared import) is left for a later run, and one after which
    the file no longer parses is dropped; both are reported in `dropped`."""
    allowed = set(allowed)
    taken: list[Edit] = []
    result = Applied(text, [], [])
    for finding in findings:
        fix = finding.autofix
        if fix is None or fix.applicability not in allowed:
            continue
        candidate = taken + [edit for edit in fix.edits if edit not in taken]
        try:
            fixed = apply_edits(text, candidate)
        except ValueError:
            result.dropped.append((finding, "its edits overlap another fix's; run --fix again"))
            continue
        if not parses(path, fixed):
            result.dropped.append((finding, "the fixed code would not parse"))
            continue
        taken = candidate
        result.text = fixed
        result.fixed.append(finding)
    return result


def unified_diff(path: str, before: str, after: str) -> str:
    """The change as `diff -u` prints it, with the path on both sides."""
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 fromfile=f"a/{path}", tofile=f"b/{path}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
