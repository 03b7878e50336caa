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
    weight): its log-probs stay the current policy's, no ratio to an older one, row 6, silent, in one update;
    over `ppo_epochs` optimizer steps on the same batch the loop itself shows older samples (row 23)."""
    assert module_codes(ROLLOUT_HELPER, tmp_path) == [(12, "KL008")]
    detached = ROLLOUT_HELPER.replace("    with torch.no_grad():\n", "    if True:\n").replace(
        "rewards = -beta * (logp - ref_logp)", "rewards = -beta * (logp - ref_logp).detach()").replace(
        "return logp, rewards", "return logp.detach(), rewards")
    assert module_codes(detached.replace("range(ppo_epochs)", "range(1)"), tmp_path) == []
    assert module_codes(detached, tmp_path) == [(12, "KL008")]


# The usual GAE of hand-written PPO (TRL's legacy trainer, rlhf-from-scratch): the running sums appended to a
# list in a reversed loop, stacked back, whitened, then weighed by the PPO ratio over several epochs.
GAE_LIST = """\
import torch


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum()


def masked_whiten(values, mask):
    mean, var = masked_mean(values, mask), masked_mean((values - masked_mean(values, mask)) ** 2, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    whitened += mean
    return whitened


def rollout_rewards(batch, beta):
    masks = torch.zeros_like(batch["attention_mask"][:, 1:])
    masks[:, :] = batch["attention_mask"][:, 1:]
    for j in range(len(batch["starts"])):
        masks[j, :batch["starts"][j]] = 0
    rewards = -beta * (batch["old_logprobs"] - batch["ref_logprobs"]) * masks
    return rewards, masks


def compute_advantage(rewards, values, masks):
    lastgae = 0.0
    advantages_reversed = []
    for t in reversed(range(rewards.shape[-1])):
        nextvalues = values[:, t + 1] if t < rewards.shape[-1] - 1 else 0.0
        delta = rewards[:, t] + nextvalues - values[:, t]
        lastgae = delta + 0.95 * lastgae
        advantages_reversed.append(lastgae)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    return masked_whiten(advantages, masks)


def train(policy, batch, optimizer, beta, ppo_epochs=4):
    rewards, masks = rollout_rewards(batch, beta)
    advantages = compute_advantage(rewards, batch["values"], masks)
    for _ in range(ppo_epochs):
        logprobs = policy(batch["input_ids"])
        ratio = torch.exp(logprobs - batch["old_logprobs"])
        loss = masked_mean(torch.max(-ratio * advantages, -ratio.clamp(0.8, 1.2) * advantages), masks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_gae_running_sums_appended_to_a_list_reach_the_ratio_that_weighs_them(tmp_path):
    """The k1 reward (line 20) reaches the clipped PPO loss through the stacked list and the whitening: row 23,
    KL008. Whitening subtracts a batch mean of the advantages, a baseline: the penalty stays a penalty (no
    KL011), though the mask it is taken over is also read as the zeros it was filled into."""
    assert module_codes(GAE_LIST, tmp_path) == [(20, "KL008")]


def test_a_biased_reward_weighed_by_the_ratio_later_is_both_biased_and_stale(tmp_path):
    """The same update with k2 values in the reward: rows 8 and 23 both hold, KL004 and KL008 at line 20.
    The reward's own row is found at its first use; the ratio's use after it still says the samples are old."""
    k2 = GAE_LIST.replace('rewards = -beta * (batch["old_logprobs"] - batch["ref_logprobs"]) * masks',
                          'rewards = -beta * 0.5 * (batch["old_logprobs"] - batch["ref_logprobs"]) ** 2 * masks')
    assert module_codes(k2, tmp_path) == [(20, "KL004"), (20, "KL008")]


# A TRL PPOTrainer copy without a value model (AIXueRLHF): the reward-to-go recursion reads the list it appends to.
RETURNS_THROUGH_THE_LIST = """\
import torch


def advantages_of(logprobs, ref_logprobs, scores, gamma, kl_coef, kl_estimator="k1"):
    logr = ref_logprobs - logprobs
    kl = -logr if kl_estimator == "k1" else (logr.exp() - 1) - logr
    rewards = -kl_coef * kl
    rewards[:, -1] += scores
    advantages_reversed = []
    gen_length = rewards.shape[1]
    for t in reversed(range(gen_length)):
        next_advantage = advantages_reversed[-1] if t < gen_length - 1 else 0.0
        advantages_reversed.append(rewards[:, t] + gamma * next_advantage)
    advantages = torch.stack(advantages_reversed[::-1], axis=1)
    return advantages
"""


def test_a_return_recursion_through_the_list_it_appends_to_is_a_reward_to_go(tmp_path):
    """k1 in the reward with its reward-to-go is row 6, right; k3 values there are row 7 (KL004, line 7, the
    k3 switch value). Read as each step's own reward, the k1 value was a false KL003 (row 2's local term)."""
    assert module_codes(RETURNS_THROUGH_THE_LIST, tmp_path) == [(7, "KL004")]


# Safe RLHF (align-anything's saferlhf): the KL is a penalty in the reward and, with the opposite sign, a part of
# the cost, whose advantages the loss function subtracts from the reward's with a Lagrange multiplier.
REWARD_AND_COST = """\
import torch


def actor_loss_fn(log_probs, old_log_probs, reward_advantages, cost_advantages, mask, multiplier):
    advantages = (reward_advantages - multiplier * cost_advantages) / (1.0 + multiplier)
    ratios = torch.exp(log_probs - old_log_probs)
    surrogate = torch.minimum(advantages * ratios, advantages * torch.clamp(ratios, 0.8, 1.2))
    return -(surrogate * mask).sum() / mask.sum()


def rl_step(policy, batch, beta, log_lambda):
    old_log_probs, mask = batch["old_log_probs"], batch["mask"]
    rewards = -beta * (old_log_probs - batch["ref_log_probs"]) + batch["score"]
    costs = beta * (old_log_probs - batch["ref_log_probs"]) + batch["cost"]
    reward_returns = rewards.flip(-1).cumsum(-1).flip(-1)
    cost_returns = costs.flip(-1).cumsum(-1).flip(-1)
    reward_advantages = reward_returns - batch["reward_values"]
    cost_advantages = cost_returns - batch["cost_values"]
    log_probs = policy(batch["input_ids"])
    loss = actor_loss_fn(log_probs, old_log_probs, reward_advantages, cost_advantages, mask, log_lambda.exp().item())
    loss.backward()
"""


def test_a_kl_term_in_a_cost_is_judged_where_the_cost_is_subtracted(tmp_path):
    """The cost carries +beta * k1; its advantages, subtracted in the loss, make the combined advantages a
    penalty again: the k1 reward under the PPO ratio is row 23 (KL008, at the call that combines them, line
    20), and `cost_returns` (line 16), named like a reward, is no KL bonus (KL011)."""
    assert module_codes(REWARD_AND_COST, tmp_path) == [(20, "KL008")]
