"""[tool.klaudit]: discovery of the nearest pyproject.toml, validation, rule selection layers,
per-file ignores and exclusion globs."""

from __future__ import annotations

import pytest

from klaudit.config import (
    ConfigError,
    RuleSelection,
    Settings,
    check_selector,
    find_pyproject,
    load_settings,
)
from klaudit.rules import RULES


def pyproject(directory, body):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pyproject.toml"
    path.write_text(body)
    return path


def enabled(settings):
    return sorted(settings.enabled_codes)


def test_the_nearest_pyproject_with_a_klaudit_table_wins(tmp_path):
    pyproject(tmp_path, '[tool.klaudit]\nignore = ["KL005"]\n')
    pyproject(tmp_path / "sub", '[tool.other]\nx = 1\n')  # no klaudit table: keep walking up
    (tmp_path / "sub" / "deep").mkdir()
    found_path, table = find_pyproject(tmp_path / "sub" / "deep")
    assert found_path == tmp_path / "pyproject.toml" and table == {"ignore": ["KL005"]}
    settings = load_settings([str(tmp_path / "sub" / "deep" / "x.py")])
    assert "KL005" not in settings.enabled_codes and "KL002" in settings.enabled_codes
    assert settings.root == tmp_path.resolve()


def test_no_pyproject_means_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = load_settings([str(tmp_path)])
    assert enabled(settings) == sorted(code for code in RULES if code.startswith("KL0")) and settings.root == tmp_path


def test_informational_codes_are_off_by_default_and_on_when_selected():
    """KL100 (a KL term whose use could not be determined) is on with `--select KL1`, `ALL` or its code."""
    assert "KL100" not in Settings().enabled_codes
    assert "KL100" not in Settings().with_overrides(ignore=["KL002"]).enabled_codes
    assert Settings().with_overrides(select=["KL1"]).enabled_codes == {"KL000", "KL099", "KL100", "KL101"}
    assert "KL100" in Settings().with_overrides(select=["ALL"]).enabled_codes
    assert "KL100" in Settings().with_overrides(extend_select=["KL100"]).enabled_codes


def test_explicit_config_file(tmp_path):
    path = pyproject(tmp_path / "cfg", '[tool.klaudit]\nselect = ["KL002"]\n')
    assert enabled(load_settings(["."], str(path))) == ["KL000", "KL002", "KL099"]
    empty = pyproject(tmp_path / "empty", "[project]\nname = 'x'\n")
    with pytest.raises(ConfigError, match="no \\[tool.klaudit\\] table"):
        load_settings(["."], str(empty))
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(["."], str(tmp_path / "missing.toml"))


@pytest.mark.parametrize("body, message", [
    ('[tool.klaudit]\nselct = ["KL002"]\n', "unknown key `selct` \\(did you mean `select`\\?\\)"),
    ('[tool.klaudit]\nselect = "KL002"\n', "`select` must be a list of strings"),
    ('[tool.klaudit]\nignore = [2]\n', "`ignore` must be a list of strings"),
    ('[tool.klaudit]\nselect = ["KL999"]\n', "unknown rule selector 'KL999'.*KL000, KL001"),
    ('[tool.klaudit]\nselect = ["E501"]\n', "unknown rule selector 'E501'"),
    ('[tool.klaudit]\nper-file-ignores = ["x"]\n', "must be a table"),
    ('[tool.klaudit.per-file-ignores]\n"tests/*" = "KL002"\n', "must be a list of codes"),
    ('[tool.klaudit.per-file-ignores]\n"tests/*" = ["KL99"]\n', "unknown rule selector 'KL99'"),
    ('[tool.klaudit\nselect = 1\n', "invalid TOML"),
    ('[tool]\nklaudit = 3\n', "must be a table"),
])
def test_bad_configuration_is_a_clear_error(tmp_path, body, message):
    pyproject(tmp_path, body)
    with pytest.raises(ConfigError, match=message):
        load_settings([str(tmp_path)])


def test_a_pyproject_that_never_names_klaudit_is_not_read(tmp_path):
    """A project's own pyproject.toml may be invalid TOML (a table declared twice, as one public repository
    ships it): without the word `klaudit` it holds no table of ours, so the lint goes on with the defaults;
    the same file naming `tool.klaudit` is still a configuration error."""
    pyproject(tmp_path, '[project]\nname = "a"\n[project]\nname = "b"\n')
    assert load_settings([str(tmp_path)]) == Settings()
    pyproject(tmp_path, '[project]\nname = "a"\n[project]\nname = "b"\n[tool.klaudit]\nselect = ["KL002"]\n')
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_settings([str(tmp_path)])


def test_selectors_accept_all_codes_and_prefixes_case_insensitively():
    assert check_selector("all", "x") == "ALL"
    assert check_selector("kl00", "x") == "KL00"
    assert check_selector(" KL002 ", "x") == "KL002"
    for bad in ("", "K L", "KL0021", "XX"):
        with pytest.raises(ConfigError):
            check_selector(bad, "x")


def test_more_specific_selectors_win_and_ignore_wins_ties():
    def layer(**kwargs):
        return sorted(RuleSelection(**kwargs).apply(frozenset()))

    assert layer(select=("KL00",), ignore=("KL002",)) == [
        "KL000", "KL001", "KL003", "KL004", "KL005", "KL006", "KL007", "KL008", "KL009"]
    assert layer(select=("KL002",), ignore=("KL0",)) == ["KL002"]
    assert layer(select=("KL002",), ignore=("KL002",)) == []
    assert layer(select=("ALL",), ignore=("KL0",), extend_select=("KL01",)) == ["KL010", "KL011", "KL100", "KL101"]


