"""Shared test fixtures: the snapshot comparison, and the released framework packages.

A snapshot is the text a user reads (lint findings with their help and fix, check-grad's rows),
stored beside what produced it so that a change of wording shows in review. It records output; it
proves nothing about correctness, which the marker and exact-enumeration tests do. Regenerate the
snapshots after an intended change with `KLAUDIT_UPDATE_SNAPSHOTS=1 python -m pytest ...` and read
the diff.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

UPDATE = os.environ.get("KLAUDIT_UPDATE_SNAPSHOTS") == "1"


@pytest.fixture
def snapshot() -> Callable[[Path, str], None]:
    """snapshot(path, text): fail with a diff when `text` differs from the stored snapshot at `path`
    (or write it, with KLAUDIT_UPDATE_SNAPSHOTS=1)."""

    def compare(path: Path, text: str) -> None:
        if UPDATE:
            path.write_text(text, encoding="utf-8")
            return
        assert path.is_file(), f"no snapshot {path}: create it with KLAUDIT_UPDATE_SNAPSHOTS=1"
        stored = path.read_text(encoding="utf-8")
        if stored != text:
            diff = "".join(difflib.unified_diff(stored.splitlines(True), text.splitlines(True),
                                                str(path), "now"))
            pytest.fail(f"output differs from the snapshot (KLAUDIT_UPDATE_SNAPSHOTS=1 rewrites it):\n{diff}")

    return compare


@pytest.fixture(scope="session")
def released_trees() -> dict[str, Path]:
    """name -> the unpacked wheel of verl, trl and OpenRLHF as released (benchmarks/real_packages.py, which
    downloads what its cache lacks); the test is skipped where they can be neither fetched nor found."""
    benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        from real_packages import package_trees

        return package_trees()
    except Exception as error:  # noqa: BLE001 - no network and no cache: nothing to test against
        pytest.skip(f"the released framework packages cannot be fetched here: {error}")
    finally:
        sys.path.remove(benchmarks)
