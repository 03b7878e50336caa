"""A branch of an OpenRLHF copy's KL switch that none of the project's launches selects (openrlhf.run_choices).

OpenDFM/RetroDFM-R (ninety-third set) carries OpenRLHF in `train/` and trains with its own scripts, each passing
`--use_kl_loss --kl_estimator k3`: the copy's k1 and k2 branches of the actor's KL loss (rows 1 and 2) never run,
nor does its KL reward, which the KL loss turns off. OpenRLHF's own repository is a library: every branch is judged.
"""

from __future__ import annotations

import pytest

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths

UTILS = """\
def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    if kl_estimator == "k1":
        log_ratio = log_probs - log_probs_base
    if kl_estimator == "k2":
        log_ratio = (log_probs - log_probs_base) ** 2 / 2.0
    if kl_estimator == "k3":
        log_ratio = -(log_probs - log_probs_base)
        log_ratio = log_ratio.exp() - 1 - log_ratio
    return log_ratio
"""
ACTOR = """\
from openrlhf.models.utils import compute_approx_kl


class PolicyTrainer:
    def __init__(self, args, actor, optimizer):
        self.args, self.actor, self.optimizer = args, actor, optimizer

    def training_step(self, experience):
        log_probs = self.actor(experience.sequences)
        actor_loss = -(log_probs * experience.advantages).mean()
        if self.args.use_kl_loss:
            kl = compute_approx_kl(log_probs, experience.base_log_probs, kl_estimator=self.args.kl_estimator)
            kl_loss = (kl * experience.action_mask).sum() / experience.action_mask.sum()
        else:
            kl_loss = 0
        loss = actor_loss + kl_loss * 0.001
        loss.backward()
        self.optimizer.step()
"""
LAUNCH = "python3 -m openrlhf.cli.train_ppo_ray \\\n   --pretrain Qwen/Qwen2.5-7B \\\n{flags}   --save_path out\n"


def _codes(root, copy, launch):
    checkout = root / copy
    (root / "setup.py").write_text("from setuptools import setup\n\nsetup(name='app')\n")
    if copy:
        checkout.mkdir()
    for module, text in {"models/utils.py": UTILS, "trainer/ppo_actor.py": ACTOR, "cli/train_ppo_ray.py": "",
                         "__init__.py": ""}.items():
        (checkout / "openrlhf" / module).parent.mkdir(parents=True, exist_ok=True)
        (checkout / "openrlhf" / module).write_text(text)
    scripts = checkout / "examples" / "scripts"
    scripts.mkdir(parents=True)
    (scripts / "train_ppo.sh").write_text(launch)
    result = lint_paths([str(root)], settings=Settings(root=root), jobs=1)
    return sorted({f.code for f in result.findings if f.path.endswith("ppo_actor.py")})


@pytest.mark.parametrize("flags, codes", [
    ("   --use_kl_loss \\\n   --kl_estimator k3 \\\n", ["KL002"]),  # k3 as a loss (row 3) alone
    ("   --use_kl_loss \\\n", ["KL001"]),  # OpenRLHF's default estimator, k1 (row 1)
    ("   --use_kl_loss \\\n   --kl_estimator $EST \\\n", ["KL001", "KL002", "KL003"]),  # computed: any
])
def test_a_copys_branches_no_launch_selects_are_left_out(tmp_path, flags, codes):
    assert _codes(tmp_path, "train", LAUNCH.format(flags=flags)) == codes


def test_openrlhf_itself_keeps_every_branch(tmp_path):
    """The copy is the linted project: OpenRLHF's repository (or a fork), whose example launches a user picks from."""
    (tmp_path / "setup.py").write_text("")
    launch = LAUNCH.format(flags="   --use_kl_loss \\\n   --kl_estimator k3 \\\n")
    assert _codes(tmp_path, "", launch) == ["KL001", "KL002", "KL003"]


@pytest.mark.parametrize("entry, codes", [
    ("from openrlhf.trainer.ray import PPORayActorGroup\n", ["KL002"]),  # its own entry over the copy: its run
    ("import torch\n", ["KL001"]),  # a module that does not build on OpenRLHF: no launch of it
])
def test_the_projects_own_entry_over_the_copy_is_its_run_and_upstreams_examples_are_not(tmp_path, entry, codes):
    """Alex-Gurung/ReasoningNCP (hundred-and-sixth set) carries OpenRLHF in `rl_training/openrlhf/` and launches its
    own `python3 -m train_ncp` (a module importing OpenRLHF) with `--use_kl_loss --kl_estimator k3`: that is the
    project's run, and the k1 of upstream's examples, kept in the copy, selects nothing."""
    (tmp_path / "train_ncp.py").write_text(entry)
    (tmp_path / "train.sh").write_text("ray job submit -- python3 -m train_ncp \\\n   --use_kl_loss \\\n"
                                       "   --kl_estimator k3\n")
    assert _codes(tmp_path, "openrlhf_repo", LAUNCH.format(flags="   --use_kl_loss \\\n")) == codes
