"""Shapes of KL code met in the twenty-third fresh set's review.

Verdicts (kl-math.md section 8): a k1 reward computed once per batch of rollouts and trained over several PPO
epochs, meeting only the token ratio, is row 23 (KL008).
"""

from __future__ import annotations

from snippets import module_codes

# TRL's PPO trainer as its vendored copies ship it: the advantages are whitened by a helper of another module,
# `core.py`, whose text has no KL word (masks, means, variances); the reward reaches the policy loss through it.
WHITEN = """\
import torch


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum()


def masked_whiten(values, mask):
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    return (values - mean) * torch.rsqrt(variance + 1e-8)
"""

TRAINER = """\
import torch

from core import masked_whiten


def train(policy, optimizer, old_logprobs, ref_logprobs, scores, mask, batch, args):
    with torch.no_grad():
        kl = old_logprobs - ref_logprobs
        rewards = -args.kl_coef * kl
        rewards[:, -1] += scores
        running, reversed_returns = 0.0, []
        for t in reversed(range(rewards.shape[1])):
            running = rewards[:, t] + running
            reversed_returns.append(running)
        advantages = masked_whiten(torch.stack(reversed_returns[::-1], dim=1), mask)
    for epoch in range(4):
        new_logprobs = policy(batch)
        ratio = torch.exp(new_logprobs - old_logprobs)
        loss = -(advantages * ratio * mask).sum() / mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def test_a_reward_whitened_by_a_helper_without_kl_words_reaches_the_epoch_loop(tmp_path):
    assert module_codes(TRAINER, tmp_path, core=WHITEN) == [(9, "KL008")]


def test_a_helper_of_such_a_module_named_for_nothing_the_lint_knows_is_not_followed(tmp_path):
    """The module is followed for the helper's name only: one named for neither a loss, a reduction nor a return
    computation gives an unknown value, and the reward is not followed into the loss. The epoch loop after the
    reward in the same function still trains the rollout's samples four times (row 23: KL008 at the reward, as
    JunyiJ/PostTraining-LLM-Small's buffered rewards in the fifty-seventh set)."""
    renamed = {"core": WHITEN.replace("def masked_whiten", "def rescale")}
    assert module_codes(TRAINER.replace("masked_whiten", "rescale"), tmp_path, **renamed) == [(9, "KL008")]


# A multi-turn trainer's advantages: a k1 penalty per token, GAE over each turn, then the turns' advantages
# centred by their mean and scaled, the mean taken in Python over a list of the same values.
CENTRED = """\
def turn_advantages(turns, values, kl_coef, gamma, lam):
    for t, turn in enumerate(turns):
        token_rewards = [-kl_coef * (lp - rlp) for lp, rlp in zip(turn.logprobs, turn.ref_logprobs)]
        n = len(token_rewards)
        token_adv = [0.0] * n
        token_adv[-1] = values[t]
        for i in reversed(range(n - 1)):
            token_adv[i] = token_rewards[i] + gamma * lam * token_adv[i + 1]
        turn.advantage = sum(token_adv) / n
    advantages = [turn.advantage for turn in turns]
    mean = sum(advantages) / len(turns)
    std = (sum((a - mean) ** 2 for a in advantages) / len(turns)) ** 0.5 + 1e-8
    for turn in turns:
        turn.advantage = (turn.advantage - mean) / std
    return turns
"""


def test_advantages_centred_by_a_mean_of_the_same_values_keep_the_penaltys_sign(tmp_path):
    """Subtracting the mean is a baseline: no opposite-signed KL term appears (no KL011 'bonus'); the k1
    reward itself reaches only the turn's own advantage here, as a same-token reward would (KL003)."""
    assert module_codes(CENTRED, tmp_path) == [(3, "KL003")]
