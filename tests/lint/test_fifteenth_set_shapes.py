"""Shapes of KL code met in the fifteenth review (the thirteenth fresh set).

Verdicts (kl-math.md section 8): a biased estimator's values in the token reward are KL004 (row 7).
"""

from __future__ import annotations

from snippets import module_codes

# An EasyR1 copy's ray_trainer: the reward is stored under a key where it is formed, and the next function
# reads the key back into a local of the same name before computing the advantages from it.
ESTIMATORS = """\
import torch


def compute_kl(log_probs, ref_log_probs, kl_penalty="kl"):
    log_ratio = log_probs - ref_log_probs
    if kl_penalty == "kl":
        return log_ratio
    if kl_penalty == "low_var_kl":
        return torch.clamp(torch.exp(-log_ratio) - 1 + log_ratio, -10, 10)
    raise NotImplementedError(kl_penalty)
"""

TRAINER = """\
import torch
from estimators import compute_kl


def apply_kl_penalty(data, kl_coef, kl_penalty="kl"):
    kld = compute_kl(data.batch["old_log_probs"], data.batch["ref_log_probs"], kl_penalty=kl_penalty)
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - kl_coef * kld
    return data


def compute_advantage(data, gamma=1.0):
    token_level_rewards = data.batch["token_level_rewards"]
    returns = torch.flip(torch.cumsum(torch.flip(token_level_rewards, [-1]), -1), [-1])
    data.batch["advantages"] = returns * data.batch["response_mask"]
    return data
"""


def test_a_reward_read_back_from_its_key_is_the_same_reward(tmp_path):
    """One KL004 where the estimate enters the reward (line 7); compute_advantage's read of the key (line 12)
    was reported as a second sink of the same term."""
    assert module_codes(TRAINER, tmp_path, name="trainer.py", estimators=ESTIMATORS) == [(7, "KL004")]
