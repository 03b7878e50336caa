"""Lint the published verl, trl and openrlhf packages and print the findings grouped by rule.

The packages are the pinned wheels of benchmarks/real_packages.py (downloaded once, cached).
Each finding is printed with its source line (and the estimator's line when it is elsewhere),
so that every one can be judged true or false positive by reading it.

    python scripts/lint_real_code.py [--select KL002,...]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from real_packages import package_trees  # noqa: E402

from klaudit.config import Settings  # noqa: E402
from klaudit.lint.engine import lint_paths  # noqa: E402
from klaudit.rules import RULES  # noqa: E402


def source_line(path: str, line: int) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines = handle.read().splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--select", default="ALL", help="comma-separated codes or prefixes (default ALL)")
    args = parser.parse_args()

    trees = package_trees()
    os.chdir(next(iter(trees.values())).parent)
    settings = Settings(root=Path.cwd()).with_overrides(select=args.select.split(","))
    result = lint_paths([tree.name for tree in trees.values()], settings=settings)

    by_code = defaultdict(list)
    for finding in result.findings:
        by_code[finding.code].append(finding)
    for code in sorted(by_code):
        findings = by_code[code]
        print(f"=== {code} {RULES[code].name}: {len(findings)} finding(s)")
        for finding in findings:
            print(f"{finding.path}:{finding.line}:{finding.column}: {finding.message}")
            print(f"    {finding.line:>5} | {source_line(finding.path, finding.line)}")
            if finding.origin_line and finding.origin_line != finding.line:
                print(f"    {finding.origin_line:>5} | {source_line(finding.path, finding.origin_line)}"
                      "   (estimator)")
        print()
    for message in result.warnings + result.errors:
        print(message, file=sys.stderr)
    print(f"{len(result.findings)} finding(s); {result.files_checked} files read, "
          f"{result.files_analysed} analysed after the pre-filter, {len(result.errors)} internal error(s).")


if __name__ == "__main__":
    main()
