"""Lint a tree file by file and report what a linter must never do: crash, hang, call valid code broken.

Each file is linted on its own (read, pre-filter, Python's syntax check, LibCST parse, analysis, as
`klaudit lint` does) in a pool of worker processes, under a watchdog of --hang seconds. Reported:
- crashes: internal errors of the analysis, and files the watchdog stopped (hangs);
- wrong KL000: a syntax error for a file Python's own parser compiles;
- KL099 notes (parts not analysed) and their reasons;
- time outliers: files whose cost per line is over 10x the median of the analysed files (and > 0.5 s),
  with a bare LibCST parse of the same file for comparison;
- the slowest file, the most work units spent, and the peak memory (max RSS) of the workers.

    nice python scripts/crash_hunt.py /root/.pyenv/versions/3.11.7/lib/python3.11 --jobs 1
    nice python scripts/crash_hunt.py /work/corpus --json /tmp/hunt.json
    nice python scripts/crash_hunt.py /usr/lib/python3.11 .venv/lib/python3.11/site-packages /work/corpus --sample 5000
    nice python scripts/crash_hunt.py --mutants 5000 --mutants-dir /tmp/mutants

With --mutants N, N mutants of trainer code are written first (see `write_mutants`: the fixtures and
programs of the fuzz grammar, each changed at random, in its syntax or in its names and operators)
and linted with the given paths.

For a long fuzz run of the analysis on generated trainer code (the short one runs in the test suite):

    KLAUDIT_FUZZ_EXAMPLES=20000 python -m pytest tests/fuzz -q -p no:cacheprovider
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import re
import resource
import signal
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klaudit.config import INCOMPLETE_CODE, SYNTAX_ERROR_CODE, Settings  # noqa: E402
from klaudit.lint import engine  # noqa: E402
from klaudit.lint.findings import Finding  # noqa: E402
from klaudit.lint.roles import might_contain_kl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUTLIER_FACTOR = 10.0
OUTLIER_MIN_SECONDS = 0.5


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang


def _start(roots: list) -> None:
    signal.signal(signal.SIGALRM, _alarm)
    engine._start_worker([Path(r) for r in roots])
    import klaudit.lint.checks  # noqa: F401 - imported here, not in the first file's time (a fresh worker each 500)


def lint_one(job: tuple) -> dict:
    """Lint one file within `hang` seconds; a record of what happened."""
    path, hang, limits = job
    record = {"path": path, "lines": 0, "seconds": 0.0, "status": "ok", "codes": [], "units": 0, "note": ""}
    start = time.perf_counter()
    signal.alarm(hang)
    try:
        source = engine.read_source(path)
        if isinstance(source, Finding):
            record["codes"] = [source.code]
            return record
        record["lines"] = source.count("\n") + 1
        if might_contain_kl(source):
            analysis = engine._analyse(path, source, limits)
            record["status"] = "analysed"
            record["units"] = analysis.spent
            if analysis.error:
                record["status"], record["note"] = "crash", analysis.error
        else:
            broken = engine.syntax_finding(path, source)
            analysis = engine._Analysis(path, (broken,) if broken else ())
        record["codes"] = [f.code for f in analysis.findings]
        notes = [f.message for f in analysis.findings if f.code in (SYNTAX_ERROR_CODE, INCOMPLETE_CODE)]
        if notes:
            record["note"] = notes[0]
        if SYNTAX_ERROR_CODE in record["codes"] and _python_compiles(source, path):
            record["status"] = "wrong-KL000"
    except _Hang:
        record["status"] = "hang"
    except Exception as error:  # noqa: BLE001 - the harness reports what the engine let through
        record["status"], record["note"] = "crash", f"{type(error).__name__}: {error}"
    finally:
        signal.alarm(0)
        record["seconds"] = time.perf_counter() - start
        record["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return record


def _python_compiles(source: str, path: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes and literals of the mutants: not the harness's to print
            compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def bare_parse_seconds(path: str) -> float:
    import libcst

    source = Path(path).read_text(encoding="utf-8", errors="replace")
    start = time.perf_counter()
    try:
        libcst.parse_module(source)
    except Exception:  # noqa: BLE001
        pass
    return time.perf_counter() - start


def hunt(paths: list, jobs: int, hang: int, limits: engine.Limits, sample: int = 0, seed: int = 0) -> list:
    """The records of the files under `paths`, or of `sample` of them drawn at random (seeded); imports
    resolve within the whole of `paths` either way."""
    settings = Settings(exclude=(), root=Path("/"))
    files = engine.discover_files(paths, settings)
    if 0 < sample < len(files):
        files = sorted(random.Random(seed).sample(files, sample))
    roots = [str(Path(p) if os.path.isdir(p) else Path(p).parent) for p in paths]
    work = [(path, hang, limits) for path in files]
    with multiprocessing.get_context("fork").Pool(jobs, initializer=_start, initargs=(roots,),
                                                  maxtasksperchild=500) as pool:
        return list(pool.imap_unordered(lint_one, work, chunksize=4))


def summary(records: list, compare: int = 3) -> str:
    out = [f"files: {len(records)}  lines: {sum(r['lines'] for r in records)}  "
           f"analysed (KL vocabulary): {sum(r['status'] != 'ok' for r in records)}"]
    for status in ("crash", "hang", "wrong-KL000"):
        bad = [r for r in records if r["status"] == status]
        out.append(f"{status}: {len(bad)}")
        out.extend(f"  {r['path']}: {r['note']}" for r in bad[:20])
    notes = [r for r in records if INCOMPLETE_CODE in r["codes"]]
    out.append(f"KL099 notes: {len(notes)}")
    out.extend(f"  {r['path']}: {r['note']}" for r in notes[:20])
    out.append(f"KL000 (Python's parser rejects the file): {sum(SYNTAX_ERROR_CODE in r['codes'] for r in records)}")
    analysed = [r for r in records if r["status"] != "ok" and r["lines"]]
    if analysed:
        median = statistics.median(r["seconds"] / r["lines"] for r in analysed)
        outliers = sorted((r for r in analysed if r["seconds"] > OUTLIER_MIN_SECONDS
                           and r["seconds"] / r["lines"] > OUTLIER_FACTOR * median),
                          key=lambda r: -r["seconds"])
        out.append(f"median cost per line (analysed files): {median * 1e6:.1f} us; outliers (> {OUTLIER_FACTOR:g}x, "
                   f"> {OUTLIER_MIN_SECONDS} s): {len(outliers)}")
        for r in sorted(analysed, key=lambda r: -r["seconds"])[:compare]:
            bare = bare_parse_seconds(r["path"])
            out.append(f"  {r['path']}: {r['lines']} lines, {r['seconds']:.2f} s "
                       f"({r['seconds'] / r['lines'] * 1e6:.0f} us/line, {r['seconds'] / max(bare, 1e-6):.1f}x a bare "
                       f"LibCST parse of {bare:.2f} s), {r['units']} units"
                       + ("  OUTLIER" if r in outliers else ""))
        out.append(f"most work units: {max(r['units'] for r in analysed)}")
    out.append(f"peak worker memory (max RSS): {max((r['maxrss_mib'] for r in records), default=0):.0f} MiB")
    return "\n".join(out)


# What a mutation puts in: bracket and literal debris, then names and calls of the KL vocabulary.
DEBRIS = ["(", ")", ":", "[", "]", "'", '"', "\\", "\t", " ", "0x", "1_", "\n  ", "f'{", "lambda", ",", "*", "**"]
VOCABULARY = ["logprobs", "ref_logprobs", "old_log_probs", "kl", "mask", "beta", "loss", "rewards", "advantages",
              "log_ratio", "ratio", "torch.exp(kl)", "kl.detach()", "(kl * mask).sum()", "mask.sum(-1)"]
SWAPS = [("+", "-"), ("*", "/"), (".sum(", ".mean("), ("detach()", "clone()"), ("ref", "old"), ("exp", "log")]


def mutate(source: str, rng: random.Random) -> str:
    """`source` changed once, in its syntax (a character deleted or inserted, a line duplicated, cut or
    moved, the text truncated) or in its meaning (a name replaced by one of the KL vocabulary, an
    operator or call swapped for its twin)."""
    lines = source.splitlines(keepends=True) or [""]
    kind = rng.choice(["delete-char", "insert", "truncate", "duplicate-line", "cut-line", "move-line",
                       "rename", "swap"])
    if kind == "delete-char" and source:
        at = rng.randrange(len(source))
        return source[:at] + source[at + 1:]
    if kind == "insert":
        at = rng.randrange(len(source) + 1)
        return source[:at] + rng.choice(DEBRIS) + source[at:]
    if kind == "truncate":
        return source[:rng.randrange(len(source) + 1)]
    if kind == "rename":
        names = list(re.finditer(r"\b[A-Za-z_]\w*\b", source))
        if names:
            match = rng.choice(names)
            return source[:match.start()] + rng.choice(VOCABULARY) + source[match.end():]
    if kind == "swap":
        old, new = rng.choice(SWAPS)
        if rng.random() < 0.5:
            old, new = new, old
        spots = [m.start() for m in re.finditer(re.escape(old), source)]
        if spots:
            at = rng.choice(spots)
            return source[:at] + new + source[at + len(old):]
    at = rng.randrange(len(lines))
    if kind == "duplicate-line":
        return "".join(lines[:at + 1] + lines[at:])
    if kind == "move-line":
        moved = lines.pop(at)
        lines.insert(rng.randrange(len(lines) + 1), moved)
        return "".join(lines)
    return "".join(lines[:at] + lines[at + 1:])


def base_programs(count: int) -> list:
    """The fixtures' sources and `count` programs of the fuzz grammar (tests/fuzz/kl_grammar.py)."""
    sources = [path.read_text(encoding="utf-8") for path in sorted((ROOT / "fixtures").rglob("*.py"))]
    sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
    from hypothesis import HealthCheck, given, settings
    from kl_grammar import programs

    @settings(max_examples=count, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(programs())
    def collect(program):
        sources.append(program[0])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collect()
    return sources


def write_mutants(directory: Path, count: int, seed: int = 0) -> list:
    """Write `count` mutants of trainer code (1 to 3 mutations of a base program each) into
    `directory`, in place of earlier ones; their paths."""
    rng = random.Random(seed)
    bases = base_programs(200)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("mutant_*.py"):
        stale.unlink()
    paths = []
    for index in range(count):
        source = rng.choice(bases)
        for _ in range(rng.randint(1, 3)):
            source = mutate(source, rng)
        path = directory / f"mutant_{index:05d}.py"
        path.write_text(source, encoding="utf-8")
        paths.append(str(path))
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*")
    parser.add_argument("--mutants", type=int, default=0, metavar="N", help="also lint N mutants of trainer code")
    parser.add_argument("--mutants-dir", default="/tmp/klaudit-mutants", help="where the mutants are written")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mutations and of --sample")
    parser.add_argument("--sample", type=int, default=0, metavar="N", help="lint N files drawn at random from the paths")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--hang", type=int, default=120, help="seconds after which a file counts as a hang")
    parser.add_argument("--budget", type=int, default=engine.Limits().units, help="work units per file (0: none)")
    parser.add_argument("--timeout", type=float, default=engine.Limits().seconds, help="seconds per file (0: none)")
    parser.add_argument("--json", help="write every file's record here")
    args = parser.parse_args()
    if args.mutants:
        directory = Path(args.mutants_dir)
        write_mutants(directory, args.mutants, args.seed)
        args.paths.append(str(directory))
    if not args.paths:
        parser.error("give paths to lint, or --mutants N")
    start = time.perf_counter()
    records = hunt(args.paths, args.jobs, args.hang, engine.Limits(args.budget or None, args.timeout or None),
                   args.sample, args.seed)
    print(summary(records))
    print(f"wall time: {time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(sorted(records, key=lambda r: r["path"]), indent=1))
    return 1 if any(r["status"] in ("crash", "hang", "wrong-KL000") for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
