"""Shapes of KL code met in the hundredth fresh set.

ltjed/multiagent-coaching (a MARTI fork, OpenRLHF's trainer) adds a KL loss under `if self.args.use_kl_loss:` and
picks k3 under `if self.args.use_kl_estimator_k3:`; its YAML configs say `use_kl_loss: false` and both launches pass
`default_agent.use_kl_loss=False`, and no Python code switches either on (a keyword that hands the option on,
`use_kl_estimator_k3=self.strategy.args.use_kl_estimator_k3`, is the same option). The branches never run: the
five findings under them (KL001, KL002, KL007, KL008 twice) and the k3 reward's KL004 were false alarms.
"""

from __future__ import annotations

import pytest

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths

TRAINER = """\
import torch


class PPOTrainer:
    def __init__(self, args, actor, optimizer):
        self.args = args
        self.actor = actor
        self.optimizer = optimizer

    def training_step(self, batch):
        logprobs = self.actor(batch.sequences)
        ratio = torch.exp(logprobs - batch.old_logprobs)
        loss = -(batch.advantages * ratio).mean()
        if self.args.use_kl_loss:
            log_ratio = batch.ref_logprobs - logprobs
            kl = torch.exp(log_ratio) - log_ratio - 1
            loss = loss + self.args.kl_coef * kl.mean()
        loss.backward()
        self.optimizer.step()
"""

LAUNCH = """\
#!/bin/bash
python -m train --config-name default \\
    agent.use_kl_loss={launched} \\
    agent.kl_coef=0.01
"""


def _codes(tmp_path, launched: str | None, configured: str, code: str = "",
           test: str = "") -> list[tuple[str, int, str]]:
    (tmp_path / "trainer.py").write_text(TRAINER + code)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "default.yaml").write_text(f"agent:\n  use_kl_loss: {configured}\n  kl_coef: 0.01\n")
    if launched is not None:
        (tmp_path / "run.sh").write_text(LAUNCH.format(launched=launched))
    if test:
        (tmp_path / "test_trainer.py").write_text(test)
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    return sorted((f.path.rsplit("/", 1)[-1], f.line, f.code) for f in result.findings)


ON = [("trainer.py", 17, "KL002"), ("trainer.py", 17, "KL008")]  # k3 as a loss (row 3), on older samples (row 22)


@pytest.mark.parametrize("launched, configured, code, expected", [
    ("False", "false", "", []),  # off wherever the project sets it: the branch never runs
    ("True", "false", "", ON),  # a launch switches it on
    ("False", "true", "", ON),  # so does a config
    # code that may switch it on: the branch may run
    ("False", "false", "\n\ndef build(args):\n    return PPOTrainer(use_kl_loss=True, args=args, actor=None, optimizer=None)\n",
     ON),
    # the option handed on under its own name is the same option
    ("False", "false", "\n\ndef build(args):\n    return dict(use_kl_loss=args.use_kl_loss)\n", []),
    # no launch of the project's own sets it: a library's configs leave the choice to its users
    (None, "false", "", ON),
    ("$USE_KL_LOSS", "false", "", ON),  # a launch's variable may switch it on (rlvr-weak-supervision's train.sh)
])
def test_a_branch_on_a_switch_the_project_turns_off_everywhere_never_runs(tmp_path, launched, configured, code,
                                                                            expected):
    assert _codes(tmp_path, launched, configured, code) == expected


def test_a_switch_a_unit_test_turns_on_is_an_option_the_branch_may_take(tmp_path):
    """NeMo-RL (dev corpus) leaves `use_kl_in_reward: false` in its example configs and tests the branch with
    `use_kl_in_reward=kl_reward`, True in one case: its users may take it."""
    test = "def test_kl_loss():\n    run(use_kl_loss=True)\n"
    assert _codes(tmp_path, "False", "false", test=test) == ON


ENTRY = """\
import argparse

from trainer import PPOTrainer

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--use_kl_loss", action="store_true", default=False)
    parser.add_argument("--kl_coef", type=float, default=0.01)
    args = parser.parse_args()
    PPOTrainer(args, None, None).training_step(None)
"""


@pytest.mark.parametrize("launch, expected", [
    ("python train_ppo.py --kl_coef 0.05\n", []),  # the script's store-true flag, which no launch passes: off
    ("python train_ppo.py --kl_coef 0.05 --use_kl_loss\n", ON),  # a launch passes it
    ("python other.py --kl_coef 0.05\n", ON),  # no launch runs the script that declares it: a library's choice
])
def test_a_store_true_flag_no_launch_of_its_script_passes_is_off(tmp_path, launch, expected):
    """ai-wand/concise-reasoning (fresh104) carries OpenRLHF whose `train_ppo_ray_box.py` declares
    `--use_kl_estimator_k3` (store-true, default False) and whose every launch leaves it out: the k3 branch of the
    copy's KL reward never runs (KL004, a false alarm)."""
    (tmp_path / "trainer.py").write_text(TRAINER)
    (tmp_path / "train_ppo.py").write_text(ENTRY)
    (tmp_path / "run.sh").write_text(launch)
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    assert sorted((f.path.rsplit("/", 1)[-1], f.line, f.code) for f in result.findings) == expected
