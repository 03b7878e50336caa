"""The actor's KL loss, with the estimator named in the configuration."""

from .core_algos import kl_penalty


def kl_loss(log_prob, ref_log_prob, response_mask, config):
    kld = kl_penalty(log_prob, ref_log_prob, kl_penalty=config.kl_loss_type)
    return (kld * response_mask).sum(-1).mean()
