"""KL losses with no gradient (kl-math.md row 1c): the estimate is taken without autograd and then
returned as the loss, so back-propagation never reaches the policy through it."""

import torch


def no_grad_k3_kl_loss(logprobs, ref_logprobs, mask):
    """The k3 loss of a GRPO trainer, computed inside torch.no_grad() (a scalar: audited as a loss)."""
    with torch.no_grad():
        log_ratio = ref_logprobs - logprobs
        k3 = torch.exp(log_ratio) - 1 - log_ratio
    return (k3 * mask).sum(-1).mean()


def item_k1_kl_loss(logprobs, ref_logprobs, mask):
    """The batch's mean log-ratio as a Python number, put back into a tensor for the loss."""
    value = ((logprobs - ref_logprobs) * mask).sum().item() / mask.sum().item()
    return torch.tensor(value, dtype=logprobs.dtype)
