"""Shapes of KL code met in the eleventh review (the ninth fresh set: safe-rlhf, DeepSpeed-Chat-style rewards).

Verdicts (kl-math.md section 8): a detached k1 reward used as a reward-to-go is right with a token-sum
or batch token-mean (rows 15/16); the policy-gradient loss divided by each sequence's own length gives
the reward's KL 1/L weights (row 21, KL007). A clamp on the reward tokens that hold the k1 changes the
estimate where it bites (KL010).
"""

from __future__ import annotations

from snippets import module_codes

PER_SEQUENCE_LOSS = """\
def masked_mean(x, mask):
    return ((x * mask).sum(dim=-1) / mask.sum(dim=-1)).mean()


def step(actor, batch):
    with torch.no_grad():
        rewards = kl_reward(batch["log_probs"], batch["ref_log_probs"], batch["score"], batch["end"])
        advantages = rewards.flip(-1).cumsum(-1).flip(-1)
    log_probs = actor(batch["input_ids"])
    ratios = torch.exp(log_probs - batch["log_probs"])
    loss = -masked_mean(ratios * advantages, batch["mask"])
    loss.backward()
"""


def test_a_score_added_by_scatter_add_keeps_the_kl_reward(tmp_path):
    """safe-rlhf: `torch.scatter_add(-beta * k1, -1, end, score)` puts the score at each sequence's last
    token; the rest of the tensor is still the k1 reward, followed into the per-sequence mean (row 21),
    reported where the caller stores the reward."""
    source = """\
    import torch


    def kl_reward(log_probs, ref_log_probs, score, end):
        kl = log_probs - ref_log_probs
        return torch.scatter_add(-0.05 * kl, dim=-1, index=end.unsqueeze(-1), src=score.unsqueeze(-1))


    """ + PER_SEQUENCE_LOSS.replace("\n", "\n    ")
    assert module_codes(source, tmp_path) == [(15, "KL007")]


def test_a_reward_named_in_its_helper_is_reduced_where_its_caller_reduces_the_loss(tmp_path):
    """DeepSpeed-Chat's `compute_rewards`: `rewards = -beta * kl; return rewards`. The helper names the
    value a reward and hands it on unreduced; the caller's per-sequence mean decides its 1/L weights
    (row 21), reported where the helper forms the reward."""
    source = """\
    import torch


    def kl_reward(log_probs, ref_log_probs, score, end):
        kl = log_probs - ref_log_probs
        rewards = -0.05 * kl
        return rewards


    """ + PER_SEQUENCE_LOSS.replace("\n", "\n    ")
    assert module_codes(source, tmp_path) == [(6, "KL007")]


def test_a_reward_reduced_over_the_batch_tokens_is_right(tmp_path):
    """The same helper with the loss a token mean over the batch: a k1 reward-to-go, right (row 15)."""
    source = """\
    import torch


    def kl_reward(log_probs, ref_log_probs, score, end):
        kl = log_probs - ref_log_probs
        rewards = -0.05 * kl
        return torch.scatter_add(rewards, -1, end.unsqueeze(-1), score.unsqueeze(-1))


    """ + PER_SEQUENCE_LOSS.replace("\n", "\n    ").replace(
        "((x * mask).sum(dim=-1) / mask.sum(dim=-1)).mean()", "(x * mask).sum() / mask.sum()")
    assert module_codes(source, tmp_path) == []


def test_an_entry_of_a_dict_of_rewards_is_a_reward(tmp_path):
    """rlhf-book's `apply_reward_kl`: `rewards["total"] = rewards["total"] - beta * kl` in a dict of rewards
    the caller turns into advantages. With k2 that is k2 values in the reward (row 8, KL004)."""
    source = """\
    import torch


    def apply_reward_kl(rewards, log_probs, ref_log_probs, beta):
        kl = 0.5 * (log_probs - ref_log_probs) ** 2
        rewards["total"] = rewards["total"] - beta * kl
        return rewards


    def step(actor, batch, beta):
        with torch.no_grad():
            rewards = apply_reward_kl(batch["rewards"], batch["log_probs"], batch["ref_log_probs"], beta)
            advantages = rewards["total"].flip(-1).cumsum(-1).flip(-1)
        log_probs = actor(batch["input_ids"])
        loss = -(log_probs * advantages * batch["mask"]).sum() / batch["mask"].sum()
        loss.backward()
    """
    assert module_codes(source, tmp_path) == [(6, "KL004")]


def test_a_token_weight_on_the_ratio_inside_k3_keeps_the_estimator(tmp_path):
    """grpo-composer's TR-GRPO regulariser (fifth set): w * ref/pi - log(w * ref/pi) - 1 with the log-ratio
    clamped, a token-weighted k3 as a loss (rows 3/4, KL002). The weight is an unexplained factor of the
    ratio, not an advantage: the product stays the ratio, unlike `ratio * advantages` (no estimator)."""
    source = """\
    import torch


    def weighted_kl(log_probs, ref_log_probs, weights, mask):
        log_ref_over_pi = torch.clamp(ref_log_probs - log_probs, min=-20.0, max=20.0)
        ref_over_pi = torch.exp(log_ref_over_pi)
        weighted_ratio = torch.clamp(weights * ref_over_pi, min=1e-8)
        kl = (weighted_ratio - torch.log(weighted_ratio) - 1.0) * mask
        return kl.sum() / mask.sum()


    def loss_fn(pg_loss, log_probs, ref_log_probs, weights, mask, beta):
        loss = pg_loss + beta * weighted_kl(log_probs, ref_log_probs, weights, mask)
        loss.backward()
    """
    assert module_codes(source, tmp_path) == [(13, "KL002")]
