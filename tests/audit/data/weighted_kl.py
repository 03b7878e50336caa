"""A KL loss weighted per token by `loss_weights` (the response mask over the batch's token count), as
xtuner writes its kl_penalty."""


def kl_penalty(logprobs, ref_logprobs, loss_weights, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        loss = logprobs - ref_logprobs
    elif kl_penalty in ("mse", "k2"):
        loss = 0.5 * (logprobs - ref_logprobs).square()
    else:
        raise NotImplementedError
    return (loss * loss_weights.to(loss.dtype)).sum()
