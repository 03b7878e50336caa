"""`klaudit lint --fix` and `--diff`: the findings' fixes applied to the files they were found in.

Files are read as bytes and written back in their own encoding and line endings; a file that
changed since it was linted is left alone (its fixes point at text that is no longer there).
"""

from __future__ import annotations

import io
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from klaudit.lint.edits import SAFE, UNSAFE, Applied, apply_fixes, unified_diff
from klaudit.lint.findings import Finding
from klaudit.lint.sources import decode_source


def applicabilities(unsafe: bool) -> frozenset[str]:
    return frozenset({SAFE, UNSAFE} if unsafe else {SAFE})


@dataclass
class FixRun:
    fixed: list = field(default_factory=list)  # findings whose fix was applied (or would be, with --diff)
    dropped: list = field(default_factory=list)  # (finding, why)
    diffs: list = field(default_factory=list)  # unified diffs, one per changed file
    texts: dict = field(default_factory=dict)  # path -> fixed text (the files that changed)


def _decoded(path: str, data: bytes) -> tuple[str, str] | None:
    """(text, encoding) of a file as Python (or, for configs, UTF-8) reads it; None if it does not decode."""
    if path.endswith((".py", ".pyi")):
        text = decode_source(path, data)
        if not isinstance(text, str):
            return None
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError:
            return None
        return text, encoding
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return None


def fix_findings(findings: Sequence[Finding], allowed: Iterable[str], *, write: bool,
                 sources: dict[str, bytes] | None = None) -> FixRun:
    """Apply the allowed fixes of `findings`, file by file; with `write`, save the files. `sources`
    holds the bytes of files that are not on disk (stdin), by reported path: their fixed text is
    returned in `texts`, never written."""
    run = FixRun()
    by_path: dict[str, list[Finding]] = {}
    for finding in findings:
        if finding.autofix is not None and finding.autofix.applicability in allowed:
            by_path.setdefault(finding.path, []).append(finding)
    for path, fixable in by_path.items():
        in_memory = (sources or {}).get(path)
        try:
            data = in_memory if in_memory is not None else open(path, "rb").read()
        except OSError as error:
            run.dropped.extend((finding, f"cannot read the file: {error.strerror}") for finding in fixable)
            continue
        decoded = _decoded(path, data)
        if decoded is None:
            run.dropped.extend((finding, "the file does not decode") for finding in fixable)
            continue
        text, encoding = decoded
        applied: Applied = apply_fixes(path, text, fixable, allowed)
        run.fixed.extend(applied.fixed)
        run.dropped.extend(applied.dropped)
        if applied.text == text:
            continue
        run.texts[path] = applied.text
        run.diffs.append(unified_diff(path, text, applied.text))
        if write and in_memory is None:
            with open(path, "w", encoding=encoding, newline="") as handle:
                handle.write(applied.text)
    return run
