"""Shapes of KL code met in the eighteenth review (the sixteenth fresh set).

Verdicts (kl-math.md section 8): k3 differentiated as a loss is row 3 (KL002); averaged over each sequence's
own length (1/L) it is also row 21 (KL007); on samples of an older policy (a PPO ratio to the behaviour
policy's log-probs in the same step) with no weights on the KL term, row 22 (KL008).
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from snippets import module_codes

from klaudit.cli import main

# curious's ActorLoss: the axis of the masked mean is a setting of __init__, `None` (every token of the batch)
# or `-1` (each sequence's own mean); the behaviour policy's log-probs pass a dtype helper of the project.
ACTOR_LOSS = """\
import torch
import torch.nn as nn


def to_float(tensor):
    return tensor.to(dtype=torch.float32) if tensor.is_floating_point() else tensor


def masked_mean(tensor, mask, dim=None):
    return (tensor * mask).sum(axis=dim) / mask.sum(axis=dim).clamp_min(1)


class ActorLoss(nn.Module):
    def __init__(self, kl_weight, use_token_level_loss):
        super().__init__()
        self.kl_weight = kl_weight
        self.aggregation_dim = None if use_token_level_loss else -1

    def forward(self, log_probs, experience):
        old_log_probs = to_float(experience.action_log_probs)
        log_ratio = experience.log_probs_ref - log_probs
        kl_loss = self.kl_weight * (log_ratio.exp() - log_ratio - 1)
        ratio = (log_probs - old_log_probs).exp()
        policy_loss = -torch.min(ratio * experience.advantages, ratio.clamp(0.8, 1.2) * experience.advantages)
        loss = policy_loss + kl_loss
        return masked_mean(loss, experience.action_mask, dim=self.aggregation_dim).mean()
"""


def test_an_axis_set_in_init_gives_each_setting_its_reduction(tmp_path):
    """Row 3 on both settings, row 21 where each sequence is averaged by its own length, row 22 on both:
    the ratio to the behaviour policy's log-probs (read through the project's dtype helper) shows that
    the samples are older."""
    assert module_codes(ACTOR_LOSS, tmp_path) == [(22, "KL002"), (22, "KL007"), (22, "KL008")]
    out = CliRunner().invoke(main, ["lint", "--output-format", "concise", str(tmp_path / "snippet.py")]).output
    assert "seq-token-mean" in out and "[use_token_level_loss=False]" in out


def test_a_constant_axis_in_init_is_read_without_a_switch(tmp_path):
    """`self.aggregation_dim = -1`, set once: each sequence's own mean, row 21."""
    source = ACTOR_LOSS.replace("None if use_token_level_loss else -1", "-1")
    assert (22, "KL007") in module_codes(source, tmp_path)


def test_an_axis_set_in_two_methods_is_not_guessed(tmp_path):
    """Set again outside __init__, the axis is any of its values at the call: no 1/L verdict is claimed."""
    source = ACTOR_LOSS.replace("None if use_token_level_loss else -1", "None")
    assert module_codes(source, tmp_path) == [(22, "KL002"), (22, "KL008")]  # one setting: every token of the batch
    source = source.replace("    def forward(", "    def per_sequence(self):\n        self.aggregation_dim = 1\n\n    def forward(")
    assert (25, "KL007") not in module_codes(source, tmp_path)


# Tiny-GRPO-style loss helper named `loss_fn`: its return is the loss, reduced per sequence.
LOSS_FN = """\
def masked_mean(x, mask, dim=None):
    return (x * mask).sum(axis=dim) / mask.sum(axis=dim)


def loss_fn(log_probs, batch, kl_weight):
    log_ratio = batch["ref_log_probs"] - log_probs
    kl = log_ratio.exp() - log_ratio - 1
    loss = -log_probs * batch["advantages"] + kl_weight * kl
    return masked_mean(loss, batch["mask"], dim=-1).mean()
"""


def test_a_function_named_loss_fn_returns_its_loss(tmp_path):
    """Its return is the loss: the per-sequence mean counts (rows 3 and 21), as in any other loss function."""
    assert module_codes(LOSS_FN, tmp_path) == [(8, "KL002"), (8, "KL007")]


