"""Write the table of a framework's git commits and the version each one states, for the lint.

A project may depend on a framework at a git commit (`trl @ git+https://github.com/huggingface/trl.git@1bca495`).
The commit names no release, but the version file at that commit does (`0.18.0.dev0`: the state
between 0.17 and 0.18). klaudit reads that version from `klaudit/frameworks/commits/<name>.txt`, written
by this script from a clone of the framework's repository (every commit reachable from its HEAD):

    python scripts/framework_commits.py trl /path/to/trl/.git > klaudit/frameworks/commits/trl.txt

Each line of the table is a version followed by the first 10 hex digits of the commits that state it.
Only the commits of the releases klaudit knows (`klaudit.frameworks.versions.KNOWN`) and of their
development versions are kept, except for a framework of `OLDER_KEPT`, whose older commits are kept too, each
with the version it states (verl's `0.1` or `0.2.0.dev`: the lint judges those by the oldest known release,
saying they are older). verl's main branch is short (about 2,000 commits, from October 2024), so its whole
history fits in a small table; TRL's before 0.14 is not kept.

A framework whose version file is not bumped on its main branch (NeMo-RL's package_info.py still says 0.6.0
on commits that carry 0.7's KL term) is placed by its release tags instead (`TAGGED`): a tag's own commit is
that release, a commit the tag reaches and the previous one does not is that release's development version
(`0.7.0.dev0`: between 0.6 and 0.7), and a commit no known tag reaches is the next release's.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict

from klaudit.frameworks.versions import KNOWN, release

# Where each framework's source states its version, newest layout first.
VERSION_FILES = {
    "trl": (("trl/__init__.py", r"__version__\s*=\s*[\"']([^\"']+)"), ("VERSION", r"^\s*(\S+)"),
            ("setup.py", r"version\s*=\s*[\"']([^\"']+)"), ("setup.cfg", r"^version\s*=\s*(\S+)")),
    "verl": (("verl/version/version", r"^\s*(\S+)"),),
    "openrlhf": (("version.txt", r"^\s*(\S+)"),),
}
TAGGED = {"nemo_rl": "v{}.0"}  # the tag of each known release, by its major.minor
# Frameworks whose commits older than every known release are kept too (with the version each states), so that a
# pin at one is judged as older than the oldest known release rather than as a commit klaudit cannot place.
OLDER_KEPT = frozenset({"verl"})
PREFIX = 10  # hex digits kept per commit: no two of a framework's commits share them


def _git(git_dir: str, *arguments: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *arguments], check=True, capture_output=True,
                          text=True, encoding="utf-8", errors="replace").stdout


def _version(git_dir: str, commit: str, files: tuple[tuple[str, str], ...]) -> str | None:
    for path, pattern in files:
        try:
            text = _git(git_dir, "show", f"{commit}:{path}")
        except subprocess.CalledProcessError:
            continue
        match = re.search(pattern, text, re.MULTILINE)
        if match is not None and re.match(r"v?\d+\.\d+", match.group(1)):
            return match.group(1).removeprefix("v")
    return None


def _by_tags(git_dir: str, name: str) -> dict[str, list[str]]:
    """{version: commits} of a framework placed by its release tags (see the module docstring)."""
    by_version: dict[str, list[str]] = defaultdict(list)
    previous: str | None = None
    for known in KNOWN[name]:
        tag = TAGGED[name].format(known)
        tagged = _git(git_dir, "rev-parse", f"{tag}^{{commit}}").strip()
        for commit in _git(git_dir, "rev-list", tag, *([f"^{previous}"] if previous else [])).split():
            by_version[f"{known}.0" if commit == tagged else f"{known}.0.dev0"].append(commit[:PREFIX])
        previous = tag
    major, minor = release(KNOWN[name][-1])[:2]
    for commit in _git(git_dir, "rev-list", "HEAD", f"^{previous}").split():
        by_version[f"{major}.{minor + 1}.0.dev0"].append(commit[:PREFIX])
    return by_version


def _by_version_files(git_dir: str, name: str, commits: list[str]) -> dict[str, list[str]]:
    """{version: commits} of a framework placed by the version file each commit holds."""
    by_version: dict[str, list[str]] = defaultdict(list)
    for commit in commits:
        version = _version(git_dir, commit, VERSION_FILES[name])
        if version is not None and (name in OLDER_KEPT or release(version) >= release(KNOWN[name][0])):
            by_version[version].append(commit[:PREFIX])
    return by_version


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("framework", choices=sorted({*VERSION_FILES, *TAGGED}))
    parser.add_argument("git_dir", help="the framework repository's git directory")
    arguments = parser.parse_args()
    commits = _git(arguments.git_dir, "rev-list", "HEAD").split()
    by_version = (_by_tags(arguments.git_dir, arguments.framework) if arguments.framework in TAGGED
                  else _by_version_files(arguments.git_dir, arguments.framework, commits))
    if len({commit[:PREFIX] for commit in commits}) != len(commits):
        print(f"two commits share their first {PREFIX} hex digits: raise PREFIX", file=sys.stderr)
        return 1
    head = _git(arguments.git_dir, "log", "-1", "--format=%H %cs").split()
    print(f"# {arguments.framework} commits reachable from {head[0]} ({head[1]}): version, then commits; "
          f"written by scripts/framework_commits.py")
    for version in sorted(by_version, key=lambda v: [int(p) if p.isdigit() else -1 for p in v.split(".")]):
        hashes = sorted(by_version[version])
        for start in range(0, len(hashes), 10):
            print(version, *hashes[start:start + 10])
    return 0


if __name__ == "__main__":
    sys.exit(main())
