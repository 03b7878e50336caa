"""A loss helper of another module handed a rollout object whose log-probs carry the policy's gradient.

Shivii-Jain/GRPO (thirty-third set) collects a `Rollout(logp, ref_logp, rewards, ...)` dataclass whose `logp` is
computed with gradient, and its `policy_loss(rollout, beta_kl)` in grpo.py adds `beta_kl * (rollout.logp -
rollout.ref_logp).mean()` to the loss: k1 as a loss (kl-math.md section 8, row 1: KL001). Read alone, grpo.py's
helper takes a parameter's entries for stored data without gradient and reports nothing; the caller, which knows
what the rollout holds, saw the term enter the loss in the helper and left it to be "reported there". It is now
reported at the caller's sink where the helper's own reading does not see it, and only there.
"""

from __future__ import annotations

from snippets import module_codes

HELPER = """\
    import torch


    def policy_loss(rollout, beta_kl):
        advantages = rollout.rewards - rollout.rewards.mean(dim=0, keepdim=True)
        kl = (rollout.LOGP - rollout.ref_logp).mean()
        loss = -(advantages.detach() * rollout.LOGP).mean() + beta_kl * kl
        return loss, kl.detach()
"""

TRAIN = """\
    import torch
    from grpo import policy_loss


    class Rollout:
        def __init__(self, logp, ref_logp, rewards):
            self.logp, self.ref_logp, self.rewards = logp, ref_logp, rewards


    def train(policy, reference, batch, optimizer, beta_kl):
        logp = policy(batch)
        with torch.no_grad():
            ref_logp = reference(batch)
        rollout = Rollout(logp, ref_logp, batch.rewards)
        loss, kl = policy_loss(rollout, beta_kl)
        loss.backward()
        optimizer.step()
"""


def test_the_caller_reports_a_term_its_helper_cannot_see(tmp_path):
    helper = HELPER.replace("LOGP", "logp")
    assert module_codes(helper, tmp_path, "grpo.py") == []  # read alone: stored data, no gradient
    assert module_codes(TRAIN, tmp_path, "train.py", grpo=helper) == [(16, "KL001")]


def test_a_term_the_helper_reports_itself_is_not_reported_again_at_the_caller(tmp_path):
    """A helper whose parameters name the log-probs directly reports its k1 loss where it enters: the caller
    adds nothing."""
    helper = """\
        import torch


        def policy_loss(logp, ref_logp, rewards, beta_kl):
            advantages = rewards - rewards.mean(dim=0, keepdim=True)
            kl = (logp - ref_logp).mean()
            loss = -(advantages.detach() * logp).mean() + beta_kl * kl
            return loss, kl.detach()
    """
    assert module_codes(helper, tmp_path, "grpo.py") == [(7, "KL001")]
    train = TRAIN.replace("rollout = Rollout(logp, ref_logp, batch.rewards)\n        ", "").replace(
        "policy_loss(rollout, beta_kl)", "policy_loss(logp, ref_logp, batch.rewards, beta_kl)")
    assert module_codes(train, tmp_path, "train.py", grpo=helper) == []