# grpo-go-brrr (the seventeenth fresh set): the completions and both log-probs are computed once, then K optimizer
# steps are taken on them; the PPO ratio multiplies the policy term only.
INNER_UPDATES = """\
import torch

K = 2


def masked_kl(current, ref, mask):
    diff = ref - current
    return ((torch.exp(diff) - diff - 1) * mask).sum(dim=1).mean()


def train_step(model, ref_model, optimizer, prompts, advantages, beta):
    completion_ids, mask = model.generate(prompts)
    with torch.no_grad():
        old_logprobs = compute_logprobs(model, completion_ids, mask)
        ref_logprobs = compute_logprobs(ref_model, completion_ids, mask)
    for inner in range(K):
        current_logprobs = compute_logprobs(model, completion_ids, mask)
        kl = masked_kl(current_logprobs, ref_logprobs, mask)
        loss = -(advantages * torch.exp(current_logprobs - current_logprobs.detach())).mean() + beta * kl
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("change", [
    ("", ""),
    # the reference's log-probs recomputed in each round (karinazad/nano-rlvr's helper does so): of the same samples
    ("        current_logprobs =", "        ref_logprobs = compute_logprobs(ref_model, completion_ids, mask)\n"
                                 "        current_logprobs ="),
])
def test_several_optimizer_steps_on_one_batch_of_samples_are_off_policy(tmp_path, change):
    """Row 3 (KL002) and row 22 (KL008): the second step trains the k3 loss on the first policy's samples."""
    line = 19 + change[1].count("\n")
    assert module_codes(INNER_UPDATES.replace(*change) if change[0] else INNER_UPDATES, tmp_path) == [
        (line, "KL002"), (line, "KL008")]


@pytest.mark.parametrize("change", [
    ("range(K)", "range(1)"),  # one step per batch of samples
    ("        optimizer.step()\n", "        optimizer.zero_grad()\n"),  # no step inside the loop
    ("        current_logprobs =", "        completion_ids, mask = model.generate(prompts)\n        current_logprobs ="),
    ("        current_logprobs =", "        prompts = next(batches)\n        current_logprobs ="),  # the next batch
])
def test_a_loop_that_may_draw_new_samples_is_not_called_off_policy(tmp_path, change):
    """On-policy as far as the text shows: row 3 alone."""
    codes = module_codes(INNER_UPDATES.replace(*change), tmp_path)
    assert [code for _, code in codes] == ["KL002"]


# Liger-Kernel's GRPO loss (development set): a k3 helper named `k3_loss_fn`, used in the per-token loss.
ESTIMATE_HELPER = """\
import torch


def k3_loss_fn(log_p, log_q):
    return torch.exp(log_p - log_q) - (log_p - log_q) - 1.0


def grpo_loss(per_token_logps, ref_per_token_logps, advantages, mask, beta):
    per_token_loss = -advantages * torch.exp(per_token_logps - per_token_logps.detach())
    per_token_loss = per_token_loss + beta * k3_loss_fn(ref_per_token_logps, per_token_logps)
    return (per_token_loss * mask).sum() / mask.sum()
"""


def test_a_kl_estimates_helper_named_loss_fn_is_judged_where_the_loss_uses_it(tmp_path):
    """k3 as a loss, row 3 (KL002), at the loss that adds it (line 10), not in the helper: `k3_loss_fn` names a
    KL estimate's function, where `loss_fn` names the loss."""
    assert module_codes(ESTIMATE_HELPER, tmp_path) == [(10, "KL002")]


# TRL's RLOOTrainer (vendored by open-r1-coderm and async_rlhf): the k1 sequence reward of a rollout trained over
# num_ppo_epochs, each step weighed by exp of the whole sequence's log-ratio to the rollout's log-probs.
SEQUENCE_RATIO_EPOCHS = """\
import torch


def train(policy, ref_policy, optimizer, batch, scores, kl_coef, num_ppo_epochs, cliprange, mini_batch_size):
    with torch.no_grad():
        logprobs = policy(batch)
        ref_logprobs = ref_policy(batch)
    kl = logprobs - ref_logprobs
    rlhf_reward = scores - kl_coef * kl.sum(1)
    advantages = rlhf_reward - rlhf_reward.mean()
    for ppo_epoch_idx in range(num_ppo_epochs):
        for start in range(0, len(batch), mini_batch_size):
            inds = slice(start, start + mini_batch_size)
            mb_advantage = advantages[inds]
            mb_logprobs = logprobs[inds]
            new_logprobs = policy(batch[inds])
            ratio = torch.exp(new_logprobs.sum(1) - mb_logprobs.sum(1))
            pg_losses = -mb_advantage * ratio
            pg_losses2 = -mb_advantage * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
            pg_loss = torch.max(pg_losses, pg_losses2).mean()
            loss = pg_loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
"""


