"""What a project's own runs of its verl copy never reach (klaudit.frameworks.verl_runs).

turboweii/ToolAgent-GRPO (ninety-second set) carries verl 0.9 and trains with one launch of its own: distillation
off (verl's default), one optimizer step per rollout (train_batch_size = ppo_mini_batch_size, ppo_epochs 1). The
copy's distillation losses never run there, and its actor's KL loss is on samples of the weights being updated: the
PPO ratio is 1 at the only step, so samples of an older policy (KL008) are no verdict of that run.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from test_verl_switch_choices import ACTOR, LAUNCH, _findings

from klaudit.catalog import OFF_POLICY_RULE, Aggregation, Config, Estimator, Returns, Sampling, defects

# an actor whose KL loss meets a PPO ratio to the rollout's log-probs: older samples unless one step per rollout
PPO_ACTOR = """\
import torch

from verl.trainer.ppo.core_algos import kl_penalty


class Actor:
    def __init__(self, config):
        self.config = config

    def update_policy(self, model, batch, optimizer):
        log_prob = model(batch["input_ids"])
        ratio = torch.exp(log_prob - batch["old_log_probs"])
        pg_loss = -(ratio * batch["advantages"]).mean()
        kld = kl_penalty(log_prob, batch["ref_log_prob"], self.config.kl_loss_type)
        loss = pg_loss + 0.001 * kld.mean()
        loss.backward()
        optimizer.step()
"""
CORE_ALGOS = ACTOR[:ACTOR.index("class Actor")]  # verl's kl_penalty, k1 and low_var_kl
# verl 0.9's distillation loss: k1 of student and teacher differentiated (KL001), run only with distillation on
DISTILLATION = """\
def distillation_loss(student_log_probs, teacher_log_probs, mask):
    k1 = student_log_probs - teacher_log_probs
    loss = (k1 * mask).sum() / mask.sum()
    return loss
"""
ONE_STEP = " data.train_batch_size=64 actor_rollout_ref.actor.ppo_mini_batch_size=64"


def _copy_findings(root, launch, extra=None):
    """The findings in the copy's code (not its launches), by file name and rule."""
    extra = {"verl/trainer/ppo/core_algos.py": CORE_ALGOS, "verl/trainer/distillation/losses.py": DISTILLATION,
             **(extra or {})}
    found = _findings(root, {"scripts/train.sh": launch} if launch else {}, extra)
    return sorted({(f.path.rsplit("/", 1)[-1], f.code) for f in found if "/verl/" in f.path and f.path.endswith(".py")})


@pytest.mark.parametrize(("overrides", "judged"), [
    ("", False),  # verl's default: off
    (" distillation.enabled=False", False),
    (" distillation.enabled=True", True),
    (" distillation.enabled=$DISTILL", True),  # computed: it may be on
])
def test_distillation_losses_are_judged_only_where_a_run_may_turn_distillation_on(tmp_path, overrides, judged):
    found = _copy_findings(tmp_path, LAUNCH.format(kind="low_var_kl") + overrides)
    assert [item for item in found if item[0] == "losses.py"] == ([("losses.py", "KL001")] if judged else [])


def test_a_yaml_file_of_the_project_that_turns_distillation_on_keeps_its_losses(tmp_path):
    yaml = {"configs/distill.yaml": "distillation:\n  enabled: true\n  teacher: Qwen/Qwen3-8B\n"}
    found = _copy_findings(tmp_path, LAUNCH.format(kind="low_var_kl"), yaml)
    assert ("losses.py", "KL001") in found


def test_verl_itself_judges_its_distillation_losses(tmp_path):
    assert ("losses.py", "KL001") in _copy_findings(tmp_path, "")


@pytest.mark.parametrize(("overrides", "older"), [
    ("", True),  # verl's defaults: 1024 prompts a rollout, 256 a step: four steps
    (ONE_STEP, False),
    (ONE_STEP + " actor_rollout_ref.actor.ppo_epochs=2", True),
    (" data.train_batch_size=64 actor_rollout_ref.actor.ppo_mini_batch_size=$MINI", True),  # computed
])
def test_kl_on_older_samples_only_where_a_run_takes_several_steps_per_rollout(tmp_path, overrides, older):
    found = _findings(tmp_path, {"scripts/train.sh": LAUNCH.format(kind="low_var_kl") + overrides},
                      {"verl/workers/dp_actor.py": PPO_ACTOR, "verl/trainer/ppo/core_algos.py": CORE_ALGOS})
    actor = [f for f in found if f.path.endswith("dp_actor.py")]
    assert sorted({f.code for f in actor}) == (["KL002", OFF_POLICY_RULE] if older else ["KL002"])
    sampling = (Sampling.OFF_POLICY if older else Sampling.ON_POLICY).value
    assert all(f", {sampling}: " in f.message for f in actor if f.code == "KL002")


GATED_ACTOR = PPO_ACTOR.replace("        kld = kl_penalty(", "        loss = pg_loss\n        if self.config.use_kl_loss:\n"
                                 "            kld = kl_penalty(").replace(
    "        loss = pg_loss + 0.001 * kld.mean()", "            loss = pg_loss + 0.001 * kld.mean()")


