"""Shapes of code met in the fiftieth blind set and after it that the lint misread: a critic regressed on a target
that holds a detached log-ratio (DRO-V's value loss), which is no KL penalty left without its gradient."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

# LLNL/protein_tune_rl's DRO loss, reduced: the policy's part holds the squared log-ratio with gradient; the value's
# part is sg(V - r + tau * log-ratio) * V, whose gradient (V - (r - tau * log-ratio)) grad V regresses the critic.
DRO = """\
import torch


class DRO:
    def calculate_loss(self, batch):
        pi_logits = self.policy(batch["input_ids"]).logits
        with torch.no_grad():
            ref_logits = self.ref_model(batch["input_ids"]).logits
        labels = batch["labels"]
        pi_log_probs = torch.gather(pi_logits.log_softmax(-1), 2, labels.unsqueeze(2)).squeeze(2)
        ref_log_probs = torch.gather(ref_logits.log_softmax(-1), 2, labels.unsqueeze(2)).squeeze(2)
        log_ratio = pi_log_probs - ref_log_probs
        value = {value}.float().flatten()
        value_no_grad = value.clone().detach()
        log_ratio_no_grad = log_ratio.clone().detach()
        policy_loss = -(pi_log_probs.sum(-1) * (batch["rewards"] - value_no_grad)
                        - self.tau / 2 * torch.pow(log_ratio.sum(-1), 2)).mean()
        value_loss = ((value_no_grad - batch["rewards"] + self.tau * log_ratio_no_grad.sum(-1)) * {factor}).mean()
        return policy_loss, value_loss

    def step(self, batch):
        policy_loss, value_loss = self.calculate_loss(batch)
        (policy_loss + value_loss).backward()
"""


def _found(tmp_path, source):
    (tmp_path / "dro.py").write_text(source)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    return sorted({(finding.code, finding.line) for finding in result.findings})


@pytest.mark.parametrize("value", ["self.value(batch['prompts'])", "self.critic_model(batch['prompts'])"])
def test_a_detached_log_ratio_in_a_critics_target_is_no_penalty_without_gradient(tmp_path, value):
    assert ("KL001", 18) not in _found(tmp_path, DRO.format(value=value, factor="value"))


@pytest.mark.parametrize("value, factor", [
    ("self.value(batch['prompts'])", "value_no_grad"),  # the critic's output detached: a number like any other
    ("self.config.get_value('scale')", "value"),  # a lookup named like a value, not a value network
])
def test_the_same_detached_log_ratio_times_anything_else_is_still_reported(tmp_path, value, factor):
    assert ("KL001", 18) in _found(tmp_path, DRO.format(value=value, factor=factor))


# Edward-Sun/easy-to-hard, reduced: the subclass draws the rollout and puts a detached k1 in its token rewards; the base
# class, in another module, calls `self.rollout(...)` and then takes several optimizer steps on that rollout (row 23).
BASE_TRAINER = """\
import torch


class RLTrainer:
    def rollout(self, queries):
        raise NotImplementedError

    def step(self, loader):
        rollouts = self.rollout(next(loader))
        return self.step_with_rollouts(rollouts)

    def step_with_rollouts(self, rollouts):
        for epoch in range(self.args.noptepochs):
            logprobs = self.policy(rollouts["queries"], rollouts["responses"]).logprobs
            ratio = torch.exp(logprobs - rollouts["logprobs"])
            loss = -(ratio * rollouts["advantages"]).mean()
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
"""

PPO_TRAINER = """\
import torch

from trainers.rl_trainer import RLTrainer


class PPOTrainer(RLTrainer):
    @torch.no_grad()
    def rollout(self, queries):
        responses = self.policy.generate(queries)
        logprobs = self.policy(queries, responses).logprobs
        ref_logprobs = self.ref_policy(queries, responses).logprobs
        rewards = self._shape_reward(self.reward_model(queries, responses), logprobs, ref_logprobs)
        advantages = torch.flip(torch.cumsum(torch.flip(rewards, [1]), 1), [1])
        return dict(queries=queries, responses=responses, logprobs=logprobs, advantages=advantages)

    def _shape_reward(self, scores, logprobs, ref_logprobs):
        kl = logprobs - ref_logprobs
        rewards = -self.kl_coef * kl
        rewards[:, -1] += scores
        return rewards
{override}"""

SINGLE_PASS = """
    def step_with_rollouts(self, rollouts):
        logprobs = self.policy(rollouts["queries"], rollouts["responses"]).logprobs
        loss = -(logprobs * rollouts["advantages"]).mean()
        loss.backward()
        self.optimizer.step()
"""


def _found_in(tmp_path, files):
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    return [(finding.path.replace("\\\\", "/").rsplit("/", 2)[-2:], finding.code, finding.message)
            for finding in result.findings]


def test_a_kl_reward_trained_by_the_epochs_of_a_base_class_in_another_module_is_on_older_samples(tmp_path):
    found = _found_in(tmp_path, {"trainers/__init__.py": "", "trainers/rl_trainer.py": BASE_TRAINER,
                                 "trainers/ppo_trainer.py": PPO_TRAINER.format(override="")})
    assert [(path, code) for path, code, _ in found] == [(["trainers", "ppo_trainer.py"], "KL008")]
    assert "rl_trainer.py:13" in found[0][2]


def test_the_base_class_loop_is_not_the_one_that_runs_where_the_subclass_replaces_it(tmp_path):
    found = _found_in(tmp_path, {"trainers/__init__.py": "", "trainers/rl_trainer.py": BASE_TRAINER,
                                 "trainers/ppo_trainer.py": PPO_TRAINER.format(override=SINGLE_PASS)})
    assert [code for _, code, _ in found] == []
