"""A module that registers an advantage estimator handing each token's reward on as its advantage.

SkyRL's on-policy distillation example sets the rewards to the detached k1 against the teacher,
`-(logp - teacher_logp)` on every token, and registers `no_op`, which returns them as the advantages: each token's
score meets its own log-ratio only, the later tokens' never (kl-math.md section 8, row 2: KL003). An estimator
that sums the later rewards (a reward-to-go) is the right use of the same reward (row 8), and where the module
registers none the reward is taken to reach the scores so.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

DISTILLATION = """\
import torch
from skyrl.train.trainer import RayPPOTrainer
from skyrl.backends.skyrl_train.utils.ppo_utils import register_advantage_estimator


class OnPolicyDistillationTrainer(RayPPOTrainer):
    def apply_reward_kl_penalty(self, data):
        loss_mask = data["loss_mask"]
        teacher_logprobs = data["base_action_log_probs"]
        action_log_probs = data["action_log_probs"]
        rewards = -(action_log_probs - teacher_logprobs) * loss_mask
        data["rewards"] = rewards
        return data


@register_advantage_estimator("{name}")
def compute_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, **kwargs):
    {body}
"""


def test_rewards_handed_on_as_advantages_reach_their_own_token_only(tmp_path):
    """Before, the reward was taken to reach the scores as a reward-to-go: silent."""
    source = DISTILLATION.format(name="no_op", body="return token_level_rewards, token_level_rewards")
    assert module_codes(source, tmp_path) == [(11, "KL003")]


@pytest.mark.parametrize("body", [
    "returns = token_level_rewards.flip(-1).cumsum(-1).flip(-1) * response_mask\n    return returns, returns",
    "return response_mask, token_level_rewards",
])
def test_an_estimator_that_sums_the_later_rewards_is_right(tmp_path, body):
    assert module_codes(DISTILLATION.format(name="to_go", body=body), tmp_path) == []
