"""The published trainer packages klaudit is measured and reviewed on, fetched once and cached.

`pip download --no-deps` of pinned wheels (CPython 3.11, manylinux, so the same files on every
host), unpacked under ~/.cache/klaudit-bench (or $KLAUDIT_BENCH_CACHE), outside the repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

# Versions fetched when the benchmark was written; pinned so that figures stay comparable.
PACKAGES = {"verl": "0.9.1", "trl": "1.16.0", "openrlhf": "0.11.2"}

CACHE = Path(os.environ.get("KLAUDIT_BENCH_CACHE", Path.home() / ".cache" / "klaudit-bench"))


def _download(name: str, version: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    wheels = list(into.glob(f"{name}-{version}-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.11", "--implementation", "cp", "--platform", "manylinux1_x86_64",
             "--dest", str(into), f"{name}=={version}"],
            check=True,
        )
        wheels = list(into.glob(f"{name}-{version}-*.whl"))
    return wheels[0]


def fetch_all() -> Path:
    """A directory holding one unpacked source tree per package (`<name>-<version>/`)."""
    trees = CACHE / "trees"
    for name, version in PACKAGES.items():
        tree = trees / f"{name}-{version}"
        if not tree.is_dir():
            wheel = _download(name, version, CACHE / "wheels")
            partial = tree.with_suffix(".partial")
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(partial)
            partial.rename(tree)
    return trees


def package_trees() -> dict[str, Path]:
    """name -> unpacked tree, downloading what is missing."""
    trees = fetch_all()
    return {name: trees / f"{name}-{version}" for name, version in PACKAGES.items()}
