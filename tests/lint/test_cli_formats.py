"""`klaudit lint` output formats for tools: github annotations, concise lines, --statistics, the
JSON's rule name and severity, and SARIF 2.1.0 validated against the official schema
(tests/data/sarif-schema-2.1.0.json, see tests/data/README.md)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import fake_analysis
import jsonschema
import pytest
from click.testing import CliRunner

from klaudit import cli
from klaudit.lint.findings import Finding
from klaudit.lint.formats import FORMATTERS
from klaudit.lint.github import annotation, escape_data, escape_property
from klaudit.lint.report import ReportOptions
from klaudit.lint.sarif import format_sarif
from klaudit.rules import RULES

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text(encoding="utf-8"))


@pytest.fixture
def project(tmp_path, monkeypatch):
    fake_analysis.install(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("kl = 1\nloss = BAD_KL002(kl)\nBAD_KL005(kl)\nBAD_KL002(kl)\n")
    (tmp_path / "src" / "more.py").write_text("kl = 1\nBAD_KL005(kl)\nBAD_KL100(kl)\n")
    return tmp_path


def run(*args):
    result = CliRunner().invoke(cli.main, list(args))
    return result.exit_code, result.stdout, result.stderr


def validate(log: dict) -> None:
    jsonschema.validators.validator_for(SCHEMA)(SCHEMA).validate(log)


# --- github ----------------------------------------------------------------------------------


def test_github_escapes_what_the_workflow_command_syntax_reserves():
    assert escape_data("100% a:b,c\r\nd") == "100%25 a:b,c%0D%0Ad"
    assert escape_property("100% a:b,c\r\nd") == "100%25 a%3Ab%2Cc%0D%0Ad"
    # `%` first, or the escapes of the others would be escaped again
    assert escape_property(":%") == "%3A%25"


def test_github_annotation_carries_the_span_the_rule_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = Finding("dir,a/b:c.py", 4, 13, "KL002", "k3: 50% off,\nreally", 5, 29, fix="use kl_penalty(x, y)")
    assert annotation(found) == (
        "::error file=dir%2Ca/b%3Ac.py,line=4,col=13,endLine=5,endColumn=29,"
        "title=KL002 (kl-loss-forward-kl)::k3: 50%25 off,%0Areally%0Ahelp: use kl_penalty(x, y)")
    informational = Finding(str(tmp_path / "x.py"), 1, 1, "KL100", "unknown use", 1, 2)
    assert annotation(informational).startswith("::notice file=x.py,line=1,col=1,")


def test_github_output_is_one_annotation_per_finding(project):
    code, out, _ = run("lint", "--output-format", "github", "src")
    assert code == 1
    lines = out.splitlines()
    help_line = "%0Ahelp: klaudit.estimators.fixed()"
    assert lines == [
        "::error file=src/more.py,line=2,col=1,endLine=2,endColumn=14,title=KL005 (kl-last-token-only)::"
        + "fake KL005" + help_line,
        "::error file=src/train.py,line=2,col=8,endLine=2,endColumn=21,title=KL002 (kl-loss-forward-kl)::"
        + "fake KL002" + help_line,
        "::error file=src/train.py,line=3,col=1,endLine=3,endColumn=14,title=KL005 (kl-last-token-only)::"
        + "fake KL005" + help_line,
        "::error file=src/train.py,line=4,col=1,endLine=4,endColumn=14,title=KL002 (kl-loss-forward-kl)::"
        + "fake KL002" + help_line,
    ]
    assert run("lint", "--output-format", "github", "src/train.py", "--ignore", "KL0") == (0, "", "")


# --- gitlab, junit, full --------------------------------------------------------------------


def test_gitlab_is_a_code_quality_report_whose_fingerprints_ignore_the_line(project):
    code, out, _ = run("lint", "--output-format", "gitlab", "src")
    assert code == 1
    issues = json.loads(out)
    assert [(i["location"]["path"], i["location"]["positions"]["begin"]["line"], i["check_name"]) for i in issues] == [
        ("src/more.py", 2, "KL005 (kl-last-token-only)"), ("src/train.py", 2, "KL002 (kl-loss-forward-kl)"),
        ("src/train.py", 3, "KL005 (kl-last-token-only)"), ("src/train.py", 4, "KL002 (kl-loss-forward-kl)")]
    assert {i["severity"] for i in issues} == {"major"} and issues[1]["description"] == "KL002 fake KL002"
    fingerprints = [i["fingerprint"] for i in issues]
    assert len(set(fingerprints)) == 4  # two identical KL002 findings in train.py are two issues
    (project / "src" / "train.py").write_text("\n\n" + (project / "src" / "train.py").read_text())
    moved = [i["fingerprint"] for i in json.loads(run("lint", "--output-format", "gitlab", "src")[1])]
    assert moved == fingerprints  # the same findings two lines lower are the same issues
    informational = json.loads(run("lint", "--output-format", "gitlab", "--select", "KL100", "src")[1])
    assert [i["severity"] for i in informational] == ["info"]
    assert run("lint", "--output-format", "gitlab", "src", "--ignore", "KL") == (0, "[]\n", "")


def test_junit_is_one_failed_case_per_finding_in_a_suite_per_file(project):
    import xml.etree.ElementTree as ElementTree

    code, out, _ = run("lint", "--output-format", "junit", "src")
    assert code == 1
    suites = ElementTree.fromstring(out)
    assert (suites.tag, suites.get("tests"), suites.get("failures")) == ("testsuites", "4", "4")
    assert [(suite.get("name"), suite.get("failures")) for suite in suites] == [("src/more.py", "1"), ("src/train.py", "3")]
    case = suites[1][0]
    assert (case.get("name"), case.get("line"), case[0].get("type"), case[0].get("message")) == (
        "klaudit.KL002", "2", "KL002", "fake KL002")
    assert case[0].text == "src/train.py:2:8: KL002 fake KL002\nhelp: klaudit.estimators.fixed()"
    clean = ElementTree.fromstring(run("lint", "--output-format", "junit", "src", "--ignore", "KL")[1])
    assert (clean.get("tests"), clean.get("failures"), clean[0][0].get("name")) == ("1", "0", "No findings")


def test_junit_stays_well_formed_with_control_characters_in_a_message(tmp_path):
    """A switch value read from the source may hold any character; XML 1.0 cannot hold control characters."""
    import xml.etree.ElementTree as ElementTree

    from klaudit.lint.ci_reports import format_junit

    found = Finding(str(tmp_path / "a.py"), 2, 1, "KL002", 'k3 [mode="a\x1bb\x00"] <&>', 2, 5)
    suites = ElementTree.fromstring(format_junit([found], ReportOptions()))
    assert suites[0][0][0].get("message") == 'k3 [mode="a\ufffdb\ufffd"] <&>'


def test_full_is_ruffs_name_for_the_text_format(project):
    assert run("lint", "--output-format", "full", "src") == run("lint", "src")


# --- concise, statistics ---------------------------------------------------------------------


def test_concise_is_one_line_per_finding_and_the_summary(project):
    code, out, _ = run("lint", "--output-format", "concise", "src")
    assert code == 1
    assert out.splitlines() == [
        "src/more.py:2:1: KL005 fake KL005",
        "src/train.py:2:8: KL002 fake KL002",
        "src/train.py:3:1: KL005 fake KL005",
        "src/train.py:4:1: KL002 fake KL002",
        "Found 4 errors in 2 files.",
    ]
    assert run("lint", "--output-format", "concise", "-q", "src")[1].count("\n") == 4


def test_grouped_lists_the_findings_under_each_file(project):
    (project / "src" / "train.py").write_text("kl = 1\nBAD_KL005(kl)\n" + "\n" * 7 + "x = BAD_KL002(kl)\n")
    code, out, _ = run("lint", "--output-format", "grouped", "src")
    assert code == 1
    assert out.splitlines() == [
        "src/more.py:",
        "  2:1 KL005 fake KL005",
        "",
        "src/train.py:",
        "  2:1  KL005 fake KL005",  # places aligned within a file
        "  10:5 KL002 fake KL002",
        "",
        "Found 3 errors in 2 files.",
    ]
    assert run("lint", "--output-format", "grouped", "-q", "src")[1].splitlines()[-1] == "  10:5 KL002 fake KL002"
    assert run("lint", "--output-format", "grouped", "src", "--ignore", "KL0")[1] == "All checks passed!\n"


def test_statistics_counts_each_code_most_frequent_first(project):
    code, out, _ = run("lint", "--statistics", "--select", "ALL", "src")
    assert code == 1  # KL002 and KL005 fail the run; KL100 alone would not
    assert out.splitlines() == [
        "2\tKL002\tkl-loss-forward-kl",
        "2\tKL005\tkl-last-token-only",
        f"1\tKL100\t{RULES['KL100'].name}",
    ]
    code, out, _ = run("lint", "--statistics", "--output-format", "json", "src")
    assert json.loads(out) == [{"code": "KL002", "name": "kl-loss-forward-kl", "count": 2},
                               {"code": "KL005", "name": "kl-last-token-only", "count": 2}]
    assert run("lint", "--statistics", "src/more.py", "--ignore", "KL0") == (0, "All checks passed!\n", "")


def test_statistics_orders_by_count_then_code(project):
    (project / "src" / "train.py").write_text("kl = 1\n" + "BAD_KL009(kl)\n" * 3 + "BAD_KL001(kl)\n")
    out = run("lint", "--statistics", "src/train.py")[1]
    assert [line.split("\t")[:2] for line in out.splitlines()] == [["3", "KL009"], ["1", "KL001"]]


# --- json ------------------------------------------------------------------------------------


def test_json_names_the_rule_and_its_severity(project):
    entries = json.loads(run("lint", "--output-format", "json", "--select", "ALL", "src/more.py")[1])
    assert [(e["code"], e["name"], e["severity"]) for e in entries] == [
        ("KL005", "kl-last-token-only", "error"), ("KL100", RULES["KL100"].name, "info")]


def test_json_tells_a_frameworks_flags_from_the_kl_code():
    """A finding on a framework's flags (TRL's GRPOConfig) names the framework and release it was judged for; one
    on the KL code itself has none, so CI can route the two apart."""
    entries = json.loads(run("lint", "--output-format", "json", str(ROOT / "fixtures/bad/trl_grpo_config.py"),
                             str(ROOT / "fixtures/bad/openrlhf_ppo.py"))[1])
    frameworks = {(Path(e["filename"]).name, e["framework"].split(" ")[0] if e["framework"] else None) for e in entries}
    assert frameworks == {("trl_grpo_config.py", "trl"), ("openrlhf_ppo.py", None)}
    assert all(e["framework"] in e["message"] for e in entries if e["framework"])


# --- sarif -----------------------------------------------------------------------------------


def test_the_schema_rejects_what_it_should():
    """The validation can fail: a log without `version`, or a result with a 0 line, is refused."""
    with pytest.raises(jsonschema.ValidationError):
        validate({"runs": []})
    log = json.loads(format_sarif([Finding("a.py", 1, 1, "KL002", "m", 1, 2)], ReportOptions()))
    validate(log)
    log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"] = 0
    with pytest.raises(jsonschema.ValidationError):
        validate(log)


def test_sarif_of_the_bad_fixtures_validates_and_reports_every_finding(monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, _ = run("lint", "--output-format", "sarif", "fixtures/bad")
    assert code == 1
    log = json.loads(out)
    validate(log)
    [sarif_run] = log["runs"]
    rules = sarif_run["tool"]["driver"]["rules"]
    assert [rule["id"] for rule in rules] == list(RULES)
    assert all(rule["helpUri"].endswith(f"/klaudit/rules/{rule['id']}.md") for rule in rules)
    assert all(rule["name"] == RULES[rule["id"]].name for rule in rules)
    results = sarif_run["results"]
    findings = json.loads(run("lint", "--output-format", "json", "fixtures/bad")[1])
    assert len(results) == len(findings) > 0
    assert Counter(r["ruleId"] for r in results) == Counter(f["code"] for f in findings)
    for result, finding in zip(results, findings):
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        location = result["locations"][0]["physicalLocation"]
        assert location["artifactLocation"]["uri"] == Path(finding["filename"]).relative_to(ROOT).as_posix()
        assert location["region"] == {
            "startLine": finding["location"]["row"], "startColumn": finding["location"]["column"],
            "endLine": finding["end_location"]["row"], "endColumn": finding["end_location"]["column"]}
        assert len(result.get("relatedLocations", [])) == len(finding["related"])
        # the fix travels in both: the same edits, as SARIF replacements and as ruff's JSON edits
        if finding["fix"] is None:
            assert "fixes" not in result and finding["no_fix_reason"]
            continue
        [change] = result["fixes"][0]["artifactChanges"]
        assert change["artifactLocation"] == location["artifactLocation"]
        assert [(r["deletedRegion"], r["insertedContent"]["text"]) for r in change["replacements"]] == [
            ({"startLine": e["location"]["row"], "startColumn": e["location"]["column"],
              "endLine": e["end_location"]["row"], "endColumn": e["end_location"]["column"]}, e["content"])
            for e in finding["fix"]["edits"]]
        assert finding["fix"]["applicability"] == "unsafe"
    assert any("relatedLocations" in result for result in results)
    assert any("fixes" in result for result in results)


def test_sarif_related_places_levels_and_uris(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outside = tmp_path.parent / "elsewhere.py"
    findings = [
        Finding("my dir/a.py", 4, 13, "KL002", "m", 4, 29, fix="f()",
                related=(("my dir/b.py", 3, 5, "estimator computed here"),)),
        Finding(str(outside), 1, 1, "KL099", "not analysed", 1, 2),
    ]
    log = json.loads(format_sarif(findings, ReportOptions()))
    validate(log)
    first, second = log["runs"][0]["results"]
    assert first["level"] == "error" and second["level"] == "note"
    assert first["message"]["text"] == "m\nhelp: f()"
    assert first["locations"][0]["physicalLocation"]["artifactLocation"] == {
        "uri": "my%20dir/a.py", "uriBaseId": "%SRCROOT%"}
    assert first["relatedLocations"] == [{
        "id": 0, "message": {"text": "estimator computed here"},
        "physicalLocation": {"artifactLocation": {"uri": "my%20dir/b.py", "uriBaseId": "%SRCROOT%"},
                             "region": {"startLine": 3, "startColumn": 5}}}]
    assert second["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": outside.as_uri()}
    assert log["runs"][0]["originalUriBaseIds"]["%SRCROOT%"]["uri"] == tmp_path.as_uri() + "/"


def test_the_readme_shows_every_output_format_and_option():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in FORMATTERS:
        assert name == "text" or f"--output-format {name}" in readme
    for option in ("--statistics", "--stdin-filename", "--no-respect-gitignore", "FORCE_COLOR", "NO_COLOR",
                   "--fix --unsafe-fixes", "--diff", "KL101", "no_fix_reason"):
        assert option in readme
