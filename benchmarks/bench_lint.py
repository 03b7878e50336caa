"""Speed of `klaudit lint` against a bare LibCST parse of the same files, in the same run.

For verl, trl and openrlhf (pinned in real_packages.py) and for all three together:
  (a) `libcst.parse_module` of every .py file, sequential on one core, sources already in memory;
  (b) `klaudit lint` as a user runs it: a fresh `python -m klaudit lint` process with its default
      workers, wall time including interpreter start-up, with klaudit's modules compiled to bytecode
      once (as `pip install` leaves them; an editable checkout under PYTHONDONTWRITEBYTECODE=1 would
      otherwise compile every module at every run: about 0.1 s): bytecode goes to a cache of the
      benchmark's own (PYTHONPYCACHEPREFIX), and the best of --repeat runs is kept, the two
      timed in turn.
Prints lines/second for both, the ratio (b)/(a) (target <= 1.0), how many files the pre-filter
sent to analysis, and the wall time on a repository of 100 files drawn from the three (target <= 3 s).

    python benchmarks/bench_lint.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import libcst

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bytecode import user_environment  # noqa: E402
from real_packages import PACKAGES, package_trees  # noqa: E402

from klaudit.lint.roles import might_contain_kl  # noqa: E402


def python_sources(tree: Path) -> dict[Path, str]:
    """Every .py file under `tree` that decodes as UTF-8."""
    sources = {}
    for path in sorted(tree.rglob("*.py")):
        try:
            sources[path] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return sources


def bare_parse_seconds(sources: dict[Path, str]) -> float:
    start = time.perf_counter()
    for text in sources.values():
        try:
            libcst.parse_module(text)
        except libcst.ParserSyntaxError:
            pass
    return time.perf_counter() - start


def klaudit_seconds(tree: Path, environment: dict[str, str]) -> float:
    start = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "klaudit", "lint", "--exit-zero", "--quiet", str(tree)],
                               capture_output=True, text=True, env=environment)
    elapsed = time.perf_counter() - start
    if completed.returncode not in (0, 2) or "internal error" not in completed.stderr and completed.returncode:
        raise SystemExit(f"klaudit lint failed on {tree}:\n{completed.stderr}")
    for line in completed.stderr.splitlines():  # internal errors in single files: timed anyway
        print(f"  ({line})", file=sys.stderr)
    return elapsed


def best_of_alternated(repeat: int, baseline, measure) -> tuple[float, float]:
    """The best of `repeat` timings of `baseline` and of `measure`, taken in turn: on a shared machine
    whose speed drifts over minutes, both then see the same spells of slowness."""
    timings = [(baseline(), measure()) for _ in range(repeat)]
    return min(t for t, _ in timings), min(t for _, t in timings)


def sample_repository(sources: dict[Path, str], root: Path, count: int, into: Path) -> Path:
    """A scratch repository of `count` files drawn at random (seeded), paths relative to `root` kept."""
    for path in random.Random(0).sample(sorted(sources), count):
        target = into / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="best of N timings (default 3)")
    args = parser.parse_args()

    trees = package_trees()
    bytecode_cache = tempfile.TemporaryDirectory(prefix="klaudit-bench-bytecode-")
    environment = user_environment(bytecode_cache.name)
    klaudit_seconds(trees["openrlhf"], environment)  # compiles klaudit's modules once, untimed
    load_before = os.getloadavg()[0]
    rows = [(f"{name}-{PACKAGES[name]}", tree) for name, tree in trees.items()]
    root = next(iter(trees.values())).parent
    rows.append(("all three", root))
    header = (f"{'tree':<18}{'files':>7}{'analysed':>10}{'lines':>9}"
              f"{'parse s':>9}{'parse l/s':>11}{'klaudit s':>11}{'klaudit l/s':>13}{'ratio':>7}")
    print(header)
    print("-" * len(header))
    everything: dict[Path, str] = {}
    for label, tree in rows:
        sources = python_sources(tree)
        everything.update(sources)
        lines = sum(text.count("\n") + 1 for text in sources.values())
        analysed = sum(might_contain_kl(text) for text in sources.values())
        parse, lint = best_of_alternated(args.repeat, lambda sources=sources: bare_parse_seconds(sources),
                                         lambda tree=tree: klaudit_seconds(tree, environment))
        print(f"{label:<18}{len(sources):>7}{analysed:>10}{lines:>9}{parse:>9.2f}{lines / parse:>11,.0f}"
              f"{lint:>11.2f}{lines / lint:>13,.0f}{lint / parse:>7.2f}")

    with tempfile.TemporaryDirectory() as scratch:
        repository = sample_repository(everything, root, 100, Path(scratch))
        sample = python_sources(repository)
        lines = sum(text.count("\n") + 1 for text in sample.values())
        parse, lint = best_of_alternated(args.repeat, lambda: bare_parse_seconds(sample),
                                         lambda: klaudit_seconds(repository, environment))
        print(f"\n100 files drawn from the three ({lines:,} lines, "
              f"{sum(might_contain_kl(text) for text in sample.values())} analysed): "
              f"klaudit lint {lint:.2f} s (target <= 3 s), bare parse {parse:.2f} s, ratio {lint / parse:.2f}")
    print(f"python {sys.version.split()[0]}, libcst {version('libcst')}, "
          f"load average before/after {load_before:.1f}/{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    bytecode_cache.cleanup()


if __name__ == "__main__":
    main()
