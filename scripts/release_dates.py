"""Write the table of the day each framework release klaudit knows was published, for the lint.

A project that names a framework without pinning it (`trl` or `trl>=0.12` in requirements.txt) installed the newest
release of the day it set its environment up. klaudit reads that day from git (the last commit of the file that
declares the dependency) and the release from `klaudit/frameworks/releases/published.txt`, written by this script
from the Python Package Index:

    python scripts/release_dates.py > klaudit/frameworks/releases/published.txt

Each line is a framework, a release line of `klaudit.frameworks.versions.KNOWN` (0.14, or OpenRLHF's 0.8.6), and the
day its first final release (no rc, dev, alpha or beta; a .post counts) was uploaded. A framework the index does not
carry (NeMo-RL ships containers) has no lines, and its unpinned dependency is judged by the latest known release.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
import urllib.request

from klaudit.frameworks.versions import KNOWN, distribution, release, release_line

_FINAL = re.compile(r"^\d+(?:\.\d+)*(?:\.post\d+)?$")  # 0.8.6, 0.2.0.post1; not 1.0.0rc1 or 0.8.0.dev0


def _uploads(package: str) -> dict[str, str]:
    """{version: the day of its first uploaded file} of every final release of `package` on the index."""
    with urllib.request.urlopen(f"https://pypi.org/pypi/{package}/json", timeout=60) as response:
        releases = json.load(response)["releases"]
    return {version: min(upload["upload_time"] for upload in files)[:10]
            for version, files in releases.items() if files and _FINAL.match(version)}


def main() -> int:
    print(f"# the day each known release line was first published on PyPI, as of {datetime.date.today()}; "
          "written by scripts/release_dates.py")
    for name in KNOWN:
        first: dict[str, str] = {}
        for version, day in _uploads(distribution(name)).items():
            if release(version) < release(KNOWN[name][0]):
                continue
            line = release_line(name, version)
            first[line] = min(day, first.get(line, day))
        for line in KNOWN[name]:
            if line in first:
                print(name, line, first[line])
    return 0


if __name__ == "__main__":
    sys.exit(main())
