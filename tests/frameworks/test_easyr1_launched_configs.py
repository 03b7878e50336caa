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


def _project(tmp_path, overrides: str, config: str = "grpo.yaml", entry: str = "verl.trainer.main"
             ) -> list[tuple[str, int, str]]:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "grpo.yaml").write_text(CONFIG)
    (tmp_path / "examples" / "config.yaml").write_text(CONFIG)
    (tmp_path / "scripts").mkdir()
    launch = LAUNCH.replace("examples/grpo.yaml", f"examples/{config}").replace("verl.trainer.main", entry)
    (tmp_path / "scripts" / "run.sh").write_text(launch.format(
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


def test_a_forks_own_entry_point_is_an_easyr1_launch(tmp_path):
    """ridwanctg10/shuffle-r1 (fresh102) runs its EasyR1 fork as `python3 -m shuffle_r1.main config=examples/...`,
    a copy of EasyR1's entry point in a package of its own, and every launch sets `algorithm.kl_coef=0.0`: the
    config's KL loss never trains, so neither the config nor the copy's actor reports anything; the same launch with
    the config's own coefficient keeps the findings of both."""
    assert _project(tmp_path, "algorithm.kl_coef=0.0", entry="shuffle_r1.main") == []
    on = _project(tmp_path / "on", "algorithm.kl_coef=1.0e-2", entry="shuffle_r1.main")
    assert on == [("dp_actor.py", 6, "KL002"), ("dp_actor.py", 6, "KL008"), ("grpo.yaml", 8, "KL002"),
                  ("grpo.yaml", 13, "KL008")]


@pytest.mark.parametrize("overrides", ["algorithm.kl_coef=0", "algorithm.disable_kl=true"])
def test_launches_that_all_weigh_the_kl_by_zero_leave_the_copys_kl_code_untrained(tmp_path, overrides):
    """Every launch of the project weighs the KL by 0 (loss and reward share `algorithm.kl_coef`) or disables it: the
    copy's actor differentiates its k3 times 0 in every run, so nothing there is reported."""
    assert _project(tmp_path, overrides) == []


@pytest.mark.parametrize("values, weightless", [
    ({"algorithm.disable_kl": "false", "algorithm.kl_coef": "0.0"}, True),
    ({"algorithm.disable_kl": "false", "algorithm.kl_coef": "1e-2"}, False),
    ({"algorithm.disable_kl": "false"}, False),  # the default coefficient, 1e-3
    ({"algorithm.disable_kl": "true", "algorithm.kl_coef": "1e-2"}, True),
    ({"algorithm.kl_coef": "${KL}"}, False),  # computed at run time: not known to be 0
    # the first releases: the actor's own coefficient weighs the loss, `algorithm.kl_coef` the reward
    ({"worker.actor.use_kl_loss": "true", "worker.actor.kl_loss_coef": "0", "algorithm.kl_coef": "1e-2"}, True),
    ({"worker.actor.use_kl_loss": "true", "algorithm.kl_coef": "0"}, False),
    ({"worker.actor.use_kl_loss": "false", "algorithm.kl_coef": "0"}, True),
])
def test_weighs_no_kl_reads_the_coefficient_of_the_place_the_kl_goes(values, weightless):
    from klaudit.frameworks import easyr1
    from klaudit.frameworks.settings import Setting

    settings = {key: Setting(None if value.startswith("$") else value, 1, 1, 2) for key, value in values.items()}
    assert easyr1.weighs_no_kl(settings) is weightless


def test_a_launch_naming_a_config_the_project_lacks_is_no_run(tmp_path):
    """bbwen/easyr1_cr (fresh103) renamed EasyR1's examples/config.yaml and kept upstream's launches that name it:
    they stop before they train. Its own launch takes one step a rollout, so the copy's KL loss is on fresh samples
    (no KL008), though a launch of the missing config, at EasyR1's defaults, would take two."""
    (tmp_path / "launches").mkdir(parents=True)
    (tmp_path / "launches" / "upstream.sh").write_text(LAUNCH.replace("grpo.yaml", "missing.yaml").format(overrides=""))
    assert _project(tmp_path, "data.rollout_batch_size=32 worker.actor.global_batch_size=32") == [
        ("dp_actor.py", 6, "KL002"), ("grpo.yaml", 8, "KL002")]
