"""The GitHub Action (action.yml): its steps' commands run here as a runner would run them.

Inputs reach the commands only through `env:` (never spliced into the script), so the test sets
the step's environment from the inputs and runs each `run:` with bash -e, as GitHub does. The
install step runs as a pip dry run against this checkout (no index, no network)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
FIXTURES = ROOT / "fixtures"
ACTION = yaml.safe_load((ROOT / "action.yml").read_text(encoding="utf-8"))
EXPRESSION = re.compile(r"\$\{\{\s*inputs\.([\w-]+)\s*\}\}")


def _run_step(name: str, inputs: dict, cwd: Path) -> subprocess.CompletedProcess:
    values = {key: spec.get("default", "") for key, spec in ACTION["inputs"].items()} | inputs
    [step] = [step for step in ACTION["runs"]["steps"] if step["name"] == name]
    assert step["shell"] == "bash" and not EXPRESSION.search(step["run"])  # inputs only through env
    env = {**os.environ, "GITHUB_ACTION_PATH": str(ROOT),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    env.update({key: EXPRESSION.sub(lambda m: values[m.group(1)], value) for key, value in step.get("env", {}).items()})
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_action_is_composite_with_the_documented_inputs():
    assert ACTION["runs"]["using"] == "composite"
    assert set(ACTION["inputs"]) == {"paths", "args", "check-grad", "pip-options"}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "uses: klaudit/klaudit@" in readme and all(f"{name}:" in readme for name in ("paths", "check-grad"))


def test_install_step_installs_this_checkout(tmp_path):
    result = _run_step("Install klaudit", {"pip-options": "--dry-run --no-deps --no-index --no-build-isolation"},
                       tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Would install klaudit" in result.stdout


def test_lint_step_annotates_the_findings_and_fails():
    result = _run_step("klaudit lint", {"paths": "bad", "args": "--select KL002"}, FIXTURES)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith("::error file=bad/") for line in lines)
    assert all("title=KL002 (kl-loss-forward-kl)" in line for line in lines)
    assert _run_step("klaudit lint", {"paths": "clean"}, FIXTURES).returncode == 0


def test_check_grad_step_runs_the_targets():
    pytest.importorskip("torch")
    step = next(step for step in ACTION["runs"]["steps"] if step["name"] == "klaudit check-grad")
    assert "inputs.check-grad != ''" in step["if"] and "!cancelled()" in step["if"]  # runs after a failed lint too
    result = _run_step("klaudit check-grad", {"check-grad": "fixed/grpo_pkg/loss.py::grpo_loss"}, FIXTURES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "unbiased" in result.stdout

