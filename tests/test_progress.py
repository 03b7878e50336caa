"""The progress line: on stderr only when asked, only after a second, erased at the end."""

from __future__ import annotations

import io
import time

from click.testing import CliRunner

from klaudit import cli, progress
from klaudit.lint.engine import lint_paths


def test_a_quick_run_prints_nothing(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with progress.Progress(True, "linting", total=3) as shown:
        shown.advance(3)
    assert err.getvalue() == ""


def test_a_long_run_shows_the_count_and_erases_it(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr(progress, "SHOW_AFTER", 0.0)
    with progress.Progress(True, "linting", total=4) as shown:
        shown.advance(2)
        time.sleep(0.6)
    assert "\r\x1b[Klinting 2/4 (" in err.getvalue()
    assert err.getvalue().endswith("\r\x1b[K")


def test_lint_counts_every_file(tmp_path):
    for index in range(3):
        (tmp_path / f"m{index}.py").write_text("x = 1\n")
    counted = progress.Progress(False)
    lint_paths([str(tmp_path)], progress=counted)
    assert (counted.done, counted.total) == (3, 3)


def test_no_progress_when_stderr_is_not_a_terminal(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "SHOW_AFTER", 0.0)
    (tmp_path / "m.py").write_text("x = 1\n")
    result = CliRunner().invoke(cli.main, ["lint", str(tmp_path)])
    assert result.stderr == ""
