"""How much of a tree `klaudit lint --fix --unsafe-fixes` fixes, and whether every fix holds.

Each tree is copied (its Python sources and the configs the linter reads) to a temporary
directory, linted, fixed in one pass as `--fix --unsafe-fixes` does, and linted again. Per tree:

    findings   the findings of the first lint
    with_fix   those that carry a fix
    applied    the fixes applied (a fix whose edits overlap an earlier one waits for a second run)
    refused    the findings without a fix, counted by the reason they give

and the checks every fix must pass: each changed Python file parses with `ast` and LibCST; after
the fix, no finding of a fixed code is left on the lines the fix rewrote (nor at the fixed
finding's own line), no file has more findings of a code than before less those fixed, and no
file has a code it did not have before. A failed check is printed and makes the exit status 1.

    python scripts/fix_coverage.py /work/corpus/* ~/.cache/klaudit-bench/trees/* [--json] [--diffs DIR]
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import libcst as cst

from klaudit.frameworks import CONFIG_SUFFIXES
from klaudit.lint.engine import PYTHON_SUFFIXES, lint_paths
from klaudit.lint.fixing import applicabilities, fix_findings

COPIED = PYTHON_SUFFIXES + CONFIG_SUFFIXES


def _copy(tree: Path, into: Path) -> None:
    """The files of `tree` the linter reads, at the same relative paths."""
    for path in tree.rglob("*"):
        if path.is_file() and path.name.endswith(COPIED) and ".git" not in path.parts:
            target = into / path.relative_to(tree)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def _shift(edits, line: int) -> int:
    """`line` of the original file in the fixed one: the line count each earlier edit adds."""
    moved = 0
    for edit in edits:
        if edit.end_line < line or (edit.end_line == line and edit.line < line and edit.content.endswith("\n")):
            moved += edit.content.count("\n") - (edit.end_line - edit.line)
    return line + moved


def _rewritten(edits, taken) -> set[int]:
    """The lines of the fixed file that the non-insertion edits of one fix cover."""
    lines: set[int] = set()
    for edit in edits:
        if (edit.line, edit.column) == (edit.end_line, edit.end_column):
            continue  # an insertion (the import)
        start = _shift(taken, edit.line)
        lines.update(range(start, start + edit.content.count("\n") + 1))
    return lines


def measure(tree: Path, scratch: Path, diffs: Path | None) -> dict:
    copy = scratch / tree.name
    _copy(tree, copy)
    before = lint_paths([str(copy)], respect_gitignore=False).findings
    run = fix_findings(before, applicabilities(unsafe=True), write=True)
    problems: list[str] = []
    for path, text in run.texts.items():
        if path.endswith(PYTHON_SUFFIXES):
            try:
                ast.parse(text)
                cst.parse_module(text)
            except (SyntaxError, cst.ParserSyntaxError) as error:
                problems.append(f"{path}: does not re-parse: {error}")
    after = lint_paths([str(copy)], respect_gitignore=False).findings if run.fixed else before
    for path in run.texts:
        fixed = [f for f in run.fixed if f.path == path]
        taken = sorted({edit for f in fixed for edit in f.autofix.edits})
        now = [f for f in after if f.path == path]
        for finding in fixed:
            lines = _rewritten(finding.autofix.edits, taken) | {_shift(taken, finding.line)}
            for left in now:
                if left.code == finding.code and left.line in lines:
                    problems.append(f"{path}:{left.line}: {left.code} is still reported after its fix")
        expected = Counter(f.code for f in before if f.path == path) - Counter(f.code for f in fixed)
        grown = Counter(f.code for f in now) - expected
        for code, count in grown.items():
            problems.append(f"{path}: {count} more {code} after the fixes than before, less those fixed")
        if diffs is not None:
            target = diffs / tree.name / (Path(path).relative_to(copy).as_posix() + ".diff")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(next(d for d in run.diffs if d.startswith(f"--- a/{path}\n")))
    refused = Counter(f.no_autofix or "(no reason given)" for f in before if f.autofix is None)
    outcomes = [f"{Path(f.path).relative_to(copy).as_posix()}:{f.line} {f.code}: "
                + (f"refused: {f.no_autofix}" if f.autofix is None else
                   f"fixed: {f.autofix.message}" if f in run.fixed else "fix not applied") for f in before]
    return {"tree": tree.name, "findings": len(before), "with_fix": sum(f.autofix is not None for f in before),
            "applied": len(run.fixed), "not_applied": [f"{f.path}:{f.line} {f.code}: {why}" for f, why in run.dropped],
            "files_changed": len(run.texts), "refused": dict(refused.most_common()), "problems": problems,
            "outcomes": outcomes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--json", action="store_true", help="one JSON object per tree instead of the table")
    parser.add_argument("--diffs", type=Path, help="write each changed file's diff under this directory")
    parser.add_argument("--list", action="store_true", help="also print every finding with its fix or refusal")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fix-coverage-") as scratch:
        for tree in args.trees:
            if not tree.is_dir():
                print(f"error: {tree} is not a directory", file=sys.stderr)
                return 2
            row = measure(tree.resolve(), Path(scratch), args.diffs)
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    if not args.json:
        _table(rows)
    if args.list and not args.json:
        for row in rows:
            for line in row["outcomes"]:
                print(f"{row['tree']}/{line}")
    return 1 if any(row["problems"] for row in rows) else 0


def _table(rows: list[dict]) -> None:
    print(f"{'tree':40} {'findings':>8} {'with fix':>8} {'applied':>8} {'files':>6} {'problems':>8}")
    for row in rows + [_total(rows)]:
        print(f"{row['tree']:40} {row['findings']:8} {row['with_fix']:8} {row['applied']:8} "
              f"{row['files_changed']:6} {len(row['problems']):8}")
    for row in rows:
        for line in row["not_applied"]:
            print(f"  not applied: {line}")
        for line in row["problems"]:
            print(f"  PROBLEM: {line}")
    print("\nrefused, by reason:")
    for reason, count in sum((Counter(row["refused"]) for row in rows), Counter()).most_common():
        print(f"{count:6}  {reason}")


def _total(rows: list[dict]) -> dict:
    total = {"tree": "total", "findings": 0, "with_fix": 0, "applied": 0, "files_changed": 0, "problems": []}
    for row in rows:
        for key in ("findings", "with_fix", "applied", "files_changed"):
            total[key] += row[key]
        total["problems"] = total["problems"] + row["problems"]
    return total


if __name__ == "__main__":
    sys.exit(main())
