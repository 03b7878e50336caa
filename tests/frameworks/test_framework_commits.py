"""scripts/framework_commits.py places a tagged framework's commits by its release tags."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "framework_commits.py"
spec = importlib.util.spec_from_file_location("framework_commits_script", SCRIPT)
framework_commits = importlib.util.module_from_spec(spec)
spec.loader.exec_module(framework_commits)

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *arguments: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *arguments], check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo)}).stdout.strip()


def test_a_tag_is_its_release_and_the_commits_before_it_its_development(tmp_path, monkeypatch):
    """History a - b(v0.3.0) - c - d(v0.4.0) - e: b is 0.3.0, a is 0.3's development; c 0.4's development, d
    0.4.0; e, which no known tag reaches, the development of 0.5."""
    _git(tmp_path, "init", "-q")
    commits = {}
    for name, tag in (("a", None), ("b", "v0.3.0"), ("c", None), ("d", "v0.4.0"), ("e", None)):
        _git(tmp_path, "commit", "-q", "--allow-empty", "-m", name)
        commits[name] = _git(tmp_path, "rev-parse", "HEAD")[:framework_commits.PREFIX]
        if tag:
            _git(tmp_path, "tag", tag)
    monkeypatch.setitem(framework_commits.KNOWN, "nemo_rl", ("0.3", "0.4"))
    table = framework_commits._by_tags(str(tmp_path / ".git"), "nemo_rl")
    assert {version: sorted(found) for version, found in table.items()} == {
        "0.3.0.dev0": [commits["a"]], "0.3.0": [commits["b"]], "0.4.0.dev0": [commits["c"]], "0.4.0": [commits["d"]],
        "0.5.0.dev0": [commits["e"]]}
