"""Shapes of KL code met in the sixteenth review (the fourteenth fresh set).

Verdicts (kl-math.md section 8): a k1 reward computed once per rollout and trained over several PPO
epochs with only the token ratio to the behaviour policy is row 23 (KL008); on its own, once, it is
row 6 (right, silent).
"""

from __future__ import annotations

from snippets import module_codes

# A hand-written PPO (rlhf-from-scratch): the rollout loop computes the reward in one function, hands the
# advantages to the update, and the update hands them on to the loss function, which forms the ratio.
HANDED_ON = """\
import torch


def compute_loss(old_logprobs, logprobs, mask, advantages):
    ratio = torch.exp(logprobs - old_logprobs)
    surrogate = torch.max(-ratio * advantages, -ratio.clamp(0.8, 1.2) * advantages)
    return (surrogate * mask).sum() / mask.sum()


def ppo_update(policy, batch, advantages, old_logprobs, mask, optimizer, ppo_epochs=4):
    for _ in range(ppo_epochs):
        logprobs = policy(batch["input_ids"])
        loss = compute_loss(old_logprobs, logprobs, mask, advantages)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def train(policy, batch, optimizer, kl_coef):
    old_logprobs, ref_logprobs, mask = batch["old_logprobs"], batch["ref_logprobs"], batch["mask"]
    rewards = -kl_coef * (old_logprobs - ref_logprobs) * mask
    advantages = rewards.flip(-1).cumsum(-1).flip(-1)
    ppo_update(policy, batch, advantages, old_logprobs, mask, optimizer)
"""


def test_a_term_handed_through_two_functions_keeps_its_loss_and_ratio(tmp_path):
    """The loss that holds the reward is formed two calls down (ppo_update, then compute_loss): the
    reward (line 21) is reported with the ratio's verdict, row 23. A term returned by a callee that the
    caller was itself handed stays the caller's caller's term."""
    assert module_codes(HANDED_ON, tmp_path) == [(21, "KL008")]


# The rollout runs the policy under `with torch.no_grad()` inside a helper and returns its log-probs with the
# reward; the update compares fresh log-probs with those: a ratio to the behaviour policy.
ROLLOUT_HELPER = """\
import torch
import torch.nn.functional as F


def compute_rewards(model, ref_model, input_data, beta):
    with torch.no_grad():
        logits = model(**input_data)
        ref_logits = ref_model(**input_data)
        labels = input_data["input_ids"][:, 1:].unsqueeze(-1)
        logp = torch.gather(F.log_softmax(logits[:, :-1, :], dim=-1), 2, labels).squeeze(-1)
        ref_logp = torch.gather(F.log_softmax(ref_logits[:, :-1, :], dim=-1), 2, labels).squeeze(-1)
        rewards = -beta * (logp - ref_logp)
    return logp, rewards


def train(model, ref_model, loader, optimizer, beta, ppo_epochs=4):
    for batch in loader:
        old_logprobs, rewards = compute_rewards(model, ref_model, batch, beta)
        advantages = rewards.flip(-1).cumsum(-1).flip(-1)
        for _ in range(ppo_epochs):
            logits = model(**batch)
            labels = batch["input_ids"][:, 1:].unsqueeze(-1)
            logprobs = torch.gather(F.log_softmax(logits[:, :-1, :], dim=-1), 2, labels).squeeze(-1)
            ratio = torch.exp(logprobs - old_logprobs)
            loss = -(ratio * advantages).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""


def test_policy_log_probs_a_helper_returns_from_a_no_grad_block_are_the_behaviour_policys(tmp_path):
    """compute_rewards' `logp` has no gradient: returned, it is the rollout's log-probs, and exp(logprobs -
    old_logprobs) in the update is the PPO ratio (row 23: KL008 at the reward, line 12). A helper without
    the block that detaches what it returns may serve the same step (`exp(logp - sg(logp))`, the score's
    weight): its log-probs stay the current policy's, no ratio to an older one, row 6, silent."""
    assert module_codes(ROLLOUT_HELPER, tmp_path) == [(12, "KL008")]
    detached = ROLLOUT_HELPER.replace("    with torch.no_grad():\n", "    if True:\n").replace(
        "rewards = -beta * (logp - ref_logp)", "rewards = -beta * (logp - ref_logp).detach()").replace(
        "return logp, rewards", "return logp.detach(), rewards")
    assert module_codes(detached, tmp_path) == []
