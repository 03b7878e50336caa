"""An EasyR1 copy run by the project's own launches (xwtMarch/RULE-Unlearn, the hundredth fresh set).

Its 19 launches name configs of rollout_batch_size 512 and global_batch_size 128 (four optimizer steps a rollout) and
all override both to 32: one step a rollout. The configs' low_var_kl loss is still a loss (row 4, KL002), but on
fresh samples, so neither the configs' KL008 (row 22) nor the copy's actor's holds. The copy's examples/config.yaml is
upstream EasyR1's example, which no launch of the project names.
"""

from __future__ import annotations

import pytest

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths

CONFIG = """\
data:
  rollout_batch_size: 512

algorithm:
  adv_estimator: grpo
  disable_kl: false
  use_kl_loss: true
  kl_penalty: low_var_kl
  kl_coef: 1.0e-2

worker:
  actor:
    global_batch_size: 128
"""

LAUNCH = """\
#!/bin/bash
python3 -m verl.trainer.main \\
    config=examples/grpo.yaml \\
{overrides}    trainer.n_gpus_per_node=4
"""

ACTOR = """\
import torch


def kl_loss(logp, ref_logp):
    r = ref_logp - logp
    return torch.exp(r) - r - 1


class DataParallelPPOActor:
    def __init__(self, config, optimizer):
        self.config = config
        self.actor_optimizer = optimizer

    def update_policy(self, data):
        for _ in range(self.config.ppo_epochs):
            for mini_batch in data.split(self.config.global_batch_size):
                logp = self.forward(mini_batch)
                ratio = torch.exp(logp - mini_batch["old_log_probs"])
                pg_loss = -(mini_batch["advantages"] * ratio).mean()
                kl = kl_loss(logp, mini_batch["ref_log_probs"]).mean()
                loss = pg_loss + self.config.kl_coef * kl
                loss.backward()
                self.actor_optimizer.step()
"""


def _project(tmp_path, overrides: str, config: str = "grpo.yaml") -> list[tuple[str, int, str]]:
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "grpo.yaml").write_text(CONFIG)
    (tmp_path / "examples" / "config.yaml").write_text(CONFIG)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "run.sh").write_text(LAUNCH.replace("examples/grpo.yaml", f"examples/{config}").format(
        overrides="".join(f"    {override} \\\n" for override in overrides.split())))
    actor = tmp_path / "verl" / "workers" / "actor"
    actor.mkdir(parents=True)
    (actor / "dp_actor.py").write_text(ACTOR)
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)
    return sorted((f.path.rsplit("/", 1)[-1], f.line, f.code) for f in result.findings)


@pytest.mark.parametrize("overrides, expected", [
    # every launch one step a rollout: the loss is on fresh samples, in the config and in the copy's actor
    ("data.rollout_batch_size=32 worker.actor.global_batch_size=32",
     [("dp_actor.py", 6, "KL002"), ("grpo.yaml", 8, "KL002")]),
    # the launch keeps the config's four steps: the config's KL008 is its run's
    ("algorithm.kl_coef=1.0e-2",
     [("dp_actor.py", 6, "KL002"), ("dp_actor.py", 6, "KL008"), ("grpo.yaml", 8, "KL002"), ("grpo.yaml", 13, "KL008")]),
])
def test_a_config_and_the_copy_are_judged_as_the_projects_launches_run_them(tmp_path, overrides, expected):
    assert _project(tmp_path, overrides) == expected


def test_upstreams_config_name_named_by_the_projects_own_launch_is_its_run(tmp_path):
    """Chengsong-Huang/R-Zero (the eighty-ninth set) launches its EasyR1 copy with `config=examples/config.yaml`,
    upstream's config name: that config is the project's run, judged as the launch keeps it."""
    assert _project(tmp_path, "algorithm.kl_coef=1.0e-2", config="config.yaml") == [
        ("config.yaml", 8, "KL002"), ("config.yaml", 13, "KL008"), ("dp_actor.py", 6, "KL002"), ("dp_actor.py", 6, "KL008"),
        ("grpo.yaml", 8, "KL002"), ("grpo.yaml", 13, "KL008")]  # a config of the project's own no launch names