def test_command_line_layer_on_top_of_the_file(tmp_path):
    pyproject(tmp_path, '[tool.klaudit]\nselect = ["KL00"]\nignore = ["KL007"]\n')
    from_file = load_settings([str(tmp_path)])
    assert "KL007" not in from_file.enabled_codes and "KL010" not in from_file.enabled_codes
    # --select starts over (the file's ignore no longer applies), as in ruff.
    assert enabled(from_file.with_overrides(select=["KL007"])) == ["KL000", "KL007", "KL099"]
    # --ignore and --extend-select edit what the file enabled.
    edited = from_file.with_overrides(ignore=["KL002"], extend_select=["KL010"])
    assert "KL002" not in edited.enabled_codes and "KL010" in edited.enabled_codes
    assert "KL007" not in edited.enabled_codes and "KL001" in edited.enabled_codes
    with pytest.raises(ConfigError, match="unknown rule selector 'KL2' in the command line"):
        from_file.with_overrides(ignore=["KL2"])


def test_kl000_survives_a_narrow_select_but_not_an_explicit_ignore():
    assert "KL000" in Settings().with_overrides(select=["KL002"]).enabled_codes
    assert "KL000" not in Settings().with_overrides(ignore=["KL000"]).enabled_codes
    assert "KL000" not in Settings().with_overrides(ignore=["ALL"]).enabled_codes
    # KL099 (part of a file not analysed) is about the file too: shown unless ignored by name
    assert "KL099" in Settings().with_overrides(select=["KL002"]).enabled_codes
    assert "KL099" not in Settings().with_overrides(ignore=["KL099"]).enabled_codes


@pytest.mark.parametrize("text, budget, timeout", [
    ("", 50_000_000, 60.0),
    ("analysis-budget = 5000\nanalysis-timeout = 2.5\n", 5000, 2.5),
    ("analysis-budget = 0\nanalysis-timeout = 0\n", None, None),
])
def test_analysis_limits_from_the_file(tmp_path, text, budget, timeout):
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.klaudit]\n" + text)
    settings = load_settings(["."], str(path))
    assert (settings.analysis_budget, settings.analysis_timeout) == (budget, timeout)
    assert settings.with_overrides(analysis_budget=7).analysis_budget == 7
    assert settings.with_overrides(analysis_timeout=0).analysis_timeout is None


@pytest.mark.parametrize("text", ["analysis-budget = -1", "analysis-budget = 1.5", "analysis-timeout = true",
                                  'analysis-timeout = "10"'])
def test_bad_analysis_limits_are_config_errors(tmp_path, text):
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.klaudit]\n" + text + "\n")
    with pytest.raises(ConfigError, match="must be a non-negative"):
        load_settings(["."], str(path))


def test_per_file_ignores_match_relative_globs_and_names(tmp_path):
    settings = Settings(root=tmp_path, per_file_ignores={
        "tests/*": ("KL002",), "*_legacy.py": ("KL00",), "**/gen/*.py": ("ALL",),
    })
    assert settings.ignored_in_file(str(tmp_path / "tests" / "a.py")) == {"KL002"}
    assert settings.ignored_in_file(str(tmp_path / "tests" / "deep" / "a.py")) == {"KL002"}
    assert settings.ignored_in_file(str(tmp_path / "src" / "a.py")) == set()
    assert settings.ignored_in_file(str(tmp_path / "src" / "old_legacy.py")) == {
        code for code in RULES if code.startswith("KL00")}
    assert settings.ignored_in_file(str(tmp_path / "gen" / "x.py")) == set(RULES)
    assert settings.ignored_in_file(str(tmp_path / "a" / "gen" / "x.py")) == set(RULES)


def test_exclude_globs(tmp_path):
    settings = Settings(root=tmp_path, exclude=("third_party", "*_pb2.py", "src/generated"))
    assert settings.is_excluded(str(tmp_path / "third_party"))
    assert settings.is_excluded(str(tmp_path / "a" / "b_pb2.py"))
    assert settings.is_excluded(str(tmp_path / "src" / "generated"))
    assert not settings.is_excluded(str(tmp_path / "lib" / "src" / "generated"))
    assert not settings.is_excluded(str(tmp_path / "src" / "model.py"))
    assert not settings.is_excluded(str(tmp_path / "build"))  # `exclude` replaced the defaults
    assert Settings(root=tmp_path).is_excluded(str(tmp_path / "build"))


def test_the_exclusions_compiled_together_match_what_each_pattern_matches_alone():
    import fnmatch

    from klaudit.config import _glob_matches, _globs_matcher

    def one(pattern: str, relative: str) -> bool:  # gitignore style, as documented
        pattern = pattern.rstrip("/")
        if "/" not in pattern:
            return any(fnmatch.fnmatchcase(part, pattern) for part in relative.split("/"))
        return any(fnmatch.fnmatchcase(relative, p) for p in (pattern, *([pattern[3:]] if pattern.startswith("**/") else [])))

    patterns = (".git", "*.egg-info", "build/", "**/gen/*.py", "a/b", "docs/**", "[ab]x", "**/x")
    paths = ("a/b", "a/b/c", "x", "pkg/x", "build", "src/build/f.py", "gen/f.py", "q/gen/f.py", "docs/a/b.py",
             "ax", "bx", "cx/y", ".git/config", "foo.egg-info/PKG", "train.py")
    for relative in paths:
        assert _globs_matcher(patterns)(relative) == any(one(p, relative) for p in patterns), relative
        for pattern in patterns:
            assert _glob_matches(pattern, relative) == one(pattern, relative), (pattern, relative)
