"""klaudit's model of the KL estimator of an installed verl (`verl.trainer.ppo.core_algos`), as of verl 0.9.

Read by the lint, never imported or run: where the linted tree calls verl's `kl_penalty` but does not
hold verl itself (a trainer built on the verl package), this text stands in for it, so that the KL
term the call returns is followed like one computed in the tree. Each `kl_penalty` value gives one
estimate per token of KL(pi || ref), with d = log pi - log ref:

    kl, k1        d
    mse, k2       d^2 / 2
    abs           |d|
    low_var_kl,   k3 = exp(-d) - 1 + d, with -d clamped to [-20, 20] and the result to [-10, 10]
    k3

A value with a "+" suffix (k1+, low_var_kl+, ...) keeps the plain value and takes k2's gradient
(straight-through); for k2 itself the suffix changes nothing.
"""


def kl_penalty(logprob, ref_logprob, kl_penalty):
    """The per-token KL estimate `kl_penalty` names."""
    if kl_penalty in ("kl+", "k1+", "abs+", "low_var_kl+", "k3+"):
        k2 = 0.5 * (logprob - ref_logprob).square()
        return k2 - k2.detach() + suffixed_value(logprob, ref_logprob, kl_penalty).detach()
    return plain_estimate(logprob, ref_logprob, kl_penalty)


def plain_estimate(logprob, ref_logprob, kl_penalty):
    """An estimate without the straight-through suffix (k2's suffix changes nothing)."""
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2", "mse+", "k2+"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("low_var_kl", "k3"):
        return clamped_k3(logprob, ref_logprob)
    raise NotImplementedError(kl_penalty)


def suffixed_value(logprob, ref_logprob, kl_penalty):
    """The value a "+" spelling keeps: the estimate its name without the suffix gives."""
    if kl_penalty in ("kl+", "k1+"):
        return logprob - ref_logprob
    if kl_penalty == "abs+":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("low_var_kl+", "k3+"):
        return clamped_k3(logprob, ref_logprob)
    raise NotImplementedError(kl_penalty)


def clamped_k3(logprob, ref_logprob):
    """k3 = exp(-d) - 1 + d, with -d clamped to [-20, 20] and the result to [-10, 10]."""
    minus_d = (ref_logprob - logprob).clamp(min=-20, max=20)
    return (minus_d.exp() - minus_d - 1).clamp(min=-10, max=10)