@pytest.mark.parametrize(("other", "older"), [
    ("", False),  # the launch of several steps leaves the KL loss off: only one-step runs reach it
    (" actor_rollout_ref.actor.use_kl_loss=True", True),
    (" actor_rollout_ref.actor.use_kl_loss=$USE_KL", True),  # computed: it may be on
])
def test_kl_on_older_samples_only_where_a_run_that_reaches_it_takes_several_steps(tmp_path, other, older):
    """Rec-R1 (fresh97) runs its verl copy with GRPO launches that turn the KL loss on and take one step per rollout,
    and with TinyZero launches that leave it off and take two: the loss is on fresh samples in every run that
    computes it (row 4, KL002), not row 22 (KL008)."""
    several = "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo trainer.total_epochs=1" + other + "\n"
    found = _findings(tmp_path, {"scripts/train.sh": LAUNCH.format(kind="low_var_kl") + ONE_STEP,
                                 "scripts/other.sh": several},
                      {"verl/workers/dp_actor.py": GATED_ACTOR, "verl/trainer/ppo/core_algos.py": CORE_ALGOS})
    actor = [f for f in found if f.path.endswith("dp_actor.py")]
    assert sorted({f.code for f in actor}) == (["KL002", OFF_POLICY_RULE] if older else ["KL002"])


def test_the_fully_asynchronous_trainer_trains_older_samples_at_one_step(tmp_path):
    launch = LAUNCH.format(kind="low_var_kl").replace("verl.trainer.main_ppo",
                                                      "verl.experimental.fully_async_policy.fully_async_main")
    found = _findings(tmp_path, {"scripts/train.sh": launch + ONE_STEP},
                      {"verl/workers/dp_actor.py": PPO_ACTOR, "verl/trainer/ppo/core_algos.py": CORE_ALGOS})
    assert OFF_POLICY_RULE in {f.code for f in found if f.path.endswith("dp_actor.py")}


@pytest.mark.parametrize("older", [Sampling.OFF_POLICY, Sampling.TOKEN_IS])
def test_on_fresh_samples_a_verdict_loses_only_the_older_samples_rule(older):
    """Why a finding on older samples is read on fresh ones by dropping KL008 and renaming its sampling: for every
    configuration the catalog judges, the rows on older samples are those on fresh samples and KL008."""
    rows = lambda config: {(row.rule, row.explanation) for row in defects(config)}  # noqa: E731
    estimators = (None, *Estimator)
    for loss, reward, returns, aggregation in itertools.product(estimators, estimators, Returns, Aggregation):
        if loss is None and reward is None:
            continue
        fresh = Config(loss=loss, reward=reward, returns=returns, aggregation=aggregation)
        on_older = rows(replace(fresh, sampling=older))
        assert {row for row in on_older if row[0] != OFF_POLICY_RULE} == rows(fresh), fresh


# qin-star/Query_RL and ZJU-REAL/cooper (ninety-sixth set) carry verl and train with FSDP launches of their own: the
# copy's Megatron actor, built by main_ppo only for actor.strategy=megatron, and its upstream recipes never run there.
@pytest.mark.parametrize(("overrides", "judged"), [
    ("", False),  # verl's default strategy: FSDP
    (" actor_rollout_ref.actor.strategy=fsdp2", False),
    (" actor_rollout_ref.actor.strategy=megatron", True),
    (" actor_rollout_ref.actor.strategy=$STRATEGY", True),  # computed: it may be Megatron
    (" --config-name=ppo_megatron_trainer", True),
])
def test_the_megatron_actor_is_judged_only_where_a_run_may_build_it(tmp_path, overrides, judged):
    found = _copy_findings(tmp_path, LAUNCH.format(kind="low_var_kl") + overrides,
                           {"verl/workers/actor/megatron_actor.py": ACTOR})
    assert any(name == "megatron_actor.py" for name, _ in found) is judged


def test_verl_itself_judges_its_megatron_actor(tmp_path):
    assert any(name == "megatron_actor.py" for name, _ in
               _copy_findings(tmp_path, "", {"verl/workers/actor/megatron_actor.py": ACTOR}))


@pytest.mark.parametrize(("launch_module", "importer", "judged"), [
    ("verl.trainer.main_ppo", "", False),  # no run of the recipe
    ("recipe.sppo.main_sppo", "", True),  # the launch runs it
    ("verl.trainer.main_ppo", "from recipe.sppo.sppo_worker import SPPOActor\n", True),  # the project imports it
])
def test_a_recipe_is_judged_only_where_a_run_reaches_it(tmp_path, launch_module, importer, judged):
    launch = "cd verl_code\n" + LAUNCH.format(kind="low_var_kl").replace("verl.trainer.main_ppo", launch_module)
    copied = {"verl/trainer/ppo/core_algos.py": CORE_ALGOS, "recipe/sppo/dp_actor.py": ACTOR,
              "recipe/sppo/main_sppo.py": "import hydra\n",
              "tests/special_sanity/check_device_api_usage.py": 'ALLOWED = ["recipe/sppo/dp_actor.py"]\n'}
    project = {"scripts/train.sh": launch, **({"train_project.py": importer} if importer else {})}
    found = _findings(tmp_path, project, {f"verl_code/{path}": text for path, text in copied.items()}, copy="verl_code")
    assert any(f.path.endswith("recipe/sppo/dp_actor.py") for f in found) is judged


def test_no_several_step_values_are_kept_where_a_launch_runs_easyr1():
    """EasyR1's switches are named otherwise than verl's (Just-Enough-Think, fresh95): values read under verl's names
    and defaults would say its KL loss is off in a run that turns it on."""
    from klaudit.frameworks import verl_runs
    from klaudit.frameworks.settings import Setting

    on = {"actor_rollout_ref.actor.use_kl_loss": Setting("True", 1, 1, 1)}
    assert verl_runs.several_step_choices([("python3 -m verl.trainer.main_ppo", on)])["use_kl_loss"] == {"True"}
    assert verl_runs.several_step_choices([("python3 -m verl.trainer.main config=examples/config.yaml", on)]) == {}
