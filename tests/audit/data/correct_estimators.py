"""Correct KL terms built with klaudit.estimators: k1 reward-to-go, k3 loss plus k3 reward, and
the Rao-Blackwellized form from the logits."""

from klaudit.estimators import kl_penalty


def k1_kl_loss(logprobs, ref_logprobs, mask):
    return kl_penalty(logprobs, ref_logprobs, mask).loss


def k3_kl_loss(logprobs, ref_logprobs, mask):
    return kl_penalty(logprobs, ref_logprobs, mask, estimator="k3").loss


def rb_kl_loss(logprobs, ref_logprobs, mask, logits, ref_logits):
    return kl_penalty(logprobs, ref_logprobs, mask, estimator="rb", logits=logits, ref_logits=ref_logits).loss.mean()


def detached_kl_reward(log_probs, ref_log_probs):
    """A reward helper computed without gradient: audited as a reward only."""
    import torch

    with torch.no_grad():
        return log_probs - ref_log_probs
