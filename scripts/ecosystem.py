"""Ecosystem check: lint the development corpus and compare with the hand review.

Each repository of tests/ecosystem/repos.json is expected as a source tree at
<root>/<owner+name>. The tree is linted (`klaudit lint --output-format json`, one subprocess
per repository, with a time limit) and each finding is compared with the reviewed KL sites of
tests/ecosystem/expected/<owner+name>.json (format: tests/ecosystem/README.md).

A finding and a reviewed site match when file and code agree and the lines differ by at most
--line-tolerance. Findings with the same (file, code, line) count once: a switch with three
biased values gives three findings but is one reviewed site.

    found & site tp   -> true positive          site tp, not found      -> LOST (a regression)
    found & site miss -> true positive (a miss that is now found; mark the site tp)
    found & site fp   -> false positive         site fp, not found      -> fixed false positive
    found & site ok   -> NEW false positive     site miss, not found    -> miss
    found, no site    -> UNREVIEWED             site ok, not found      -> ok (rightly silent)

Recall = true positives / (true positives + misses + lost); precision = true positives /
(true positives + false positives), over reviewed findings. The exit status is 1 when a
finding is unreviewed, a correct site is reported, or a true finding is lost, so the check
can gate CI; 2 when a tree is missing or its lint fails.

    python scripts/ecosystem.py --root /work/corpus [--repo verl] [--json] [--findings DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
ECOSYSTEM = PROJECT / "tests" / "ecosystem"
VERDICTS = ("tp", "fp", "miss", "ok")
# Codes about a file, not a KL site (a syntax error, an analysis cut short): listed apart, never scored.
FILE_LEVEL_CODES = ("KL000", "KL099")
# A finding on a framework flag (klaudit.frameworks) names the framework and its version in brackets
# (EasyR1's config, slime's or its fork miles's command line and ROLL's config, whose releases klaudit does not tell
# apart, and TRL's and trlx's PPOConfig, whose keywords name the API: the name alone);
# flag sites are scored apart from KL code sites ("kind": "flag" in the review).
# The parenthesis after the version says where it was read, and may hold one more (a git pin's advice).
FLAG_MESSAGE = re.compile(r"\[(?:(?:verl|trl|openrlhf|tunix|NeMo-RL|easydel) [\d.]+(?: \((?:[^()]|\([^()]*\))*\))?"
                          r"|NeMo-RL \((?:[^()]|\([^()]*\))*\)|EasyR1|TRL PPO|trlx PPO|slime|miles|ROLL|ms-swift): ")
# Outcome of a compared item -> (counter it adds to, whether it fails the check).
OUTCOMES = {
    "tp": ("tp", False),
    "now_found": ("tp", False),
    "fp": ("fp", False),
    "new_fp": ("fp", True),
    "unreviewed": ("unreviewed", True),
    "lost": ("lost", True),
    "miss": ("miss", False),
    "fixed_fp": ("fixed_fp", False),
    "ok": ("ok", False),
}


@dataclass(frozen=True)
class Finding:
    """One reported (file, code, line), file relative to the tree root."""

    file: str
    code: str
    line: int
    message: str = ""


@dataclass(frozen=True)
class Site:
    """One reviewed KL site: the code that should (tp, miss) or should not (fp, ok) be reported."""

    file: str
    code: str
    line: int
    verdict: str
    reason: str = ""
    kind: str = "code"  # "flag": a framework flag in a launch script, YAML file or config call


@dataclass
class Item:
    outcome: str
    file: str
    code: str
    line: int
    text: str


@dataclass
class RepoResult:
    repo: str
    seconds: float | None = None
    error: str | None = None
    items: list[Item] = field(default_factory=list)
    flag_items: list[Item] = field(default_factory=list)
    file_level: list[Finding] = field(default_factory=list)

    def counts(self, code: str | None = None, flags: bool = False) -> Counter:
        counter: Counter = Counter()
        for item in self.flag_items if flags else self.items:
            if code is None or item.code == code:
                counter[OUTCOMES[item.outcome][0]] += 1
        return counter

    @property
    def failed(self) -> bool:
        return self.error is not None or any(OUTCOMES[item.outcome][1] for item in self.items + self.flag_items)


def load_sites(path: Path) -> list[Site]:
    """Reviewed sites of one repository; a missing file means nothing reviewed yet."""
    if not path.exists():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    sites = [Site(s["file"], s["code"], int(s["line"]), s["verdict"], s.get("reason", ""), s.get("kind", "code"))
             for s in data["sites"]]
    for site in sites:
        if site.verdict not in VERDICTS:
            raise ValueError(f"{path}: {site.file}:{site.line}: verdict {site.verdict!r} not in {VERDICTS}")
    return sites


def parse_findings(records: list[dict], tree: Path) -> list[Finding]:
    """Findings of a ruff-style JSON report, one per (file, code, line), files relative to `tree`."""
    seen: dict[tuple[str, str, int], Finding] = {}
    for record in records:
        name = record["filename"]
        path = Path(name) if os.path.isabs(name) else tree / name
        try:
            rel = path.resolve().relative_to(tree.resolve()).as_posix()
        except ValueError:
            rel = Path(name).as_posix()
        key = (rel, record["code"], int(record["location"]["row"]))
        seen.setdefault(key, Finding(*key, record.get("message", "")))
    return sorted(seen.values(), key=lambda f: (f.file, f.line, f.code))


def compare(findings: list[Finding], sites: list[Site], tolerance: int) -> list[Item]:
    """Match findings to reviewed sites (same file and code, nearest line within `tolerance`)."""
    items: list[Item] = []
    matched: set[int] = set()
    for finding in findings:
        candidates = [
            (abs(site.line - finding.line), index)
            for index, site in enumerate(sites)
            if site.file == finding.file and site.code == finding.code and abs(site.line - finding.line) <= tolerance
        ]
        if not candidates:
            items.append(Item("unreviewed", finding.file, finding.code, finding.line, finding.message))
            continue
        index = min(candidates)[1]
        matched.add(index)
        site = sites[index]
        outcome = {"tp": "tp", "miss": "now_found", "fp": "fp", "ok": "new_fp"}[site.verdict]
        items.append(Item(outcome, finding.file, finding.code, finding.line, site.reason))
    for index, site in enumerate(sites):
        if index in matched:
            continue
        outcome = {"tp": "lost", "miss": "miss", "fp": "fixed_fp", "ok": "ok"}[site.verdict]
        items.append(Item(outcome, site.file, site.code, site.line, site.reason))
    return items


def run_lint(tree: Path, timeout: float, select: str | None) -> list[dict]:
    """`klaudit lint --output-format json` on one tree, in a subprocess with a time limit."""
    tree = tree.resolve()
    command = [sys.executable, "-m", "klaudit", "lint", "--output-format", "json", "--exit-zero", str(tree)]
    if select:
        command[4:4] = ["--select", select]
    # The caller's PYTHONPATH comes first, so another checkout's klaudit can be measured; else this one's.
    # `python -m` puts its working directory before PYTHONPATH: run in the tree (and, from Python 3.11,
    # with PYTHONSAFEPATH), or a caller inside a checkout would measure that checkout instead.
    env = dict(os.environ, PYTHONSAFEPATH="1",
               PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(PROJECT)])))
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=tree, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"klaudit lint exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout or "[]")


def check_repo(entry: dict, args: argparse.Namespace) -> RepoResult:
    name = entry["dir"]
    result = RepoResult(name)
    tree = Path(args.root) / name
    sites = load_sites(Path(args.expected) / f"{name}.json")
    try:
        if args.findings:
            records = json.loads((Path(args.findings) / f"{name}.json").read_text(encoding="utf-8"))
            stderr = Path(args.findings) / f"{name}.err"  # the lint's stderr, where it was saved beside the report
            failed = [line for line in (stderr.read_text(encoding="utf-8").splitlines() if stderr.is_file() else ())
                      if "internal error" in line]
            if failed:  # a file the lint could not analyse: the report is short of its findings, as in a live run
                raise RuntimeError(f"{len(failed)} internal error(s) in {stderr.name}: {failed[0][-300:]}")
        else:
            if not tree.is_dir():
                raise FileNotFoundError(f"no tree at {tree}")
            start = time.perf_counter()
            records = run_lint(tree, args.timeout, args.select)
            result.seconds = round(time.perf_counter() - start, 1)
    except (OSError, ValueError, RuntimeError, subprocess.TimeoutExpired) as error:
        result.error = f"{type(error).__name__}: {error}"
        return result
    findings = parse_findings(records, tree)
    result.file_level = [f for f in findings if f.code in FILE_LEVEL_CODES]
    kl_findings = [f for f in findings if f.code not in FILE_LEVEL_CODES]
    flags = [f for f in kl_findings if FLAG_MESSAGE.search(f.message)]
    result.items = compare([f for f in kl_findings if f not in flags], [s for s in sites if s.kind == "code"],
                           args.line_tolerance)
    result.flag_items = compare(flags, [s for s in sites if s.kind == "flag"], args.line_tolerance)
    return result


def ratio(numerator: int, denominator: int) -> float | None:
    return round(numerator / denominator, 3) if denominator else None


def summary(counts: Counter) -> dict:
    found = counts["tp"]
    return {
        **{key: counts[key] for key in ("tp", "fp", "miss", "ok", "lost", "unreviewed", "fixed_fp")},
        "recall": ratio(found, found + counts["miss"] + counts["lost"]),
        "precision": ratio(found, found + counts["fp"]),
    }


def report(results: list[RepoResult]) -> dict:
    total: Counter = Counter()
    flag_total: Counter = Counter()
    repos = {}
    for result in results:
        codes = sorted({item.code for item in result.items})
        repos[result.repo] = {
            "seconds": result.seconds,
            "error": result.error,
            "total": summary(result.counts()),
            "codes": {code: summary(result.counts(code)) for code in codes},
            "diff": [asdict(item) for item in result.items + result.flag_items
                     if item.outcome not in ("tp", "fp", "miss", "ok")],
            "flags": summary(result.counts(flags=True)),
            "file_level": [asdict(finding) for finding in result.file_level],
        }
        total += result.counts()
        flag_total += result.counts(flags=True)
    by_code: dict[str, Counter] = {}
    for result in results:
        for item in result.items:
            by_code.setdefault(item.code, Counter())[OUTCOMES[item.outcome][0]] += 1
    return {
        "repos": repos,
        "codes": {code: summary(by_code[code]) for code in sorted(by_code)},
        "total": summary(total),
        "flags": summary(flag_total),
        "failed": any(result.failed for result in results),
    }


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_table(table: dict) -> None:
    header = f"{'':<44} {'tp':>4} {'fp':>4} {'miss':>5} {'ok':>4} {'lost':>5} {'new':>4} {'recall':>7} {'prec':>6}"

    def row(label: str, s: dict) -> str:
        return (f"{label:<44} {s['tp']:>4} {s['fp']:>4} {s['miss']:>5} {s['ok']:>4} {s['lost']:>5} {s['unreviewed']:>4}"
                f" {fmt(s['recall']):>7} {fmt(s['precision']):>6}")

    print(header)
    for name, repo in table["repos"].items():
        timing = f" ({repo['seconds']}s)" if repo["seconds"] is not None else ""
        if repo["error"]:
            print(f"{name}{timing}: ERROR {repo['error']}")
            continue
        print(row(name + timing, repo["total"]))
        for code, s in repo["codes"].items():
            print(row("  " + code, s))
    print("-" * len(header))
    for code, s in table["codes"].items():
        print(row("all " + code, s))
    print(row("ALL", table["total"]))
    print(row("framework flags (scored apart)", table["flags"]))
    labels = {"lost": "- lost", "unreviewed": "+ unreviewed", "new_fp": "+ new false positive",
              "now_found": "+ miss now found", "fixed_fp": "- false positive gone"}
    diff = [(name, d) for name, repo in table["repos"].items() for d in repo["diff"]]
    if diff:
        print("\nDiff against the review:")
    for name, d in diff:
        print(f"{labels[d['outcome']]:<22} {name}/{d['file']}:{d['line']}: {d['code']} {d['text'][:150]}")
    file_level = [(name, f) for name, repo in table["repos"].items() for f in repo["file_level"]]
    if file_level:
        print("\nAbout files, not scored:")
    for name, f in file_level:
        print(f"  {name}/{f['file']}:{f['line']}: {f['code']} {f['message'][:150]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.environ.get("KLAUDIT_CORPUS", "/work/corpus"),
                        help="folder holding the trees <owner+name> (default $KLAUDIT_CORPUS or /work/corpus)")
    parser.add_argument("--repos", default=str(ECOSYSTEM / "repos.json"), help="the corpus list")
    parser.add_argument("--expected", default=str(ECOSYSTEM / "expected"), help="folder of reviewed sites")
    parser.add_argument("--repo", action="append", help="only repositories whose name contains this (repeatable)")
    parser.add_argument("--findings", help="read <name>.json lint reports from this folder instead of linting "
                                           "(and <name>.err, the lint's stderr, when saved: an internal error fails)")
    parser.add_argument("--select", help="passed to klaudit lint --select")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds allowed per repository")
    parser.add_argument("--line-tolerance", type=int, default=3, help="max line distance of a match")
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    args = parser.parse_args(argv)

    entries = json.loads(Path(args.repos).read_text(encoding="utf-8"))["repos"]
    if args.repo:
        entries = [e for e in entries if any(part.lower() in e["dir"].lower() for part in args.repo)]
    results = [check_repo(entry, args) for entry in entries]
    table = report(results)
    if args.json:
        print(json.dumps(table, indent=1))
    else:
        print_table(table)
    if any(result.error for result in results):
        return 2
    return 1 if table["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
