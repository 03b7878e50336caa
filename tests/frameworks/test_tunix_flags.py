"""tunix's algorithm configurations (google/tunix, JAX), read without running them and judged by the catalog.

tunix's GRPO loss adds beta * compute_kl_divergence(logp, ref, kl_loss_mode) per token, aggregated with
`loss_agg_mode`. From 0.1.7 kl_loss_mode defaults to "kl": k1 differentiated as a loss (kl-math.md §8,
row 1; with the default per-sequence token-mean, row 1b), "mse_kl" is k2 (row 2: KL003), "low_var_kl" a
plain k3 (row 3: KL002); before 0.1.7 the term is always k3. The default "sequence-mean-token-mean" divides
each sequence's KL by its length (row 21: KL007); before 0.1.4, loss_algo="grpo" took the batch's
token-mean. num_iterations > 1 reuses rollouts with no weight on the KL (row 22: KL008). PPO subtracts
beta * the kl_method estimate (default "low_var_kl") from the token rewards: k3 in the reward (row 7:
KL004); "kl" is k1 in the reward (row 6, unbiased). A clamp (kl_clamp_value) is KL010.
"""

from __future__ import annotations

import ast

import pytest

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths
from klaudit.lint.fixing import applicabilities, fix_findings

GRPO = "from tunix.rl.grpo.grpo_learner import GRPOConfig\n\nconfig = {}\n"


