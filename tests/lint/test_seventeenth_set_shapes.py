"""Shapes of KL code met in the seventeenth review (the fifteenth fresh set) and in re-reading the earlier sets.

Verdicts (kl-math.md section 8): k3 values in the reward are row 7 (KL004), wherever the reward then goes.
"""

from __future__ import annotations

from snippets import module_codes

# TRL's rewritten PPOTrainer: the k3 reward's returns are the critic's target, and the critic's squared error
# is added to the policy loss. That error has no gradient for the policy: the sum is the policy's term.
POLICY_AND_CRITIC = """\
import torch


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum()


def update(policy, critic, batch, mask, optimizer, kl_coef):
    logprobs, ref_logprobs, values = batch["logprobs"], batch["ref_logprobs"], batch["values"]
    logr = ref_logprobs - logprobs
    kl = (logr.exp() - 1) - logr
    rewards = -kl_coef * kl
    returns = rewards.flip(-1).cumsum(-1).flip(-1)
    advantages = returns - values
    new_logprobs = policy(batch["input_ids"])
    ratio = torch.exp(new_logprobs - new_logprobs.detach())
    pg_loss = masked_mean(-advantages * ratio, mask)
    vf_loss = 0.5 * masked_mean(torch.square(critic(batch["input_ids"]) - returns), mask)
    loss = pg_loss + 0.1 * vf_loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_critics_error_added_to_the_policy_loss_leaves_one_verdict_at_the_reward(tmp_path):
    """Row 7 (KL004) once, at the reward (line 12); the critic's error over returns that hold the
    KL reward made the policy loss a new combination, reported again at line 19."""
    assert module_codes(POLICY_AND_CRITIC, tmp_path) == [(12, "KL004")]


# grpo-from-scratch's modular GRPO: the rollout sums the behaviour policy's log-probs over each completion and the
# update, four epochs of optimizer steps over that rollout, weighs the advantages by the sequence ratio to them.
SEQUENCE_RATIO = """\
import torch


def update(model, optimizer, full_ids, completion_mask, old_seq_logp, ref_logp, advantages, beta, epochs=4):
    for epoch in range(epochs):
        new_logp = model(full_ids)
        new_seq_logp = (completion_mask * new_logp).sum(dim=-1)
        diff = ref_logp - new_logp
        k3 = (completion_mask * (torch.exp(diff) - diff - 1)).sum(dim=-1)
        ratio = torch.exp(new_seq_logp - old_seq_logp)
        objective = torch.min(torch.clamp(ratio, 0.8, 1.2) * advantages, ratio * advantages)
        loss = -objective.mean() + beta * k3.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_a_sequence_ratio_to_the_behaviour_policys_summed_log_probs_says_the_samples_are_older(tmp_path):
    """k3 as a loss (row 3, KL002) on samples of the policy before the last optimizer step, without weights
    (row 22, KL008): `old_seq_logp` names the behaviour policy's log-probs summed over the completion, the other
    side of the sequence ratio. Read per token, the ratio did not fold and the samples looked on-policy."""
    assert module_codes(SEQUENCE_RATIO, tmp_path) == [(12, "KL002"), (12, "KL008")]
