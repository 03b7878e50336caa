"""`klaudit lint` works where torch and transformers cannot be imported, and never tries to.

The subprocess gets a PYTHONPATH directory holding fake `torch` and `transformers` packages that
record the attempt in a marker file and raise ImportError, as on a machine without them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from snippets import K3_LOSS_TRAINER

BLOCKER = '''import os
with open(os.environ["KLAUDIT_IMPORT_MARKER"], "a") as marker:
    marker.write(__name__ + "\\n")
raise ImportError("{name} is hidden by test_no_torch")
'''



@pytest.fixture
def without_torch(tmp_path):
    hidden = tmp_path / "hidden"
    for name in ("torch", "transformers"):
        (hidden / name).mkdir(parents=True)
        (hidden / name / "__init__.py").write_text(BLOCKER.replace("{name}", name))
    marker = tmp_path / "imports.txt"
    python_path = os.pathsep.join(filter(None, [str(hidden), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=python_path, KLAUDIT_IMPORT_MARKER=str(marker), NO_COLOR="1")

    def run(*args):
        return subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)

    return run, marker


def test_the_blocker_hides_torch(without_torch):
    run, marker = without_torch
    assert run("-c", "import torch").returncode == 1
    assert marker.read_text() == "torch\n"


def test_lint_rule_and_rules_run_without_importing_torch(without_torch, tmp_path):
    run, marker = without_torch
    (tmp_path / "trainer.py").write_text(K3_LOSS_TRAINER)
    linted = run("-m", "klaudit", "lint", "--jobs", "2", "trainer.py")
    assert linted.returncode == 1, linted.stderr
    assert "trainer.py:7:5: KL002" in linted.stdout
    assert run("-m", "klaudit", "rules").returncode == 0
    assert run("-m", "klaudit", "rule", "KL002").returncode == 0
    assert not marker.exists(), f"imported: {marker.read_text()}"
