"""The project's own code passes ruff with the rules pyproject.toml selects, and mypy with its [tool.mypy]
settings (run in CI with the tests)."""

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


def test_mypy_passes(request: pytest.FixtureRequest, tmp_path: Path):
    pytest.importorskip("mypy", reason="mypy comes with the test extra: pip install -e '.[test]'")
    # the incremental cache under .pytest_cache (gitignored) makes a second run take seconds, not a minute
    cache_provider = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    cache = cache_provider.mkdir("mypy") if cache_provider is not None else tmp_path
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache)],  # files: [tool.mypy]
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
