"""Which samples a KL term is computed on, read off the code (kl-math.md section 7, rows 2, 22, 23).

A ratio of the policy to the behaviour policy (PPO's exp(logp - old_logp)) is computed only where
the two can differ: the step trains on samples of an older policy, and a KL loss there without
prefix importance weights is biased (row 22). The same ratio multiplying the KL with its gradient
is exp(logp - sg(logp)) on-policy, so ratio * k3 has the local gradient only (row 2, KL003).
"""

from __future__ import annotations

import textwrap

import libcst as cst

from klaudit.lint.checks import check_module
from klaudit.lint.project import Project

HEADER = "import torch\n\n\n"


def codes(body: str, tmp_path) -> list:
    text = HEADER + textwrap.dedent(body)
    path = tmp_path / "snippet.py"
    path.write_text(text)
    findings = check_module(str(path), cst.parse_module(text), Project([tmp_path]), text)
    return sorted({f.code for f in findings if f.code != "KL100"})


K3 = "torch.exp(ref_logp - logp) - (ref_logp - logp) - 1"


def test_k3_weighted_by_a_differentiable_ratio_to_old_is_local_and_token_reweighted(tmp_path):
    """exp(logp - old) * k3: ratio*k3 (row 2, PART, KL003) on older samples with a token ratio only (row 23, KL008);
    not an unmatched loss + reward mix (KL009)."""
    body = f"""
    def grpo_loss(logp, old_logp, ref_logp, advantages, mask, beta):
        coef = torch.exp(logp - old_logp)
        pg = -coef * advantages.unsqueeze(-1)
        kl = ({K3}) * coef
        return ((pg + beta * kl) * mask).sum(-1).mean()
    """
    assert codes(body, tmp_path) == ["KL003", "KL008"]


def test_k3_loss_next_to_a_ppo_ratio_is_off_policy(tmp_path):
    """A plain k3 loss in the step that forms the PPO ratio: row 3 (KL002) and, on older samples, row 22 (KL008)."""
    body = f"""
    def ppo_loss(logp, old_logp, ref_logp, advantages, mask, beta):
        ratio = torch.exp(logp - old_logp)
        pg = -torch.min(ratio * advantages, torch.clamp(ratio, 0.8, 1.2) * advantages)
        kl = {K3}
        return ((pg + beta * kl) * mask).sum(-1).mean()
    """
    assert codes(body, tmp_path) == ["KL002", "KL008"]


def test_a_call_given_both_log_probs_compares_them(tmp_path):
    """The ratio formed inside a policy-loss function the lint cannot see (`policy_loss_fn(old_log_prob=...,
    log_prob=...)`) still says the samples are the behaviour policy's (row 22)."""
    body = f"""
    def update(batch, logp, policy_loss_fn, beta):
        old_log_prob = batch["old_log_probs"]
        ref_logp = batch["ref_log_prob"]
        pg_loss = policy_loss_fn(old_log_prob=old_log_prob, log_prob=logp, advantages=batch["advantages"])
        kl = {K3}
        loss = pg_loss + beta * (kl * batch["response_mask"]).sum(-1).mean()
        loss.backward()
    """
    assert codes(body, tmp_path) == ["KL002", "KL008"]


def test_without_a_comparison_to_the_behaviour_policy_the_step_is_on_policy(tmp_path):
    """The same k3 loss with no ratio to older log-probs (row 3 only); rollout log-probs that only enter the KL
    value (a teacher margin on fresh samples) compare nothing either."""
    plain = f"""
    def grpo_loss(logp, ref_logp, advantages, mask, beta):
        pg = -advantages.unsqueeze(-1) * torch.exp(logp - logp.detach())
        kl = {K3}
        return ((pg + beta * kl) * mask).sum(-1).mean()
    """
    assert codes(plain, tmp_path) == ["KL002"]
    margin = """
    def distill_loss(logp, rollout_logprobs, teacher_logprobs, mask):
        rollout = torch.where(mask, rollout_logprobs, 0.0)
        advantages = (teacher_logprobs - rollout).detach()
        return -(logp * advantages * mask).sum(-1).mean()
    """
    assert "KL008" not in codes(margin, tmp_path)


def test_a_clamp_beside_a_wrong_placement_is_its_own_defect(tmp_path):
    """A clamped k1 reaching only its own token's score: the placement is row 2 (KL003) and the clamp cuts the
    gradient where pi and ref differ most (KL010); the unclamped same-token reward is row 2 alone."""
    body = """
    def opd_loss(logp, ref_logp, mask):
        k1 = (logp - ref_logp).detach(){clamp}
        return (logp * k1 * mask).sum(-1).mean()
    """
    assert codes(body.format(clamp=".clamp(-10, 10)"), tmp_path) == ["KL003", "KL010"]
    assert codes(body.format(clamp=""), tmp_path) == ["KL003"]


def test_a_clamped_value_under_a_straight_through_gradient_changes_nothing(tmp_path):
    """k3+: the value of a clamped k3, the gradient of the unclamped k2; as a loss it is row 2 (KL003), the
    clamp on the detached value never reaches the gradient."""
    body = """
    def kl_loss(logp, ref_logp, mask):
        k2 = 0.5 * (logp - ref_logp).square()
        log_ratio = torch.clamp(ref_logp - logp, -20, 20)
        k3 = torch.clamp(torch.exp(log_ratio) - log_ratio - 1, -10, 10)
        kl = k2 - k2.detach() + k3.detach()
        return (kl * mask).sum(-1).mean()
    """
    assert codes(body, tmp_path) == ["KL003"]
