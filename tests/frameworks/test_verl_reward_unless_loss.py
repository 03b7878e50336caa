"""Copies of verl from before `algorithm.use_kl_in_reward` (TinyZero's verl 0.1 and the projects built on it).

Their trainer subtracts the detached KL penalty (`kl_penalty`, default kl = k1) from the token rewards whenever
`actor.use_kl_loss` is false, and main_ppo always builds the reference: a PPO launch has the k1 reward on by
default (`kl_ctrl.kl_coef` 0.001). Row 6 on-policy (GAE's reward-to-go) is right; over several optimizer steps
per rollout the reward meets only PPO's token ratio, row 23 (KL008, kl-math.md §8).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from klaudit.config import Settings
from klaudit.frameworks import verl
from klaudit.lint.engine import lint_paths

TRAINER = """\
def fit(self):
    for batch in self.train_dataloader:
        with _timer('adv', timing_raw):
            # compute rewards. apply_kl_penalty if available
            if not self.config.actor_rollout_ref.actor{test}:
                # the reward minus the KL
                batch, kl_metrics = apply_kl_penalty(batch, kl_ctrl=self.kl_ctrl, kl_penalty=self.config.algorithm.kl_penalty)
"""
MAIN = """\
role_worker_mapping = {{
    Role.ActorRollout: ray.remote(ActorRolloutRefWorker),
    Role.Critic: ray.remote(CriticWorker),
    {reference}Role.RefPolicy: ray.remote(ActorRolloutRefWorker)
}}
"""
CONFIG = "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 256\n    use_kl_loss: False\n"
PPO = ("python3 -m verl.trainer.main_ppo data.train_batch_size=256 actor_rollout_ref.actor.ppo_mini_batch_size={mini} "
       "{more}critic.optim.lr=1e-5 trainer.total_epochs=15\n")


def _project(tmp_path: Path, test: str = ".use_kl_loss", reference: str = "", megatron_config: str = "") -> Path:
    """A project holding a verl 0.1-style copy (its trainer, main_ppo and configs) and a scripts/ folder."""
    trainer = tmp_path / "verl" / "trainer"
    (trainer / "ppo").mkdir(parents=True)
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(name='tinyzero')\n")
    (trainer / "config").mkdir()
    (tmp_path / "verl" / "version").mkdir()
    (tmp_path / "verl" / "version" / "version").write_text("0.1")
    (trainer / "ppo" / "ray_trainer.py").write_text(TRAINER.format(test=test))
    (trainer / "main_ppo.py").write_text(MAIN.format(reference=reference))
    (trainer / "config" / "ppo_trainer.yaml").write_text(CONFIG)
    (trainer / "config" / "ppo_megatron_trainer.yaml").write_text(megatron_config or "actor_rollout_ref:\n  actor:\n")
    (tmp_path / "scripts").mkdir()
    return tmp_path


def _codes(root: Path, launch: str) -> list[str]:
    script = root / "scripts" / "train.sh"
    script.write_text(launch)
    result = lint_paths([str(script)], settings=Settings(root=root), jobs=1)
    return sorted(f.code for f in result.findings)


@pytest.mark.parametrize("mini, more, expected", [
    (128, "", ["KL008"]),  # 256 / 128: two optimizer steps on one k1 reward (row 23)
    (256, "", []),  # one step per rollout: k1 with reward-to-go, on-policy (row 6)
    (128, "algorithm.kl_ctrl.kl_coef=0 ", []),  # the KL is off
    (128, "actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_type=low_var_kl ",
     ["KL002", "KL008"]),  # the loss replaces the reward: clamped k3 as a loss over two steps (rows 3-4, 22)
    (128, "algorithm.kl_penalty=low_var_kl ", ["KL004", "KL008"]),  # k3 in the reward (row 7)
])
def test_a_ppo_launch_of_a_verl_0_1_copy_has_the_kl_reward_on_unless_the_loss_is(tmp_path, mini, more, expected):
    assert _codes(_project(tmp_path), PPO.format(mini=mini, more=more)) == expected


def test_the_message_says_why_the_reward_is_on(tmp_path):
    root = _project(tmp_path)
    (root / "scripts" / "train.sh").write_text(PPO.format(mini=128, more=""))
    [finding] = lint_paths([str(root / "scripts")], settings=Settings(root=root), jobs=1).findings
    assert "the KL in the reward since use_kl_loss is false" in finding.message
    assert "use_kl_in_reward" not in finding.message.split("(this copy")[0]


@pytest.mark.parametrize("test", [".use_kl_loss", ".get('use_kl_loss', False)"])
def test_both_spellings_of_the_test_are_read(tmp_path, test):
    assert verl.reward_follows_loss_flag(_project(tmp_path, test=test))


def test_a_copy_whose_reference_is_commented_out_has_no_kl_reward(tmp_path):
    """Skywork-OR1's main_ppo comments the reference out of its role mapping: no reference, no KL."""
    root = _project(tmp_path, reference="# ")
    assert not verl.reward_follows_loss_flag(root)
    assert _codes(root, PPO.format(mini=128, more="")) == []


