"""The release an unpinned dependency installed: the newest one published by the day the project last committed the
file that declares it.

`trl` or `trl>=0.12` in requirements.txt names no release, but the environment it set up got the newest release of
that day (pip takes the newest it is allowed), and the code beside it was written and run against that one. Git says
the day: the author date of the last commit that changed the file. A file git does not track, or one changed since its
last commit, was set up with today's newest; outside a git work tree, or without git, there is no day. The day each
release line was first published is in releases/published.txt (written by scripts/release_dates.py from PyPI).
"""

from __future__ import annotations

import datetime
import functools
import subprocess
from collections.abc import Sequence
from pathlib import Path

_PUBLISHED = Path(__file__).with_name("releases") / "published.txt"
_GIT_SECONDS = 20  # a long history walked back to an old file's last change takes seconds, not minutes


@functools.cache
def _published() -> dict[str, dict[str, datetime.date]]:
    """{framework: {release line: the day its first final release was published}}."""
    table: dict[str, dict[str, datetime.date]] = {}
    for line in _PUBLISHED.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, release, day = line.split()
            table.setdefault(name, {})[release] = datetime.date.fromisoformat(day)
    return table


def newest_published(name: str, day: datetime.date, allowed: Sequence[str]) -> tuple[str, bool] | None:
    """(the newest of the release lines `allowed`, oldest first, published on or before `day`; whether the day comes
    before all of them, in which case the oldest allowed, which the dependency asked for or an older one stood in for);
    None where klaudit has no day for any of them (NeMo-RL is not on PyPI)."""
    published = _published().get(name, {})
    dated = [line for line in allowed if line in published]
    if not dated:
        return None
    out = [line for line in dated if published[line] <= day]
    return (out[-1], False) if out else (dated[0], True)


@functools.lru_cache(maxsize=256)  # asked for each linted folder under the one declaring the dependency
def last_committed(path: Path) -> datetime.date | None:
    """The author day of the last commit that changed `path`; None outside a git work tree, without git, for a file
    git does not track, or for one changed since its last commit."""
    folder, name = str(path.parent), path.name
    try:
        changed = _git(folder, "status", "--porcelain", "--", name)
        day = _git(folder, "log", "-1", "--format=%aI", "--", name)
    except (OSError, subprocess.SubprocessError):
        return None
    if changed.strip() or not day.strip():
        return None
    try:
        return datetime.date.fromisoformat(day.strip()[:10])
    except ValueError:
        return None


def _git(folder: str, *arguments: str) -> str:
    return subprocess.run(["git", "-C", folder, *arguments], capture_output=True, check=True, text=True,
                          encoding="utf-8", errors="replace", timeout=_GIT_SECONDS).stdout
