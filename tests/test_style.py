"""The project's own code passes ruff with the rules pyproject.toml selects (run in CI with the tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    pytest.importorskip("ruff", reason="ruff comes with the test extra: pip install -e '.[test]'")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "klaudit", "tests", "scripts", "benchmarks"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