def _findings(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings


def _codes(tmp_path, files):
    return sorted((f.path.rsplit("/", 1)[-1], f.line, f.code) for f in _findings(tmp_path, files))


@pytest.mark.parametrize("call, expected", [
    ("GRPOConfig(num_generations=4, beta=0.08)", ["KL001"]),  # k1 loss, 1/L: row 1b, one rule
    ("GRPOConfig(num_generations=4)", ["KL001"]),  # beta defaults to 0.04
    ("GRPOConfig(beta=0.0)", []),
    ('GRPOConfig(beta=0.08, kl_loss_mode="mse_kl")', ["KL003", "KL007"]),
    ('GRPOConfig(beta=0.08, kl_loss_mode="low_var_kl")', ["KL002", "KL007"]),
    ('GRPOConfig(beta=0.08, kl_loss_mode="low_var_kl", loss_agg_mode="token-mean")', ["KL002"]),
    ('GRPOConfig(beta=0.08, kl_loss_mode="low_var_kl", loss_agg_mode="seq-mean-token-sum")', ["KL002"]),
    ('GRPOConfig(beta=0.08, loss_agg_mode="token-mean", num_iterations=2)', ["KL001", "KL008"]),
    ('GRPOConfig(beta=0.08, loss_agg_mode="token-mean", kl_clamp_value=10.0)', ["KL001", "KL010"]),
    ('GRPOConfig(beta=0.08, kl_loss_mode="k3")', []),  # not a mode tunix knows: undecided
    ("GRPOConfig(beta=BETA_FROM_ELSEWHERE)", []),  # a value the code computes
    ("GRPOConfig(**settings)", []),
])
def test_grpo_configurations_of_tunix_0_1_7(tmp_path, call, expected):
    found = _codes(tmp_path, {"train.py": GRPO.format(call)})
    assert [code for _, _, code in found] == expected


@pytest.mark.parametrize("imported, call, expected", [
    ("from tunix.rl.grpo.dapo_learner import DAPOConfig", "DAPOConfig()", []),  # beta None: no KL term
    ("from tunix.rl.grpo.dapo_learner import DAPOConfig", "DAPOConfig(beta=0.1)", ["KL001"]),  # token-mean
    ("from tunix.rl.grpo.drgrpo_learner import DrGRPOConfig", "DrGRPOConfig(beta=0.1)", ["KL001"]),
    ("from tunix.rl.grpo.drgrpo_learner import DrGRPOConfig",  # a constant divisor: the scale only
     'DrGRPOConfig(beta=0.1, kl_loss_mode="low_var_kl")', ["KL002"]),
    ("from tunix.rl.ppo.ppo_learner import PPOConfig", "PPOConfig()", ["KL004"]),  # k3 in the rewards
    ("from tunix.rl.ppo.ppo_learner import PPOConfig", 'PPOConfig(kl_method="mse_kl")', ["KL004"]),
    ("from tunix.rl.ppo.ppo_learner import PPOConfig", 'PPOConfig(kl_method="kl")', []),  # row 6
    ("from tunix.rl.ppo.ppo_learner import PPOConfig", 'PPOConfig(kl_method="kl", kl_clamp_value=5.0)', ["KL010"]),
    ("from tunix.rl.ppo.ppo_learner import PPOConfig", "PPOConfig(beta=0.0)", []),
    ("from tunix import AgenticGRPOConfig", "AgenticGRPOConfig(beta=0.08)", ["KL001"]),
    ("from tunix.rl.agentic import agentic_grpo_learner",  # rollouts of an older policy
     'agentic_grpo_learner.GRPOConfig(beta=0.08, loss_agg_mode="token-mean", off_policy_steps=2)', ["KL001", "KL008"]),
    ("import tunix.rl.grpo.grpo_learner as gl", "gl.GRPOConfig(beta=0.08)", ["KL001"]),
    ("from tunix.rl.grpo.grpo_learner import GRPOConfig as TunixConfig", "TunixConfig(beta=0.08)", ["KL001"]),
    # a comment before the names of a parenthesised import (tunix's modules are untyped: tunix-agents)
    ("from tunix.rl.agentic.agentic_grpo_learner import (  # type: ignore[import-untyped]\n    GRPOConfig,\n)",
     'GRPOConfig(beta=0.08, loss_agg_mode="token-mean")', ["KL001"]),
])
def test_the_classes_of_tunix_and_how_they_are_imported(tmp_path, imported, call, expected):
    found = _codes(tmp_path, {"train.py": f"{imported}\n\nconfig = {call}\n"})
    assert [code for _, _, code in found] == expected


def test_a_tunix_module_s_class_is_not_read_as_trls(tmp_path):
    """`grpo_learner.GRPOConfig(...)` was judged as TRL's GRPOConfig (ratio*k3, KL003); it is tunix's k3."""
    source = ("from tunix.rl.grpo import grpo_learner\n\n"
              'config = grpo_learner.GRPOConfig(beta=0.08, kl_loss_mode="low_var_kl", loss_agg_mode="token-mean")\n')
    found = _findings(tmp_path, {"train.py": source})
    assert [(f.line, f.code) for f in found] == [(3, "KL002")]
    assert "[tunix 0.1.7: beta=0.08, kl_loss_mode=low_var_kl, loss_agg_mode=token-mean, num_iterations=1 (default)]" \
        in found[0].message


@pytest.mark.parametrize("pin, expected", [
    ("google-tunix==0.1.7", ["KL001"]),  # kl_loss_mode="kl" by default
    ("google-tunix==0.1.6", ["KL002", "KL007"]),  # always k3, per-sequence token-mean by default
    ("google-tunix==0.1.4", ["KL002", "KL007"]),
    ("google_tunix==0.1.3", ["KL002"]),  # before loss_agg_mode: loss_algo="grpo" took the batch's token-mean
])
def test_the_release_decides_the_estimator_and_the_aggregation(tmp_path, pin, expected):
    found = _codes(tmp_path, {"requirements.txt": f"jax\n{pin}\n", "train.py": GRPO.format("GRPOConfig(beta=0.08)")})
    assert [code for _, _, code in found] == expected


def test_a_key_the_release_lacks_is_named_as_its_fixed_behaviour(tmp_path):
    (tmp_path / "requirements.txt").write_text("google-tunix==0.1.5\n")
    (tmp_path / "train.py").write_text(GRPO.format("GRPOConfig(beta=0.08)"))
    [first, *_] = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    assert "kl_loss_mode=low_var_kl (fixed before 0.1.7), loss_agg_mode=sequence-mean-token-mean (default)" in first.message


def test_before_0_1_4_gspo_token_averages_per_sequence(tmp_path):
    call = 'GRPOConfig(beta=0.08, loss_algo="gspo-token")'
    found = _codes(tmp_path, {"requirements.txt": "google-tunix==0.1.2\n", "train.py": GRPO.format(call)})
    assert [code for _, _, code in found] == ["KL002", "KL007"]


def test_a_notebook_that_installs_an_old_release(tmp_path):
    notebook = ('{"cells": [{"cell_type": "code", "source": ["!pip install -q google-tunix==0.1.3"]},'
                ' {"cell_type": "code", "source": ["from tunix.rl.grpo.grpo_learner import GRPOConfig\\n",'
                ' "config = GRPOConfig(beta=0.08)"]}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    found = _findings(tmp_path, {"grpo.ipynb": notebook})
    assert [f.code for f in found] == ["KL002"]
    assert "tunix 0.1.0 (0.1.3 in the notebook's pip install)" in found[0].message


def test_module_constants_set_the_keywords(tmp_path):
    """Notebooks write `BETA = 0.08` in one cell and `GRPOConfig(beta=BETA)` in another."""
    source = ('from tunix.rl.grpo import grpo_learner\n\nBETA = 0.08\nMODE = "mse_kl"\n\n'
              "config = grpo_learner.GRPOConfig(beta=BETA, kl_loss_mode=MODE)\n")
    found = _findings(tmp_path, {"train.py": source})
    assert sorted(f.code for f in found) == ["KL003", "KL007"]
    assert "beta=0.08 (BETA = 0.08 at line 3), kl_loss_mode=mse_kl (MODE = mse_kl at line 4)" in found[0].message


@pytest.mark.parametrize("text", [
    "BETA = 0.08\nBETA = 0.0\n",  # bound twice: which one reaches the call is not read
    "BETA = 0.08\nfor BETA in (0.0,):\n    pass\n",
    "BETA = 0.08\ndef reset():\n    global BETA\n    BETA = 0.0\n",
])
def test_a_name_bound_more_than_once_is_no_constant(tmp_path, text):
    source = f"from tunix.rl.grpo import grpo_learner\n{text}\nconfig = grpo_learner.GRPOConfig(beta=BETA)\n"
    assert _codes(tmp_path, {"train.py": source}) == []


def test_a_function_s_own_name_hides_the_module_constant(tmp_path):
    source = ("from tunix.rl.grpo import grpo_learner\nBETA = 0.08\n\n"
              "def build(BETA=0.0):\n    return grpo_learner.GRPOConfig(beta=BETA)\n")
    assert _codes(tmp_path, {"train.py": source}) == []


def test_the_command_line_config_sections(tmp_path):
    """tunix.cli.grpo_main fills GRPOConfig from `grpo_config` (the agentic one from `agentic_grpo_config`) of
    its YAML configs and `grpo_config.key=value` overrides."""
    yaml = ("model_config:\n  model_name: gemma3-1b\nreward_functions:\n  - tunix/cli/reward_fn/gsm8k.py\n"
            "grpo_config:\n  num_generations: 2\n  num_iterations: 1\n  beta: 0.08\n"
            "agentic_grpo_config:\n  beta: 0.08\n  kl_loss_mode: low_var_kl\n  loss_agg_mode: token-mean\n")
    script = ("#!/bin/bash\npython3 -m tunix.cli.grpo_main \\\n  base_config.yaml \\\n"
              "  grpo_config.num_iterations=2 \\\n  grpo_config.beta=0.08\n")
    assert _codes(tmp_path, {"configs/run.yaml": yaml, "run.sh": script}) == [
        ("run.sh", 4, "KL008"), ("run.sh", 5, "KL001"), ("run.yaml", 8, "KL001"), ("run.yaml", 10, "KL002")]


def test_a_grpo_config_section_outside_tunix_is_not_read(tmp_path):
    yaml = "grpo_config:\n  beta: 0.08\n  num_generations: 4\n"
    assert _codes(tmp_path, {"train.yaml": yaml}) == []


@pytest.mark.parametrize("source, fixed", [
    ('from tunix.rl.ppo.ppo_learner import PPOConfig\n\nconfig = PPOConfig(beta=0.04, kl_method="low_var_kl")\n',
     'kl_method="kl"'),
    ('from tunix.rl.grpo.grpo_learner import GRPOConfig\n\n'
     'config = GRPOConfig(beta=0.04, kl_loss_mode="low_var_kl", loss_agg_mode="sequence-mean-token-mean")\n',
     'loss_agg_mode="token-mean"'),
])
def test_the_flag_fixes_apply_and_relint_clean_of_their_code(tmp_path, source, fixed):
    before = _findings(tmp_path, {"train.py": source})
    run = fix_findings(before, applicabilities(unsafe=True), write=True)
    text = (tmp_path / "train.py").read_text()
    ast.parse(text)
    assert fixed in text
    after = {f.code for f in lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings}
    assert not after & {f.code for f in run.fixed}
    assert after <= {f.code for f in before}
