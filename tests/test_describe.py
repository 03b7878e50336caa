"""The shared vocabulary: one description per configuration, and a legend for every objective name."""

from __future__ import annotations

from click.testing import CliRunner

from klaudit.catalog import CATALOG, Objective
from klaudit.cli import main
from klaudit.describe import LEGEND, OBJECTIVES, describe, explain, legend_footer


def test_every_objective_of_the_catalog_has_a_legend_entry():
    assert set(OBJECTIVES) == {objective.value for objective in Objective}
    assert set(LEGEND) == {*OBJECTIVES, "cos REV"}


def test_distinct_catalog_configurations_have_distinct_descriptions():
    configs = {row.config for row in CATALOG if row.config is not None}
    assert len({describe(config) for config in configs}) == len(configs)


def test_explain_accepts_any_spelling_and_refuses_unknown_names():
    assert explain("pfwd").startswith("PFWD: ") and explain("cos_rev").startswith("cos REV: ")
    assert explain("KL002") is None


def test_footer_lists_the_objectives_present_then_cos_rev():
    lines = legend_footer(["PART", "REV", "PART"])
    assert [line.split()[0] for line in lines] == ["REV", "PART", "cos"]


def test_explain_and_rule_commands():
    runner = CliRunner()
    assert runner.invoke(main, ["explain", "cos", "REV"]).output.startswith("cos REV: cosine")
    assert runner.invoke(main, ["rule", "ZERO"]).output.startswith("ZERO: zero in expectation")
    unknown = runner.invoke(main, ["explain", "KL002"])
    assert unknown.exit_code == 2 and "known: REV, FWD" in unknown.output
    assert len(runner.invoke(main, ["explain"]).output.splitlines()) == len(LEGEND)
    assert "klaudit explain NAME" in runner.invoke(main, ["rules", "--help"]).output
