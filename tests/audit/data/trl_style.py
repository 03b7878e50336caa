"""TRL-style GRPO KL losses: per-token k3 times beta, aggregated inside the function, once per
sequence by its own length (the original GRPO 1/|o|) and once over all tokens of the batch."""

import torch


def grpo_kl_loss(per_token_logps, ref_per_token_logps, completion_mask, beta: float = 0.04):
    per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    per_token_loss = beta * per_token_kl
    return ((per_token_loss * completion_mask).sum(dim=1) / completion_mask.sum(dim=1)).mean()


def dapo_kl_loss(per_token_logps, ref_per_token_logps, completion_mask, beta: float = 0.04):
    per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    return (beta * per_token_kl * completion_mask).sum() / completion_mask.sum()
