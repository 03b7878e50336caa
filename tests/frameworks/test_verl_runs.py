"""A trainer built on verl judged by the KL estimators the project's verl runs select (klaudit.frameworks.verl_runs).

The trainer hands verl's `kl_penalty` function the estimator named by its configuration: the KL reward's
`algorithm.kl_penalty` (abs, k2 and low_var_kl values in the reward: kl-math.md section 8, rule KL004; k1 with
reward-to-go is right), the KL loss's `kl_loss_type` (k1 as a loss KL001, low_var_kl KL002, k2 and the straight-through
values KL003, abs KL009). Each branch is a verdict of the code; a branch no run of the project selects is not
reported, and verl's default (kl, low_var_kl) always counts, since a launch may leave the key out.
"""

from __future__ import annotations

import pytest

from klaudit.config import Settings
from klaudit.frameworks import verl_runs
from klaudit.lint.engine import lint_paths

TRAINER = '''import torch
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.trainer.ppo.core_algos import kl_penalty


class MyTrainer:
    def fit(self, batch):
        if self.config.algorithm.use_kl_in_reward:
            batch, metrics = apply_kl_penalty(batch, kl_ctrl=self.kl_ctrl, kl_penalty=self.config.algorithm.kl_penalty)
        return batch


class MyActor:
    def update_policy(self, data):
        log_prob = self.actor_module(data["input_ids"]).log_softmax(-1)
        kld = kl_penalty(logprob=log_prob, ref_logprob=data["ref_log_prob"], kl_penalty=self.config.kl_loss_type)
        loss = kld.mean() * self.config.kl_loss_coef
        loss.backward()
'''
REWARD, LOSS = 9, 17  # the lines of the KL reward's and the KL loss's findings
EVERY_BRANCH = [(REWARD, "KL004")] * 3 + [(LOSS, "KL001"), (LOSS, "KL002")] + [(LOSS, "KL003")] * 3 + [(LOSS, "KL009")]
LAUNCH = "python3 -m verl.trainer.main_ppo algorithm.use_kl_in_reward=True actor_rollout_ref.actor.use_kl_loss=True {}\n"


def _trainer_codes(tmp_path, files: dict[str, str], trainer: str = "trainer.py") -> list[tuple[int, str]]:
    for name, text in {trainer: TRAINER, **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    assert result.errors == []
    return sorted((f.line, f.code) for f in result.findings if f.path.endswith(trainer))


def test_without_a_verl_run_every_branch_is_judged(tmp_path):
    assert _trainer_codes(tmp_path, {}) == sorted(EVERY_BRANCH)


@pytest.mark.parametrize("overrides, kept", [
    ("", [(LOSS, "KL002")]),  # both left at verl's defaults: k1 in the reward (right), low_var_kl as a loss
    ("algorithm.kl_penalty=abs actor_rollout_ref.actor.kl_loss_type=k1",
     [(REWARD, "KL004"), (LOSS, "KL001"), (LOSS, "KL002")]),
    ("algorithm.kl_penalty=$KL_TYPE", [(REWARD, "KL004")] * 3 + [(LOSS, "KL002")]),  # computed: any value
    ("actor_rollout_ref.actor.kl_loss_type=k3+", [(LOSS, "KL002"), (LOSS, "KL003")]),
])
def test_a_launch_script_selects_the_branches(tmp_path, overrides, kept):
    assert _trainer_codes(tmp_path, {"run.sh": LAUNCH.format(overrides)}) == sorted(kept)


def test_a_yaml_configuration_selects_the_branches(tmp_path):
    config = "algorithm:\n  use_kl_in_reward: true\n  kl_penalty: mse\nactor_rollout_ref:\n  actor:\n    use_kl_loss: false\n"
    assert _trainer_codes(tmp_path, {"configs/run.yaml": config}) == [(REWARD, "KL004"), (LOSS, "KL002")]


def test_a_python_argument_list_selects_the_branches(tmp_path):
    launcher = ('import subprocess\n\nsubprocess.run(["python3", "-m", "verl.trainer.main_ppo", '
                '"algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=low_var_kl"], check=True)\n')
    assert _trainer_codes(tmp_path, {"launch.py": launcher}) == [(REWARD, "KL004"), (LOSS, "KL002")]


def test_a_project_carrying_a_copy_of_verl_keeps_every_verdict(tmp_path):
    """A fork of verl (its package in the project, its recipes beside it) is configured by every user of it, not by
    the project's launches alone."""
    codes = _trainer_codes(tmp_path, {"run.sh": LAUNCH.format("")}, trainer="verl/trainer/my_trainer.py")
    assert codes == sorted(EVERY_BRANCH)


def test_a_self_contained_copy_of_verls_code_keeps_every_verdict(tmp_path):
    """A trainer that copies verl's estimator switch instead of importing verl is a fork of that code."""
    copied = TRAINER.replace("from verl.trainer.ppo.ray_trainer import apply_kl_penalty\n", '"""verl\'s actor."""\n').replace(
        "from verl.trainer.ppo.core_algos import kl_penalty\n", "from estimators import kl_penalty, apply_kl_penalty\n")
    estimators = '''import torch


def kl_penalty(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    raise NotImplementedError(kl_penalty)


def apply_kl_penalty(data, kl_ctrl, kl_penalty="kl"):
    kld = kl_penalty(data["old_log_probs"], data["ref_log_prob"], kl_penalty=kl_penalty)
    data["token_level_rewards"] = data["token_level_scores"] - kl_ctrl.value * kld
    return data, {}
'''
    files = {"run.sh": LAUNCH.format(""), "estimators.py": estimators}
    assert _trainer_codes(tmp_path, {**files, "trainer_copy.py": copied}, trainer="trainer_copy.py") == [
        (LOSS, "KL001"), (LOSS, "KL009")]


@pytest.mark.parametrize("text, yaml, expected", [
    ("python -m verl.trainer.main_ppo algorithm.kl_penalty=k3 \\\n", False, ["k3"]),
    ('"+algorithm.kl_penalty=\'k2\'",', False, ["k2"]),
    ("algorithm.kl_penalty=${KL}", False, [None]),
    ("algorithm:\n  kl_penalty: abs  # the reward's\n", True, ["abs"]),
    ("kl_penalty: abs\n", False, []),  # a YAML key only in YAML
    ("penalty = self.config.algorithm.kl_penalty\n", False, []),  # read, not written
    ("cfg.algorithm.kl_penalty = 'kl'\n", False, ["kl"]),
])
def test_written_values(text, yaml, expected):
    assert list(verl_runs.written_values(text, "kl_penalty", yaml=yaml)) == expected
