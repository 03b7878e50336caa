"""check-grad starts the same way from any directory, and says in one line how to get torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from klaudit.cli import main

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parents[2]
BLOCKER = 'raise ImportError("{name} is hidden by test_start")\n'


def _check_grad(cwd: Path, *args: str, python_path: tuple = ()) -> subprocess.CompletedProcess:
    """`klaudit check-grad` as the installed console script runs it (the working directory is not on
    sys.path), in `cwd`."""
    path = os.pathsep.join([*map(str, python_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    command = "import sys; del sys.path[0]; from klaudit.cli import main; sys.argv[0] = 'klaudit'; main()"
    return subprocess.run([sys.executable, "-c", command, "check-grad", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=path, NO_COLOR="1"))


def test_a_klaudit_folder_in_the_working_directory_does_not_shadow_the_package(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "klaudit").mkdir()  # e.g. the parent directory of a clone, or another project's package
    (tmp_path / "klaudit" / "__init__.py").write_text("raise ImportError('the wrong klaudit was imported')\n")
    result = _check_grad(tmp_path, f"{DATA}/correct_estimators.py::k1_kl_loss", "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"objective": "REV"' in result.stdout


def test_without_torch_one_line_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` meets where torch is absent
    result = CliRunner().invoke(main, ["check-grad", f"{DATA}/correct_estimators.py::k1_kl_loss"])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert "pip install 'klaudit[audit]'" in line and "--index-url https://download.pytorch.org/whl/cpu" in line


def test_a_torch_that_fails_to_import_is_one_error_line_not_a_traceback(tmp_path):
    hidden = tmp_path / "hidden"
    (hidden / "torch").mkdir(parents=True)
    (hidden / "torch" / "__init__.py").write_text(BLOCKER.format(name="torch"))
    result = _check_grad(tmp_path, f"{DATA}/correct_estimators.py", python_path=(hidden,))
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "pip install 'klaudit[audit]'" in errors[0], result.stdout
