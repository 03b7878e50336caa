"""A table of per-token KL estimates returned as a dict, the caller picking one by key (compose-rl's
approx_kl is written so): check-grad audits each entry."""


def kl_estimates(logprobs, ref_logprobs):
    log_ratio = logprobs - ref_logprobs
    return {
        "k1": log_ratio,
        "k2": 0.5 * log_ratio**2,
        "k3": (-log_ratio).exp() - 1 + log_ratio,
        "length": logprobs.new_tensor(float(logprobs.shape[-1])),  # a statistic beside them (no gradient)
        "name": "estimates",
    }
