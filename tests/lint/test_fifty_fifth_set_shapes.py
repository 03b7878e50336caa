"""Shapes of code met in the fifty-fifth blind set that the lint misread.

- ParkerWilliams/dtype-rlhf: the trainer's `ppo_step` (src/algorithms/ppo.py) takes one optimizer step per call and
  nothing in its package calls it; the script that does (scripts/run_ppo_sweep.py) imports the class from afar and
  calls the step twice, once on a warm-up batch drawn for it and once in each round of its loop, each right after it
  generates: both are on the policy that drew them, so the ratio to the rollout's log-probs is 1 (a false KL008).
- alvareztran/llm-alignment-demo computes its k1 reward at the rollout, then trains it in `for _ in
  range(config.ppo_epochs)`, whose body calls `ppo_loss_for_rollout(...)` and steps: a call named for a loss over a
  rollout was read as drawing one, so the loop looked like fresh samples each round (KL008 missed).
- Prem01-cyber/finetune_qwen: `total_loss_val += loss.item()` after `loss.backward()`, a Python number kept for the
  log, read as a loss the KL reached without its gradient (six false KL001: tests/lint/test_detached_kl_loss.py).
- Prem01-cyber/finetune_qwen's sequence log-prob helper returns `torch.tensor(0.0, requires_grad=True)` when the
  response selects no token; that zero, kept beside the log-probs, left a lone policy term and a lone reference term
  in `new_lp - ref_lp`, which the loop's `group_loss = group_loss + loss_i` joined into a second k1 finding on the
  same term.
- alvareztran/llm-alignment-demo clips the whole GAE advantage (`torch.clamp(advantages, -5, 5)`), whose return
  holds the k1 reward beside the reward model's score: a clipped advantage, not the clamped KL estimate KL010 names.
- HuichuanLI/play-with-instruct-model: a notebook cell that opens with a blank line before `%%chatglm` is a cell
  magic, as IPython reads it (a false KL000: tests/lint/test_notebooks.py).
"""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

TRAINER = """\
import torch


class PPOTrainer:
    def ppo_step(self, raw_batch):
        logprobs = self.policy(raw_batch["ids"])
        ratio = torch.exp(logprobs - raw_batch["old_log_probs"])
        policy_loss = -(ratio * raw_batch["advantages"]).mean()
        kl = torch.exp(raw_batch["ref"] - logprobs) - (raw_batch["ref"] - logprobs) - 1
        loss = policy_loss + 0.1 * kl.mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
"""

SCRIPT = """\
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

from src.algorithms.ppo import PPOTrainer


def create_batch(policy, prompts):
    return {{"ids": policy.model.generate(prompts)}}


def main(policy, prompts, steps):
    trainer = PPOTrainer()
    warmup = create_batch(policy, prompts)
    trainer.ppo_step(warmup)
{between}    for step in range(steps):
        raw_batch = create_batch(policy, prompts)
        trainer.ppo_step(raw_batch)
"""


def _codes(tmp_path, between):
    algorithms = tmp_path / "src" / "algorithms"
    algorithms.mkdir(parents=True)
    (algorithms / "ppo.py").write_text(TRAINER)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "run_sweep.py").write_text(SCRIPT.format(between=between))
    result = lint_paths([str(tmp_path)], jobs=1)
    return {finding.code for finding in result.findings if finding.path.endswith("ppo.py")}


@pytest.mark.parametrize("between, stale", [
    ("", False),  # a warm-up step on its own batch, then one step per fresh batch: on-policy
    ("    trainer.ppo_step(warmup)\n", True),  # the warm-up batch trained twice: the second step is on older samples
])
def test_a_step_a_far_script_calls_right_after_each_draw_is_on_policy(tmp_path, between, stale):
    codes = _codes(tmp_path, between)
    assert "KL002" in codes  # k3 as a loss (row 3) either way
    assert ("KL008" in codes) is stale


PPO_SCRIPT = """\
import torch


def build_rollout(policy, ref, prompt, config):
    ids = policy.generate(prompt)
    with torch.no_grad():
        old_logprobs = policy.logprobs(ids)
        ref_logprobs = ref.logprobs(ids)
    kl = old_logprobs - ref_logprobs
    rewards = -config.kl_coef * kl
    return {{"ids": ids, "old_logprobs": old_logprobs, "advantages": rewards.flip(0).cumsum(0).flip(0)}}


def {loss_name}(policy, rollout):
    logprobs = policy.logprobs(rollout["ids"])
    ratio = torch.exp(logprobs - rollout["old_logprobs"])
    return -(ratio * rollout["advantages"]).mean()


def ppo_update(policy, optimizer, rollouts, config):
    for _ in range(config.ppo_epochs):
        optimizer.zero_grad()
        for rollout in rollouts:
            {loss_name}(policy, rollout).backward()
        optimizer.step()


def main(policy, ref, optimizer, prompts, config):
    for prompt in prompts:
        rollouts = [build_rollout(policy, ref, prompt, config)]
        ppo_update(policy, optimizer, rollouts, config)
"""