def test_a_megatron_launch_fails_where_its_config_has_no_use_kl_loss(tmp_path):
    """TinyZero's ppo_megatron_trainer.yaml has no actor.use_kl_loss: in struct mode the trainer's test raises
    before the first update, so a Megatron launch trains no KL; a Megatron config that has the key does."""
    launch = PPO.format(mini=128, more="actor_rollout_ref.actor.strategy=megatron ")
    assert _codes(_project(tmp_path), launch) == []
    other = _project(tmp_path / "other", megatron_config="actor_rollout_ref:\n  actor:\n    use_kl_loss: False\n")
    assert _codes(other, launch) == ["KL008"]


def test_the_copys_own_configs_are_defaults_not_runs(tmp_path):
    root = _project(tmp_path)
    result = lint_paths([str(root)], settings=Settings(root=root), jobs=1)
    assert [f for f in result.findings if f.path.endswith(".yaml")] == []


def test_a_current_copy_reads_use_kl_in_reward(tmp_path):
    """A copy whose trainer tests `algorithm.use_kl_in_reward` keeps that flag's default (off)."""
    root = _project(tmp_path)
    (root / "verl" / "trainer" / "ppo" / "ray_trainer.py").write_text(
        "if self.config.algorithm.use_kl_in_reward:\n    batch, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl)\n")
    assert _codes(root, PPO.format(mini=128, more="")) == []


def test_the_copys_own_default_of_use_kl_loss_decides_where_the_kl_goes(tmp_path):
    """GAIR-NLP/DeepResearcher's copy of verl 0.1 defaults `actor.use_kl_loss` to true (low_var_kl): a launch that
    does not set it trains the clamped k3 as a loss (rows 3-4, KL002; over two steps per rollout row 22, KL008),
    not the k1 reward."""
    root = _project(tmp_path)
    config = root / "verl" / "trainer" / "config" / "ppo_trainer.yaml"
    config.write_text(CONFIG.replace("use_kl_loss: False", "use_kl_loss: True\n    kl_loss_type: low_var_kl"))
    assert _codes(root, PPO.format(mini=128, more="")) == ["KL002", "KL008"]
    assert _codes(root, PPO.format(mini=128, more="actor_rollout_ref.actor.use_kl_loss=False ")) == ["KL008"]


def test_a_notebooks_shell_launch_is_read_as_a_scripts(tmp_path):
    """verl's getting-started notebook launches main_ppo from a `!` line: the copy it runs puts the k1 reward in
    by default, over 256 / 64 = four steps per rollout (row 23), reported at the cell's mini-batch flag without
    a flag fix (the edit would be one of the notebook's JSON, not of the shell text)."""
    import json

    root = _project(tmp_path)
    cell = ["!python3 -m verl.trainer.main_ppo \\\n", "  data.train_batch_size=256 \\\n",
            "  actor_rollout_ref.actor.ppo_mini_batch_size=64 \\\n", "  algorithm.kl_ctrl.kl_coef=0.001\n"]
    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "source": cell, "outputs": [], "execution_count": None}],
                "metadata": {"kernelspec": {"language": "python", "name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}
    path = root / "scripts" / "getting_started.ipynb"
    path.write_text(json.dumps(notebook))
    [finding] = lint_paths([str(path)], settings=Settings(root=root), jobs=1).findings
    assert (finding.code, finding.line) == ("KL008", 3) and finding.autofix is None
    assert "the KL in the reward since use_kl_loss is false" in finding.message
