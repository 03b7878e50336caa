"""A KL helper whose parameters are named only `current` and `ref` (grpo-go-brrr's masked_kl)."""

import torch


def masked_kl(current, ref, mask):
    diff = ref - current
    kl = torch.exp(diff) - diff - 1
    return (kl * mask).sum(dim=1).mean()
