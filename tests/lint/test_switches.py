"""Pinned switch values (`[tool.klaudit] switches`, `--switch NAME=VALUE`): a user who runs one
value of a framework switch is judged on that value's code path only."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from klaudit import cli
from klaudit.config import ConfigError, Settings, parse_switch, settings_from_table
from klaudit.lint.engine import lint_paths
from klaudit.lint.facts import pinned_values_hold

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
# verl's actor: the KL loss is chosen by kl_loss_type under `if use_kl_loss:` (line 120 is the sink)
ACTOR = str(FIXTURES / "bad" / "verl_dp_actor.py")


def codes_at_sink(settings: Settings) -> set[str]:
    return {f.code for f in lint_paths([ACTOR], settings=settings).findings if f.line == 120}


def test_without_a_pin_every_value_of_the_switch_is_judged():
    assert codes_at_sink(Settings()) == {"KL001", "KL002", "KL003", "KL008", "KL009"}


@pytest.mark.parametrize("pins, expected", [
    # k1 as a loss: zero gradient (row 1), on samples from an older policy (row 22)
    ({"kl_loss_type": ("k1",)}, {"KL001", "KL008"}),
    # low_var_kl as a loss: the per-token forward KL (rows 3/4); the off-policy finding has no switch value
    ({"kl_loss_type": ("low_var_kl",)}, {"KL002", "KL008"}),
    ({"kl_loss_type": ("abs", "k2")}, {"KL009", "KL003", "KL008"}),
    ({"use_kl_loss": (False,)}, set()),  # the loss branch never runs
    ({"an_unrelated_switch": ("x",)}, {"KL001", "KL002", "KL003", "KL008", "KL009"}),
])
def test_a_pin_keeps_only_the_findings_of_the_values_it_names(pins, expected):
    assert codes_at_sink(Settings(switches=pins)) == expected


def test_pins_match_literals_patterns_and_typed_values():
    assert pinned_values_hold((("mode", ("kl", "k1")),), {"mode": ("k1",)})
    assert not pinned_values_hold((("mode", ("kl", "k1")),), {"mode": ("k3",)})
    assert pinned_values_hold((("mode", ("*+",)),), {"mode": ("k3+",)})  # an endswith("+") branch
    assert not pinned_values_hold((("mode", ("*+",)),), {"mode": ("kl",)})
    assert not pinned_values_hold((("use_kl", (True,)),), {"use_kl": (1,)})  # 1 is no boolean
    assert pinned_values_hold((("use_kl", (True,)),), {"other": ("x",)})


def test_switches_from_the_configuration_file(tmp_path):
    settings = settings_from_table({"switches": {"kl_loss_type": "k1", "use_kl_loss": True,
                                                 "kl_penalty": ["kl", "k1"]}}, tmp_path / "pyproject.toml")
    assert settings.switches == {"kl_loss_type": ("k1",), "use_kl_loss": (True,), "kl_penalty": ("kl", "k1")}
    assert settings.with_overrides(switches={"kl_loss_type": ("k3",)}).switches["kl_loss_type"] == ("k3",)


@pytest.mark.parametrize("table", [{"switches": ["k1"]}, {"switches": {"a": []}}, {"switches": {"a": 0.5}},
                                   {"switches": {"a": {"b": 1}}}])
def test_bad_switches_are_configuration_errors(tmp_path, table):
    with pytest.raises(ConfigError, match="switches"):
        settings_from_table(table, tmp_path / "pyproject.toml")


@pytest.mark.parametrize("text, expected", [
    ("kl_loss_type=k1", ("kl_loss_type", "k1")), ("use_kl_loss=True", ("use_kl_loss", True)),
    ("use_kl_loss=false", ("use_kl_loss", False)), ("ppo_epochs=2", ("ppo_epochs", 2)),
    ("kl_penalty='low_var_kl'", ("kl_penalty", "low_var_kl")),
])
def test_the_command_line_form(text, expected):
    assert parse_switch(text) == expected


def test_the_command_line_pins_and_rejects_a_malformed_pin():
    runner = CliRunner()
    pinned = runner.invoke(cli.main, ["lint", "--output-format", "concise", "--switch", "kl_loss_type=k1", ACTOR])
    assert pinned.exit_code == 1
    assert {line.split()[1] for line in pinned.output.splitlines() if ":120:" in line} == {"KL001", "KL008"}
    clean = runner.invoke(cli.main, ["lint", "--switch", "use_kl_loss=false", "--select", "KL001,KL002", ACTOR])
    assert clean.exit_code == 0, clean.output
    bad = runner.invoke(cli.main, ["lint", "--switch", "kl_loss_type", ACTOR])
    assert bad.exit_code == 2 and "NAME=VALUE" in bad.output and "Traceback" not in bad.output
