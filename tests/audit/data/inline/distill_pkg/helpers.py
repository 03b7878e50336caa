"""Helpers the trainer imports relatively."""

import torch


def clip_ratio(per_token_loss, log_probs, old_log_probs, clip):
    ratio = torch.exp((log_probs - old_log_probs).detach()).clamp(max=clip)
    return per_token_loss * ratio
