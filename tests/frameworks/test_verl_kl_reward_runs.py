"""A copy of verl's KL reward that no run of the project turns on (klaudit.frameworks.verl_runs).

verl's trainer subtracts the KL penalty from the rewards only under `if self.config.algorithm.use_kl_in_reward:`
(default false). ChanTinPing/LLM_RL_basic (seventy-fifth set) keeps an edited copy of that trainer and launches
verl with the KL as a loss only; UniX-AI-Lab/StreamOPD and pavelslab-nyu/rlvr-weak-supervision (sixty-fourth) set
the flag false in every launch. The reward's verdicts there describe code that never runs.
"""

from __future__ import annotations

import pytest

from klaudit.config import Settings
from klaudit.frameworks import verl_runs
from klaudit.lint.engine import lint_paths

TRAINER = """\
import torch


def kl_penalty(logprob, ref_logprob):
    log_ratio = ref_logprob - logprob
    return torch.exp(log_ratio) - log_ratio - 1


def apply_kl_penalty(data, beta):
    kld = kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"])
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - beta * kld
    return data


class Trainer:
    def __init__(self, config):
        self.config = config

    def fit(self, batch, actor):
        if {test}:
            batch = apply_kl_penalty(batch, beta=0.001)
        actor.update(batch)
"""

LAUNCH = "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo {flag}trainer.total_epochs=1\n"


def _reward_findings(tmp_path, test="self.config.algorithm.use_kl_in_reward", flag="", launch=True, extra=None):
    (tmp_path / "ray_trainer.py").write_text(TRAINER.replace("{test}", test))
    if launch:
        (tmp_path / "run.sh").write_text(LAUNCH.replace("{flag}", flag))
    for name, text in (extra or {}).items():
        (tmp_path / name).write_text(text)
    found = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings
    return sorted((f.line, f.code) for f in found if f.path.endswith("ray_trainer.py"))


@pytest.mark.parametrize("flag", ["", "algorithm.use_kl_in_reward=False "])
def test_a_reward_every_launch_leaves_off_is_not_reported(tmp_path, flag):
    assert _reward_findings(tmp_path, flag=flag) == []
    assert _reward_findings(tmp_path, test="self.config.algorithm.use_kl_in_reward and batch is not None") == []


@pytest.mark.parametrize("kwargs", [
    {"flag": "algorithm.use_kl_in_reward=True "},  # a launch turns it on
    {"flag": "algorithm.use_kl_in_reward=$USE_KL "},  # a value the reader cannot resolve
    {"launch": False},  # no launch of verl: a library, or a fork others run
    {"test": "self.config.algorithm.use_kl_in_reward or self.config.always_reward"},  # runs without the flag too
    {"extra": {"config.yaml": "algorithm:\n  use_kl_in_reward: true\n"}},  # a config the project may run turns it on
    {"extra": {"other.py": "from ray_trainer import apply_kl_penalty\n\n\ndef f(b):\n    return apply_kl_penalty(b, 0.1)\n"}},
])
def test_a_reward_some_run_may_turn_on_is_reported(tmp_path, kwargs):
    assert _reward_findings(tmp_path, **kwargs) == [(11, "KL004")]  # k3 values in the reward (row 7)


def test_the_functions_called_only_under_the_flag():
    sources = {"a.py": TRAINER.replace("{test}", "self.config.algorithm.use_kl_in_reward and step > 0"),
               "b.py": "def g(x):\n    if x.use_kl_in_reward:\n        helper(x)\n    helper(x)\n"}
    assert verl_runs.gated_functions(sources) == frozenset({"apply_kl_penalty"})


def test_every_value_must_be_a_literal_false():
    assert verl_runs.reward_always_off(["false", "False"], ["use_kl_in_reward: False\n"], ["# use_kl_in_reward=True\n"])
    assert not verl_runs.reward_always_off([], [], [])
    assert not verl_runs.reward_always_off(["false", None], [], [])
    assert not verl_runs.reward_always_off(["false"], ["use_kl_in_reward: ${oc.env:KL}\n"], [])
    assert not verl_runs.reward_always_off(["false"], [], ["cfg.algorithm.use_kl_in_reward = True\n"])


def test_the_flag_read_again_sets_nothing():
    """Tree-GRPO (fresh102) logs the flag in an f-string (`use_kl_in_reward={self.config.algorithm.use_kl_in_reward}`)
    and a trainer may hand it on as a keyword: neither turns the KL reward on."""
    logged = "pprint(f'kl_fix={x}, use_kl_in_reward={self.config.algorithm.use_kl_in_reward}')\n"
    handed = "build(use_kl_in_reward=config.algorithm.use_kl_in_reward)\n"
    assert verl_runs.reward_always_off(["false"], [], [logged, handed])
    assert not verl_runs.reward_always_off(["false"], [], [logged, "build(use_kl_in_reward=args.kl_reward)\n"])


def test_a_launch_built_as_a_python_list_counts_as_a_run(tmp_path):
    launcher = ('import subprocess, sys\n\ncmd = [sys.executable, "-m", "verl.trainer.main_ppo",\n'
                '       "algorithm.adv_estimator=grpo",\n{flag}]\nsubprocess.run(cmd)\n')
    assert _reward_findings(tmp_path, launch=False, extra={"launch.py": launcher.replace("{flag}", "")}) == []
    on = launcher.replace("{flag}", '       "algorithm.use_kl_in_reward=True",\n')
    assert _reward_findings(tmp_path, launch=False, extra={"launch.py": on}) == [(11, "KL004")]
