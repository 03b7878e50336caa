"""Shapes of KL code met in the twenty-fifth fresh set's review.

Verdicts (kl-math.md section 8): a k1 reward summed over each sequence and added to the task reward with a minus
sign, on-policy, is row 6 (right, silent); the same reward divided by each sequence's length is row 21 (KL007).
"""

from __future__ import annotations

from snippets import module_codes

# getyourcheck/Marl's GRPO repeater: the KL reward's form is a switch with no else branch, and the leave-one-out
# baseline is built from the rewards themselves, `(rewards.sum(0) - rewards) / (k - 1)`.
SWITCHED_REWARD = """\
class Repeater:
    def process(self, scores, logp, ref_logp, mask):
        kl_distance = logp - ref_logp
        rewards = scores
        if self.kl_reward_penalty == "sum":
            kl_reward = (-self.kl_coeff * kl_distance).sum(1)
            rewards = rewards + kl_reward
        elif self.kl_reward_penalty == "mean":
            kl_reward = -self.kl_coeff * kl_distance.sum(1) / mask.sum(1)
            rewards = rewards + kl_reward
        rewards = rewards.reshape(-1, self.grpo_k).T
        baseline = (rewards.sum(0) - rewards) / (self.grpo_k - 1)
        advantages = rewards - baseline
        return advantages.T.flatten()
"""


def test_a_value_left_where_no_branch_ran_meets_only_its_own_path(tmp_path):
    """Where neither branch runs, `rewards` keeps the task scores the analysis cannot explain, and that value
    holds only there: the baseline's `rewards.sum(0) - rewards` pairs the "sum" path's KL reward with itself, not
    with the scores of the path where no KL was added, which made a KL reward of the opposite sign (read as a
    bonus, KL011). The "sum" form is right (row 6); the "mean" form weighs each sequence by 1/L (row 21)."""
    assert module_codes(SWITCHED_REWARD, tmp_path) == [(9, "KL007")]
