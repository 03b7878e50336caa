"""Text and JSON rendering of findings, written out by hand for small files."""

from __future__ import annotations

import json

import click

from klaudit.lint.findings import Finding
from klaudit.lint.formats import FORMATTERS
from klaudit.lint.report import ReportOptions, format_json, format_text, summary
from klaudit.lint.rulebook import rule_url

SOURCE = "import torch\n\nkl = torch.exp(d) - d - 1\nloss = pg + beta * kl.mean()\n\tloss2 = kl\n"


def finding(path, line, column, end_column, code="KL002", end_line=None, fix="", origin_line=None):
    return Finding(path, line, column, code, f"{code} message", end_line or line, end_column,
                   fix=fix, origin_line=origin_line)


def test_text_shows_the_line_a_caret_span_the_origin_and_the_fix(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    found = finding(str(path), 4, 13, 29, fix="klaudit.estimators.kl_penalty(...)", origin_line=3)
    assert format_text([found], ReportOptions()) == "\n".join([
        f"{path}:4:13: KL002 KL002 message",
        "  |",
        "4 | loss = pg + beta * kl.mean()",
        "  |             ^^^^^^^^^^^^^^^^",
        "  = note: the estimator is computed at line 3:",
        "3 | kl = torch.exp(d) - d - 1",
        "  = help: klaudit.estimators.kl_penalty(...)",
        "",
        "Found 1 error in 1 file.",
    ])


def test_caret_keeps_tabs_and_a_multi_line_span_runs_to_the_end_of_the_line(tmp_path):
    path = tmp_path / "t.py"
    path.write_text(SOURCE)
    text = format_text([finding(str(path), 5, 10, 3, end_line=6)], ReportOptions())
    assert text.splitlines()[2:4] == ["5 | \tloss2 = kl", "  | \t        ^^"]


def test_a_zero_width_span_still_shows_one_caret(tmp_path):
    path = tmp_path / "t.py"
    path.write_text("x = 1\n")
    assert format_text([finding(str(path), 1, 3, 3)], ReportOptions()).splitlines()[3] == "  |   ^"


def test_unreadable_source_lines_are_left_out(tmp_path):
    path = tmp_path / "gone.py"
    found = finding(str(path), 1, 1, 2, code="KL000")
    assert format_text([found], ReportOptions()).splitlines() == [
        f"{path}:1:1: KL000 KL000 message", "", "Found 1 error in 1 file."]


def test_control_characters_of_a_binary_file_are_not_sent_to_the_terminal(tmp_path):
    path = tmp_path / "b.py"
    path.write_bytes(b"kl\x00\x1b[2J\tx\n")
    lines = format_text([finding(str(path), 1, 3, 4, code="KL000")], ReportOptions()).splitlines()
    assert lines[2:4] == ["1 | kl\ufffd\ufffd[2J\tx", "  |   ^"]


def test_quiet_prints_only_the_finding_lines(tmp_path):
    path = tmp_path / "t.py"
    path.write_text(SOURCE)
    found = [finding(str(path), 3, 6, 10), finding(str(path), 4, 1, 5, code="KL005", fix="x")]
    assert format_text(found, ReportOptions(quiet=True)).splitlines() == [
        f"{path}:3:6: KL002 KL002 message", f"{path}:4:1: KL005 KL005 message"]


def test_colour_only_when_asked(tmp_path):
    path = tmp_path / "t.py"
    path.write_text(SOURCE)
    found = [finding(str(path), 3, 6, 10)]
    assert "\x1b[" not in format_text(found, ReportOptions(color=False))
    coloured = format_text(found, ReportOptions(color=True))
    assert click.style("KL002", fg="red", bold=True) in coloured
    assert click.unstyle(coloured) == format_text(found, ReportOptions(color=False))


def test_summary_counts_errors_and_files():
    one = finding("a.py", 1, 1, 2)
    assert summary([]) == "All checks passed!"
    assert summary([one]) == "Found 1 error in 1 file."
    assert summary([one, finding("a.py", 2, 1, 2), finding("b.py", 1, 1, 2)]) == "Found 3 errors in 2 files."
    assert format_text([], ReportOptions()) == "All checks passed!"


def test_json_has_ruffs_fields(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = Finding("pkg/a.py", 4, 13, "KL002", "msg", 4, 29, fix="f()", origin_line=3,
                    related=(("pkg/a.py", 3, 5, "estimator computed here"),))
    [entry] = json.loads(format_json([found], ReportOptions()))
    assert entry == {
        "cell": None,
        "code": "KL002",
        "end_location": {"column": 29, "row": 4},
        "filename": str(tmp_path / "pkg" / "a.py"),
        "fix": None,
        "location": {"column": 13, "row": 4},
        "message": "msg",
        "noqa_row": 4,
        "url": "https://github.com/klaudit/klaudit/blob/main/klaudit/rules/KL002.md",
        "name": "kl-loss-forward-kl",
        "severity": "error",
        "no_fix_reason": None,
        "framework": None,
        "related": [{"filename": str(tmp_path / "pkg" / "a.py"), "location": {"column": 5, "row": 3},
                     "what": "estimator computed here"}],
    }
    assert json.loads(format_json([], ReportOptions())) == []


def test_formatters_are_registered_by_name():
    assert list(FORMATTERS) == ["text", "full", "concise", "grouped", "json", "github", "gitlab", "junit", "sarif"]
    assert FORMATTERS["text"] is format_text is FORMATTERS["full"] and FORMATTERS["json"] is format_json
    assert rule_url("KL010").endswith("/klaudit/rules/KL010.md")
