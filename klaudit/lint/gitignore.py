"""Which paths under a directory git ignores (.gitignore, .git/info/exclude, the global excludes).

Git answers for itself (`git ls-files --others --ignored --exclude-standard --directory`), so every
rule of git's matching holds, and a tracked file is never ignored. Outside a git work tree, or
without git, there is no answer (None) and the walk keeps its own exclusions only.
"""

from __future__ import annotations

import os
import subprocess


def ignored_under(top: str) -> frozenset[str] | None:
    """The normalised paths (joined to `top`) of the ignored files and directories under `top`,
    whole ignored directories once; `top` itself when everything in it is ignored."""
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"],
            cwd=top, capture_output=True, check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return frozenset(
        os.path.normpath(os.path.join(top, os.fsdecode(entry)))
        for entry in listing.split(b"\0") if entry
    )
