"""OpenRLHF-style estimator helper: float32 arithmetic, the log-ratio variable reused for k2/k3,
and a clamp of the result. Its callers put it into the reward or into the loss."""

import torch


def compute_approx_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor, kl_estimator: str = "k1") -> torch.Tensor:
    if kl_estimator == "k1":
        log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k2":
        log_ratio = log_probs.float() - log_probs_base.float()
        log_ratio = log_ratio ** 2 / 2.0
    if kl_estimator == "k3":
        log_ratio = log_probs.float() - log_probs_base.float()
        log_ratio = -log_ratio
        log_ratio = log_ratio.exp() - 1 - log_ratio
    return log_ratio.clamp(min=-10, max=10)
