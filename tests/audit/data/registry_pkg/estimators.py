"""A per-token KL helper with straight-through variants, as verl 0.9.1 writes them: a name ending in '+'
takes k2's gradient with the named estimator's value."""

import torch


def kl_penalty(logprob, ref_logprob, kl_penalty="k1"):
    name = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    log_ratio = logprob - ref_logprob
    if name == "k1":
        value = log_ratio
    elif name == "k3":
        value = torch.exp(-log_ratio) - 1 + log_ratio
    else:
        raise NotImplementedError(kl_penalty)
    if not kl_penalty.endswith("+"):
        return value
    k2 = 0.5 * log_ratio.square()
    return k2 - k2.detach() + value.detach()