@pytest.mark.parametrize("loss_name", ["ppo_loss_for_rollout", "rollout_loss", "compute_loss"])
def test_a_loss_named_for_its_rollout_draws_nothing(tmp_path, loss_name):
    """Every epoch after the first trains the k1 reward of the rollout on an older policy (row 23: KL008), whatever
    the loss helper in the epoch loop is called."""
    (tmp_path / "ppo.py").write_text(PPO_SCRIPT.format(loss_name=loss_name))
    result = lint_paths([str(tmp_path)], jobs=1)
    assert sorted({finding.code for finding in result.findings}) == ["KL008"]


GROUP_LOSS = """\
import torch


def seq_logp(model, ids, mask):
    logits = model(ids).logits[0]
    token_logps = torch.log_softmax(logits[:-1], dim=-1)[torch.arange(ids.size(0) - 1), ids[1:]]
    selected = token_logps[mask[1:]]
    if selected.numel() == 0:
        return {fallback}
    return selected.sum()


def group_loss_fn(model, ref_model, samples, kl_coef):
    group_loss = torch.tensor(0.0)
    for ids, mask, adv in samples:
        new_lp = seq_logp(model, ids, mask)
        loss_i = -(adv * new_lp)
        with torch.no_grad():
            ref_lp = seq_logp(ref_model, ids, mask)
        loss_i = loss_i + kl_coef * (new_lp - ref_lp)
        group_loss = group_loss + loss_i
    return group_loss / len(samples)
"""


@pytest.mark.parametrize("fallback", ["torch.tensor(0.0, requires_grad=True)", "0.0", "None"])
def test_a_zero_returned_for_an_empty_selection_makes_no_second_finding(tmp_path, fallback):
    """k1 as a loss (row 1) is reported once, where the KL term enters the loss, whatever the helper returns when
    the response selects no token."""
    (tmp_path / "group.py").write_text(GROUP_LOSS.format(fallback=fallback))
    found = [(finding.line, finding.code) for finding in lint_paths([str(tmp_path)], jobs=1).findings]
    assert found == [(20, "KL001")]


GAE_ROLLOUT = """\
import torch


def compute_gae(rewards, values, gamma, lam):
    running, backwards = 0.0, []
    for t in reversed(range(len(rewards))):
        following = values[t + 1] if t + 1 < len(values) else 0.0
        running = rewards[t] + gamma * following - values[t] + gamma * lam * running
        backwards.append(running)
    advantages = torch.stack(backwards[::-1])
    return advantages, advantages + values


def train(policy, ref, critic, reward_model, optimizer, prompts, kl_coef, clip):
    for prompt in prompts:
        ids = policy.generate(prompt)
        with torch.no_grad():
            old_logprobs = policy.logprobs(ids)
            ref_logprobs = ref.logprobs(ids)
            values = critic(ids)
        kl = {kl}
        rewards = -kl_coef * kl
        rewards[-1] = rewards[-1] + reward_model(ids)
        advantages, returns = compute_gae(rewards, values, 1.0, 0.95)
        advantages = torch.clamp(advantages, -clip, clip)
        logprobs = policy.logprobs(ids)
        loss = -(torch.exp(logprobs - old_logprobs) * advantages.detach()).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize(("kl", "expected"), [
    ("old_logprobs - ref_logprobs", []),  # only the advantage is clipped: k1 reward-to-go, row 6, right
    ("torch.clamp(old_logprobs - ref_logprobs, -5, 5)", [(22, "KL010")]),  # the estimate itself clamped
])
def test_a_clipped_advantage_is_no_clamped_kl(tmp_path, kl, expected):
    """A k1 reward with the score at the last token, through GAE with a critic, then the advantage clipped: the clip
    bounds the whole advantage, where the score and the values make it large; only a clamp of the estimate is KL010."""
    (tmp_path / "ppo.py").write_text(GAE_ROLLOUT.format(kl=kl))
    found = [(finding.line, finding.code) for finding in lint_paths([str(tmp_path)], jobs=1).findings]
    assert found == expected
