"""TRL's PPOConfig: the estimator its trainer subtracts from the token rewards before GAE (klaudit.frameworks.trl_ppo).

Verdicts (kl-math.md section 8): k1 in the reward with returns to go is unbiased (row 6); k3 in the reward
(row 7), k2 (row 8), |log-ratio| (row 9) and the detached exact per-step KL (row 10) are KL004.
"""

from __future__ import annotations

import ast

import pytest

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths
from klaudit.lint.fixing import applicabilities, fix_findings


def _findings(tmp_path, source):
    (tmp_path / "train.py").write_text(source)
    return lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings


@pytest.mark.parametrize("imported, call, expected", [
    ("from trl import PPOConfig", 'PPOConfig(model_name="gpt2", kl_penalty="full", ppo_epochs=4)', ["KL004"]),  # row 10
    ("from trl import PPOConfig", 'PPOConfig(kl_penalty="mse")', ["KL004"]),  # row 8
    ("from trl import PPOConfig", 'PPOConfig(kl_penalty="abs")', ["KL004"]),  # row 9
    ("from trl import PPOConfig", 'PPOConfig(kl_penalty="kl")', []),  # row 6
    ("from trl import PPOConfig", 'PPOConfig(kl_penalty="abs", init_kl_coef=0.0)', []),  # no KL
    ("from trl.experimental.ppo import PPOConfig", 'PPOConfig(kl_estimator="k3")', ["KL004"]),  # row 7
    ("import trl", 'trl.PPOConfig(kl_estimator="k3", kl_coef=0.05)', ["KL004"]),
    ("from trl import PPOConfig", 'PPOConfig(kl_estimator="k1")', []),
    ("from trl import PPOConfig", "PPOConfig(learning_rate=1e-5)", []),  # k1 by default
    ("from trl import PPOConfig", 'PPOConfig(kl_estimator="k3", kl_coef=0)', []),
    ("from tunix.rl.ppo.ppo_learner import PPOConfig", 'PPOConfig(kl_method="kl")', []),  # tunix's class: k1
    ("from mylib import PPOConfig", 'PPOConfig(kl_penalty="full")', []),  # another library's class of that name
])
def test_the_estimator_of_the_kl_reward(tmp_path, imported, call, expected):
    assert [f.code for f in _findings(tmp_path, f"{imported}\n\nconfig = {call}\n")] == expected


def test_the_finding_is_at_the_estimator_and_its_fix_sets_k1(tmp_path):
    source = 'from trl import PPOConfig\n\nconfig = PPOConfig(kl_estimator="k3", kl_coef=0.1)\n'
    [finding] = _findings(tmp_path, source)
    assert (finding.line, finding.column) == (3, 20) and "[TRL PPO: kl_estimator=k3, kl_coef=0.1]" in finding.message
    run = fix_findings([finding], applicabilities(unsafe=True), write=True)
    text = (tmp_path / "train.py").read_text()
    ast.parse(text)
    assert 'kl_estimator="k1"' in text and run.fixed == [finding]
    assert _findings(tmp_path, text) == []
