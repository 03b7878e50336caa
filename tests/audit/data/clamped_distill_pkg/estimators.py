"""Per-token KL estimates between the policy and a teacher, picked by name (as verl's kl_penalty)."""

import torch


def kl_term(logprob, ref_logprob, kind):
    log_ratio = logprob - ref_logprob
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        return torch.exp(-log_ratio) - 1 + log_ratio
    raise ValueError(kind)
