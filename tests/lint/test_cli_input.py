"""What `klaudit lint` reads and how it prints for people: .gitignore in a git work tree, the
source on stdin (`-`, --stdin-filename), FORCE_COLOR/NO_COLOR, and the top-level help."""

from __future__ import annotations

import os
import shutil
import subprocess

import click
import fake_analysis
import pytest
from click.testing import CliRunner

from klaudit import cli

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture
def project(tmp_path, monkeypatch):
    fake_analysis.install(monkeypatch)
    monkeypatch.chdir(tmp_path)
    for name in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("kl = 1\nloss = BAD_KL002(kl)\n")
    return tmp_path


def run(*args, stdin=None):
    result = CliRunner().invoke(cli.main, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def linted(*args):
    """The files that got a finding (every fake file has one)."""
    return sorted({line.split(":")[0] for line in run("lint", "-q", *args)[1].splitlines()})


# --- .gitignore ------------------------------------------------------------------------------


@pytest.fixture
def repository(project, monkeypatch):
    # the user's and the system's git configuration (a global excludes file) stay out of the test
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    (project / ".gitignore").write_text("generated/\n*_tmp.py\n")
    for name in ("generated/model.py", "src/scratch_tmp.py", "src/kept_tmp.py", "only_ignored/x_tmp.py"):
        (project / name).parent.mkdir(exist_ok=True)
        (project / name).write_text("kl = 1\nBAD_KL002(kl)\n")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "-f", "src/kept_tmp.py"], cwd=project, check=True)
    return project


@needs_git
def test_files_git_ignores_are_skipped_in_a_work_tree(repository):
    # kept_tmp.py matches a pattern but is tracked: git does not ignore it, nor does the lint
    assert linted() == ["src/kept_tmp.py", "src/train.py"]
    assert linted("src") == ["src/kept_tmp.py", "src/train.py"]
    assert linted("only_ignored") == []  # everything in it is ignored


@needs_git
def test_named_files_are_linted_even_if_ignored_and_the_flag_turns_it_off(repository):
    assert linted("generated/model.py", "src/scratch_tmp.py") == ["generated/model.py", "src/scratch_tmp.py"]
    assert linted("--no-respect-gitignore") == [
        "generated/model.py", "only_ignored/x_tmp.py", "src/kept_tmp.py", "src/scratch_tmp.py", "src/train.py"]


def test_outside_a_work_tree_the_walk_is_unchanged(project, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(project.parent))  # no repository above tmp_path
    (project / ".gitignore").write_text("src/\n")
    assert linted() == ["src/train.py"]


# --- stdin -----------------------------------------------------------------------------------


def test_stdin_is_linted_under_the_given_name_with_its_own_code_frame(project):
    # the file on disk differs: the report must show what came on stdin
    code, out, _ = run("lint", "-", "--stdin-filename", "src/train.py", stdin=b"kl = 2\n\nx = BAD_KL005(kl)\n")
    assert code == 1
    assert out.splitlines()[:4] == [
        "src/train.py:3:5: KL005 fake KL005", "  |", "3 | x = BAD_KL005(kl)", "  |     ^^^^^^^^^^^^^"]
    assert run("lint", "-q", "-", stdin=b"kl = 1\nBAD_KL002(kl)\n")[1] == "-:2:1: KL002 fake KL002\n"
    assert run("lint", "-", stdin=b"kl = 1\n") == (0, "All checks passed!\n", "")


def test_stdin_filename_finds_the_configuration_and_its_per_file_ignores(project):
    (project / "sub").mkdir()
    (project / "sub" / "pyproject.toml").write_text(
        '[tool.klaudit]\nignore = ["KL005"]\nper-file-ignores = { "tests/*" = ["KL002"] }\n')
    source = b"kl = 1\nBAD_KL002(kl)\nBAD_KL005(kl)\n"
    assert run("lint", "-q", "-", "--stdin-filename", "sub/train.py", stdin=source)[1] == (
        "sub/train.py:2:1: KL002 fake KL002\n")
    assert run("lint", "-", "--stdin-filename", "sub/tests/test_x.py", stdin=source)[0] == 0
    assert run("lint", "-q", "-", "--stdin-filename", "other.py", stdin=source)[1].count("\n") == 2


def test_stdin_syntax_and_encoding_errors_are_kl000(project):
    code, out, _ = run("lint", "-q", "-", "--stdin-filename", "a.py", stdin=b"def f(:\n")
    assert code == 1 and out.startswith("a.py:1:") and " KL000 " in out
    code, out, _ = run("lint", "-q", "-", stdin=b"kl = '\xff'\n")
    assert code == 1 and out.startswith("-:1:1: KL000 cannot decode the file")


@pytest.mark.parametrize("args, message", [
    (("lint", "-", "src"), "`-` (read the source from stdin) must be the only path"),
    (("lint", "--stdin-filename", "a.py", "src"), "--stdin-filename needs `-` as the path"),
])
def test_stdin_misuse_is_a_usage_error(project, args, message):
    code, out, err = run(*args)
    assert code == 2 and out == "" and message in err


# --- colour and help -------------------------------------------------------------------------


def test_force_color_colours_text_on_a_pipe_and_no_color_wins(project, monkeypatch):
    plain = run("lint", "src")[1]
    assert "\x1b[" not in plain
    monkeypatch.setenv("FORCE_COLOR", "1")
    coloured = run("lint", "src")[1]
    assert "\x1b[" in coloured and click.unstyle(coloured) == plain
    assert "\x1b[" in run("lint", "--output-format", "concise", "src")[1]
    for tool_format in ("json", "github", "sarif"):
        assert "\x1b[" not in run("lint", "--output-format", tool_format, "src")[1]
    monkeypatch.setenv("NO_COLOR", "1")
    assert run("lint", "src")[1] == plain


def test_top_level_help_lists_every_command_in_full(project):
    code, out, _ = run("--help")
    assert code == 0
    listing = out.split("Commands:\n", 1)[1].splitlines()
    assert len(listing) == len(cli.main.commands)
    for line in listing:
        name, text = line.split(None, 1)
        assert text == cli.main.commands[name].short_help and text.endswith(".") and "..." not in text
