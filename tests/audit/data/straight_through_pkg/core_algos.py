"""KL estimators chosen by name; a trailing '+' keeps the estimator's value and takes k2's gradient."""

import torch


def kl_penalty(logprob, ref_logprob, kl_penalty):
    """The estimator named by kl_penalty; "k1+", "k3+": its value with the gradient of 0.5 * delta ** 2."""
    plain = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    value = kl_penalty_forward(logprob, ref_logprob, plain)
    if not kl_penalty.endswith("+"):
        return value
    surrogate = 0.5 * (logprob - ref_logprob).square()
    return surrogate - surrogate.detach() + value.detach()


def kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    """The plain estimators: k1 (log-ratio), k2 (half its square) and k3 (ratio - 1 - log ratio)."""
    if kl_penalty == "k1":
        return logprob - ref_logprob
    if kl_penalty == "k2":
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty == "k3":
        log_ratio = ref_logprob - logprob
        return torch.exp(log_ratio) - log_ratio - 1
    raise NotImplementedError(kl_penalty)
