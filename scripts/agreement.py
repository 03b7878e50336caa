"""Agreement of `klaudit lint` and `klaudit check-grad` on the released trainer packages, or on any checkout.

For each tree (verl, trl, openrlhf as released, unpacked by benchmarks/real_packages.py; the
frameworks are never installed, check-grad stubs what they import), the lint's JSON findings are
the list of KL sites. Each site's KL code is audited by check-grad (klaudit.audit.agreement): the
helper the step calls, or the inline statements cut out of the step, at the switch values and in the
placement the lint reads. A site agrees when check-grad's rows carry exactly the lint's rules for the
part check-grad runs (estimator, placement, sign, clamp); the rules the surrounding code decides
(KL007 aggregation, KL008 stale samples) are listed apart. Every finding is accounted for: a finding
no lint record of the file explains is printed as not audited;
a finding on a framework's flags (JSON `framework`) judges the framework's KL code, and one in a notebook
is not code check-grad imports: both are counted apart.

    python scripts/agreement.py [--trees DIR] [--only verl] [--json OUT]
    python scripts/agreement.py --tree PATH [--tree PATH ...]   # any checkout, e.g. a corpus repository

Exit status 0 when every finding is audited and agrees, 1 otherwise, 2 when a tree is missing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from benchmarks.real_packages import CACHE, PACKAGES  # noqa: E402
from klaudit.audit.agreement import Verdict, compare, shown  # noqa: E402
from klaudit.audit.bind import Role  # noqa: E402
from klaudit.audit.confine import memory_limit_bytes  # noqa: E402
from klaudit.audit.report import Report  # noqa: E402
from klaudit.audit.runner import Target, run_isolated  # noqa: E402
from klaudit.progress import Progress  # noqa: E402

SITE_CODES = "KL0"  # the KL rules; KL000 (syntax) and KL099 (analysis cut short) are about files
FILE_LEVEL = ("KL000", "KL099")


def lint(tree: Path) -> tuple[list[dict], list[dict]]:
    """The lint's findings on `tree` (its JSON output) at KL sites of its code, and those on a framework's flags
    (a launch, a config: the KL code they judge is the framework's, which the released-package run audits)."""
    done = subprocess.run([sys.executable, "-m", "klaudit", "lint", "--output-format", "json", "--select",
                           SITE_CODES, "--exit-zero", "."], cwd=tree, capture_output=True, text=True, check=True)
    findings = [finding for finding in json.loads(done.stdout) if finding["code"] not in FILE_LEVEL]
    return ([finding for finding in findings if not finding.get("framework")],
            [finding for finding in findings if finding.get("framework")])


def in_notebook(finding: dict) -> bool:
    """A finding in a Jupyter notebook: check-grad imports Python files, not notebooks (whose cells train at the
    top level), so it is counted apart."""
    return finding["filename"].endswith(".ipynb")


class Timed:
    """check-grad in a child process per target, as the CLI runs it, with the seconds each took."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, target: Target, placements: Sequence[str], roles: Mapping[str, str]) -> Report:
        start = time.monotonic()
        overrides = {name: Role(role) for name, role in roles.items()}
        report = run_isolated(target, overrides=overrides, placements=placements, timeout=300,
                              memory_limit=memory_limit_bytes(None), model_dir=None, device="cpu",
                              progress=Progress(False))
        self.seconds[str(target)] = time.monotonic() - start
        return report


def audit_tree(name: str, tree: Path) -> dict:
    """The lint's sites of one tree, each with its verdicts, and the findings nothing explains."""
    started = time.monotonic()
    findings, flags = lint(tree)
    lint_seconds = time.monotonic() - started
    timed = Timed()
    verdicts: list[Verdict] = []
    notebooks = [finding for finding in findings if in_notebook(finding)]
    findings = [finding for finding in findings if not in_notebook(finding)]
    for file in sorted({finding["filename"] for finding in findings}):
        verdicts += compare(file, timed)
    unexplained = [f for f in findings if not any(
        Path(v.site.path) == Path(f["filename"]).resolve() and v.site.line == f["location"]["row"]
        and f["code"] in v.lint_rules for v in verdicts)]
    return {"name": name, "tree": str(tree), "findings": findings, "flags": flags, "notebooks": notebooks, "verdicts": verdicts,
            "unexplained": unexplained, "lint_seconds": lint_seconds, "audit_seconds": timed.seconds}


def table(result: dict) -> list[dict]:
    """One row per lint site and check-grad outcome: the branches that agree or disagree alike are one."""
    tree = result["tree"]
    rows: dict[tuple, dict] = {}
    for verdict in result["verdicts"]:
        site = verdict.site
        key = (site.path, site.line, verdict.target, site.placement, verdict.lint_rules, verdict.check_grad_rules,
               verdict.objectives, verdict.agree, verdict.audited, verdict.reason)
        row = rows.setdefault(key, {
            "site": f"{shown(site.path, tree)}:{site.line}", "placement": site.placement,
            "lint": "+".join(verdict.lint_rules) or "-", "audited_rules": "+".join(verdict.audited_rules) or "-",
            "caller": "+".join(verdict.caller_rules) or "-", "target": shown(verdict.target, tree),
            "modes": [], "objective": "/".join(verdict.objectives) or "-",
            "check_grad": "+".join(verdict.check_grad_rules) or "-", "agree": verdict.agree,
            "audited": verdict.audited, "reason": verdict.reason})
        row["modes"] += [mode for mode in verdict.modes if mode not in row["modes"]]
    # a term judged in several functions of the step (a sink reached through a caller too) is audited once
    audited_sites = {(row["site"], row["lint"]) for row in rows.values() if row["audited"]}
    rows = {key: row for key, row in rows.items() if row["audited"] or (row["site"], row["lint"]) not in audited_sites}
    findings_at: dict[str, set[str]] = {}
    for finding in result["findings"]:
        findings_at.setdefault(f"{shown(finding['filename'], tree)}:{finding['location']['row']}", set()).add(
            finding["code"])
    for row in rows.values():
        row["reported"] = "+".join(sorted(findings_at.get(row["site"], ())))
    return sorted(rows.values(), key=lambda row: (row["site"], row["lint"], row["modes"]))


def print_result(result: dict) -> None:
    rows = table(result)
    reported = {f"{shown(f['filename'], result['tree'])}:{f['location']['row']}" for f in result["findings"]}
    print(f"## {result['name']}: {len(result['findings'])} findings at {len(reported)} sites "
          f"(lint {result['lint_seconds']:.1f} s)")
    print("| site | lint codes there | branch (check-grad modes) | placement | lint, audited part | "
          "lint, caller side | check-grad target | objective | check-grad rule | agree |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if not row["audited"]:
            agree = f"not audited: {row['reason']}"
        elif not row["agree"]:
            agree = f"no: {row['reason']}"
        else:
            agree = "yes"
        modes = "; ".join(row["modes"][:6]) + (f"; +{len(row['modes']) - 6}" if len(row["modes"]) > 6 else "")
        print(f"| {row['site']} | {row['reported']} | {modes} | {row['placement']} | {row['audited_rules']} | "
              f"{row['caller']} | {row['target']} | {row['objective']} | {row['check_grad']} | {agree} |")
    for finding in result["unexplained"]:
        print(f"| {shown(finding['filename'], result['tree'])}:{finding['location']['row']} | {finding['code']} "
              f"| - | - | - | - | - | - | - | no: no lint record of the file explains this finding |")
    print()
    print("check-grad seconds per target: " + ", ".join(
        f"{shown(target, result['tree'])} {seconds:.1f}" for target, seconds in result["audit_seconds"].items()))
    audited = [row for row in rows if row["audited"]]
    agree = sum(row["agree"] for row in audited)
    sites_audited = {row["site"] for row in audited}
    print(f"sites reported: {len(reported)}, audited: {len(sites_audited & reported)}; table rows: {len(rows)}, "
          f"audited {len(audited)}: agree {agree}, disagree {len(audited) - agree}; not audited {len(rows) - len(audited)}; "
          f"findings no lint record explains: {len(result['unexplained'])}")
    if result["notebooks"]:
        print(f"findings in notebooks, which check-grad does not import: {len(result['notebooks'])}")
    if result["flags"]:
        frameworks = sorted({finding["framework"].split(" (")[0] for finding in result["flags"]})
        print(f"findings on framework flags, whose KL code is the framework's: {len(result['flags'])} "
              f"({', '.join(frameworks)})")
    print()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=Path, default=CACHE / "trees", help="unpacked <name>-<version> trees")
    parser.add_argument("--only", choices=sorted(PACKAGES), action="append", help="this package only")
    parser.add_argument("--tree", type=Path, action="append", help="any source tree instead (a project's checkout)")
    parser.add_argument("--json", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    named = [(str(tree), tree) for tree in args.tree or ()] or [
        (f"{name} {PACKAGES[name]}", args.trees / f"{name}-{PACKAGES[name]}") for name in args.only or sorted(PACKAGES)]
    results = []
    for name, tree in named:
        if not tree.is_dir():
            hint = "" if args.tree else " (python -c 'import benchmarks.real_packages as r; r.fetch_all()')"
            print(f"{tree}: missing{hint}", file=sys.stderr)
            return 2
        result = audit_tree(name, tree)
        print_result(result)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps([{"name": r["name"], "rows": table(r), "seconds": r["audit_seconds"]}
                                         for r in results], indent=2))
    ok = all(not r["unexplained"] and all(v.agree for v in r["verdicts"] if v.audited) for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
