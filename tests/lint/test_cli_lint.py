"""`klaudit lint`, `klaudit rule`, `klaudit rules`: options, output and exit codes.

The analysis is the stand-in of fake_analysis (`BAD_KL002(x)` is a KL002 finding).
"""

from __future__ import annotations

import json
import os

import fake_analysis
import pytest
from click.testing import CliRunner

from klaudit import cli
from klaudit.rules import RULES


@pytest.fixture(autouse=True)
def fake(monkeypatch):
    fake_analysis.install(monkeypatch)


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("kl = 1\nloss = BAD_KL002(kl)\nBAD_KL005(kl)\n")
    (tmp_path / "src" / "clean.py").write_text("kl = 1\n")
    return tmp_path


def run(*args):
    result = CliRunner().invoke(cli.main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_findings_exit_1_with_text_report(project):
    code, out, err = run("lint")
    assert code == 1 and err == ""
    lines = out.splitlines()
    assert lines[0] == "src/train.py:2:8: KL002 fake KL002"
    assert lines[1:5] == ["  |", "2 | loss = BAD_KL002(kl)", "  |        ^^^^^^^^^^^^^",
                          "  = help: klaudit.estimators.fixed()"]
    assert "src/train.py:3:1: KL005 fake KL005" in lines
    assert lines[-1] == "Found 2 errors in 1 file."


def test_clean_exit_0(project):
    assert run("lint", "src/clean.py") == (0, "All checks passed!\n", "")


def test_exit_zero_and_quiet(project):
    code, out, _ = run("lint", "--exit-zero", "--quiet", "src")
    assert code == 0
    assert out.splitlines() == ["src/train.py:2:8: KL002 fake KL002", "src/train.py:3:1: KL005 fake KL005"]


@pytest.mark.parametrize("flag", ["--output-format", "--format"])
def test_json_output(project, flag):
    code, out, _ = run("lint", flag, "json", "src")
    assert code == 1
    entries = json.loads(out)
    assert [(e["code"], e["location"], e["filename"]) for e in entries] == [
        ("KL002", {"row": 2, "column": 8}, str(project / "src" / "train.py")),
        ("KL005", {"row": 3, "column": 1}, str(project / "src" / "train.py")),
    ]


def test_select_ignore_and_extend_select(project):
    assert run("lint", "-q", "--select", "KL005")[1].splitlines() == ["src/train.py:3:1: KL005 fake KL005"]
    assert run("lint", "-q", "--ignore", "KL002,KL005")[0] == 0
    assert run("lint", "-q", "--select", "KL002", "--extend-select", "KL005")[1].count("\n") == 2
    assert run("lint", "-q", "--select", "kl00")[0] == 1


def test_configuration_file_and_command_line_override(project):
    (project / "pyproject.toml").write_text('[tool.klaudit]\nignore = ["KL002"]\n')
    assert run("lint", "-q")[1].splitlines() == ["src/train.py:3:1: KL005 fake KL005"]
    assert run("lint", "-q", "--select", "KL002")[1].splitlines() == ["src/train.py:2:8: KL002 fake KL002"]
    (project / "pyproject.toml").write_text('[tool.klaudit]\nexclude = ["src"]\n')
    assert run("lint") == (0, "All checks passed!\n", "")
    assert run("lint", "--exclude", "nothing")[0] == 1
    (project / "pyproject.toml").write_text("[tool.klaudit.per-file-ignores]\n\"src/train.py\" = [\"KL0\"]\n")
    assert run("lint")[0] == 0
    other = project / "other.toml"
    other.write_text('[tool.klaudit]\nselect = ["KL002"]\n')
    assert run("lint", "-q", "--config", str(other))[1].splitlines() == ["src/train.py:2:8: KL002 fake KL002"]


def test_extend_exclude(project):
    assert run("lint", "--extend-exclude", "train.py")[0] == 0


@pytest.mark.parametrize("args, message", [
    (("lint", "--select", "KL999"), "unknown rule selector 'KL999' in the command line"),
    (("lint", "--ignore", "E501"), "unknown rule selector 'E501'"),
    (("lint", "missing.py"), "missing.py: no such file or directory"),
    (("lint", "--config", "nope.toml"), "cannot read nope.toml"),
])
def test_user_errors_are_one_line_exit_2(project, args, message):
    code, out, err = run(*args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_a_broken_symbolic_link_is_named_not_a_traceback(project):
    (project / "loop.py").symlink_to("loop.py")
    (project / "gone.py").symlink_to("removed.py")
    code, out, err = run("lint", "loop.py")
    assert (code, out) == (2, "") and err == "Error: loop.py: a symbolic link that loops\n"
    code, out, err = run("lint", "gone.py")
    assert (code, out) == (2, "") and err == "Error: gone.py: a symbolic link to 'removed.py', which does not exist\n"
    os.mkfifo(project / "pipe.py")  # exists, but is no file to read
    assert run("lint", "pipe.py") == (2, "", "Error: pipe.py: not a file or a directory\n")


def test_unknown_code_lists_the_known_ones(project):
    _, _, err = run("lint", "--select", "KL999")
    assert ", ".join(RULES) in err


def test_bad_pyproject_is_exit_2(project):
    (project / "pyproject.toml").write_text("[tool.klaudit]\nselect = [\n")
    code, _, err = run("lint")
    assert code == 2 and "invalid TOML" in err and err.count("\n") == 1
    (project / "pyproject.toml").write_text('[tool.klaudit]\nexclud = ["x"]\n')
    code, _, err = run("lint")
    assert code == 2 and "unknown key `exclud` (did you mean `exclude`?)" in err


def test_jobs_must_be_positive(project):
    assert run("lint", "--jobs", "0")[0] == 2


def test_internal_error_exits_2_but_keeps_the_findings(project):
    (project / "src" / "crash.py").write_text("kl = 1\nCRASH\n")
    code, out, err = run("lint", "-q", "src")
    assert code == 2
    assert out.splitlines() == ["src/train.py:2:8: KL002 fake KL002", "src/train.py:3:1: KL005 fake KL005"]
    assert err.startswith("error: src/crash.py: internal error: RuntimeError: boom")


def test_syntax_error_counts_as_a_finding(project):
    (project / "src" / "clean.py").write_text("kl = (\n")
    code, out, _ = run("lint", "-q", "src/clean.py")
    assert code == 1 and out == "src/clean.py:1:6: KL000 syntax error: '(' was never closed\n"


def test_an_incomplete_analysis_is_shown_but_keeps_exit_status_0(project):
    # a 400-call chain nests 800 levels: not parsed (KL099, informational)
    (project / "src" / "train.py").write_text("kl = 1\n" + "x = a" + ".b()" * 400 + "\n")
    code, out, err = run("lint", "-q", "src")
    assert code == 0 and err == ""
    assert out.startswith("src/train.py:2:1: KL099 not analysed: the code at line 2 nests")


def test_ctrl_c_exits_130(project, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "lint_paths", interrupted)
    code, out, err = run("lint", "src")
    assert code == 130 and "interrupted" in err


def test_colour_follows_the_terminal_and_no_color(monkeypatch):
    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    for name in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("sys.stdout", Stream(True))
    assert cli._use_color()
    monkeypatch.setenv("NO_COLOR", "1")
    assert not cli._use_color()
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setattr("sys.stdout", Stream(False))
    assert not cli._use_color()


def test_rules_lists_every_rule_aligned():
    code, out, _ = run("rules")
    lines = out.splitlines()
    assert code == 0 and len(lines) == len(RULES)
    summaries_at = {line.index(rule.summary) for line, rule in zip(lines, RULES.values())}
    assert len(summaries_at) == 1
    for line, rule in zip(lines, RULES.values()):
        assert line.startswith(f"{rule.code}  {rule.name} ")


def test_rule_prints_the_page_by_code_or_name():
    code, out, _ = run("rule", "kl002")
    assert code == 0 and out.startswith("# KL002 kl-loss-forward-kl")
    assert run("rule", "kl-loss-forward-kl")[1] == out


def test_unknown_rule_exits_2_with_the_valid_codes():
    code, out, err = run("rule", "KL098")
    assert code == 2 and out == ""
    assert "unknown rule 'KL098'" in err and ", ".join(RULES) in err


def test_analysis_limit_flags_reach_the_engine(project, monkeypatch):
    seen = {}

    def capture(paths, settings, **options):
        seen["limits"] = (settings.analysis_budget, settings.analysis_timeout)
        return _empty()

    monkeypatch.setattr(cli, "lint_paths", capture)
    assert run("lint", "--analysis-budget", "1000", "--analysis-timeout", "0", "src")[0] == 0
    assert seen["limits"] == (1000, None)
    assert run("lint", "src")[0] == 0 and seen["limits"] == (50_000_000, 60.0)


def _empty():
    from klaudit.lint.engine import LintResult
    return LintResult()
