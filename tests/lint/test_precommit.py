"""The pre-commit hook in .pre-commit-hooks.yaml, run by `pre-commit try-repo` on scratch repos.

try-repo installs the hook repository's HEAD (or, when its tree is dirty, a temporary copy of
it) into a fresh virtual environment with pip. To test exactly the files of this checkout, the
package is copied into a scratch hook repository and committed there; the code to lint sits in a
second scratch repository. This needs pip to reach PyPI for libcst and click (cached after the
first run); each try-repo call builds a fresh environment, about 15 s here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from snippets import K3_LOSS_TRAINER

ROOT = Path(__file__).resolve().parents[2]
PRE_COMMIT = shutil.which("pre-commit", path=os.path.dirname(sys.executable)) or shutil.which("pre-commit")

pytestmark = pytest.mark.skipif(PRE_COMMIT is None, reason="pre-commit is not installed (pip install pre-commit)")


CLEAN = '''def add(a, b):
    return a + b
'''


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
                    *args], cwd=cwd, check=True, capture_output=True)


def scratch_repo(path: Path) -> Path:
    path.mkdir()
    git(path, "init", "-q")
    return path


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory) -> Path:
    repo = scratch_repo(tmp_path_factory.mktemp("hook") / "klaudit")
    for name in ("pyproject.toml", "README.md", ".pre-commit-hooks.yaml"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copytree(ROOT / "klaudit", repo / "klaudit", ignore=shutil.ignore_patterns("__pycache__"))
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "klaudit under test")
    return repo


def try_repo(hook_repo: Path, target: Path, *files: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PRE_COMMIT_HOME=str(hook_repo.parent / "pre-commit-home"))
    return subprocess.run([PRE_COMMIT, "try-repo", str(hook_repo), "klaudit", "--files", *files],
                          cwd=target, env=env, capture_output=True, text=True, timeout=600)


def test_hook_fails_on_a_kl_pitfall_and_passes_on_clean_code(hook_repo, tmp_path):
    target = scratch_repo(tmp_path / "project")
    (target / "trainer.py").write_text(K3_LOSS_TRAINER)
    (target / "utils.py").write_text(CLEAN)
    git(target, "add", ".")

    bad = try_repo(hook_repo, target, "trainer.py")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "trainer.py:7:5: KL002" in bad.stdout

    clean = try_repo(hook_repo, target, "utils.py")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "Passed" in clean.stdout