def test_a_whole_sequence_ratio_over_several_steps_is_the_exact_weight(tmp_path):
    """k1 in a whole-sequence return (row 6) trained with the sequence's importance ratio to the rollout: row 25,
    exact, silent. A per-token ratio in its place reweighs the sampled token only (row 23: KL008 at the reward, line 9)."""
    assert module_codes(SEQUENCE_RATIO_EPOCHS, tmp_path) == []
    per_token = SEQUENCE_RATIO_EPOCHS.replace(
        "torch.exp(new_logprobs.sum(1) - mb_logprobs.sum(1))", "torch.exp(new_logprobs - mb_logprobs)").replace(
        "scores - kl_coef * kl.sum(1)", "scores.unsqueeze(1) - kl_coef * kl").replace(
        "rlhf_reward - rlhf_reward.mean()", "rlhf_reward.flip(1).cumsum(1).flip(1)")
    assert module_codes(per_token, tmp_path) == [(9, "KL008")]


# grpo-go-brrr's own shape: the "old" log-probs are the policy's, computed by the project's helper under no_grad
# before the loop, so only the loop shows the reuse; its k3 is summed over each sequence.
HELPER_LOG_PROBS = INNER_UPDATES.replace("def train_step(", """\
def grpo_loss(current_logprobs, old_logprobs, advantages, completion_mask, eps=0.2):
    ratio = torch.exp(current_logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
    per_token = -torch.min(ratio * advantages.unsqueeze(1), clipped * advantages.unsqueeze(1))
    return (per_token * completion_mask).sum(dim=1).mean()


def compute_logprobs(model, completion_ids, mask):
    logits = model(completion_ids).logits
    return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def train_step(""").replace(
    "loss = -(advantages * torch.exp(current_logprobs - current_logprobs.detach())).mean() + beta * kl",
    "loss = grpo_loss(current_logprobs, old_logprobs, advantages, mask) + beta * kl")


def test_a_loop_shows_the_reuse_where_the_old_log_probs_are_the_policys_own(tmp_path):
    """Row 3 (KL002) and row 22 (KL008) at the loss (line 31): a k3 summed over the sequence is no sequence
    importance weight, whatever atoms its expansion holds."""
    assert module_codes(HELPER_LOG_PROBS, tmp_path) == [(31, "KL002"), (31, "KL008")]


SETTINGS = {  # where a count of rounds gets its default: a dataclass field (ReMax), a constructor (RLFusion)
    "field": ("from dataclasses import dataclass, field\n\n\n@dataclass\nclass Config:\n"
              "    num_ppo_epochs: int = field(default={default}, metadata={{}})\n\n\n"),
    "constructor": ("class Trainer:\n    def __init__(self, num_ppo_epochs: int = {default}):\n"
                    "        self.num_ppo_epochs = num_ppo_epochs\n\n\n"),
}


@pytest.mark.parametrize("where", sorted(SETTINGS))
@pytest.mark.parametrize("default, expected", [(1, ["KL002"]), (4, ["KL002", "KL008"])])
def test_a_count_of_rounds_its_settings_default_to_one_is_one_round(tmp_path, where, default, expected):
    """llm_related's ReMax trainer runs `for ppo_epoch_idx in range(args.num_ppo_epochs)` with the field's default 1,
    RLFusion's range(self.ppo_steps) with its constructor's: one optimizer step per rollout, row 3 alone; a default
    of 4 (TRL's PPO) is four rounds, row 22 as well."""
    looped = INNER_UPDATES.replace("range(K)", "range(args.num_ppo_epochs)").replace(
        "def train_step(model,", "def train_step(args, model,")
    assert [code for _, code in module_codes(SETTINGS[where].format(default=default) + looped, tmp_path)] == expected


def test_a_mini_batch_loop_is_not_read_as_several_rounds(tmp_path):
    """`range(0, n, size)`: how many batches it makes is the batch sizes' (often one): row 3 alone."""
    batches = INNER_UPDATES.replace("range(K)", "range(0, len(prompts), 4)")
    assert [code for _, code in module_codes(batches, tmp_path)] == ["KL002"]
