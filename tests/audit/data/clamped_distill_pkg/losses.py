"""Distillation losses whose estimator is reached through a function check-grad cannot call alone (it reads a
settings object and the model's output dict, as verl 0.9's distillation losses do), and which clamp the
estimate outside that function: differentiated, or as the advantage of a policy gradient. check-grad audits
the estimator that function calls; the clamp belongs to the code around it (KL010 on the k1 reward)."""

from clamped_distill_pkg.estimators import kl_term


def estimator_losses(settings, outputs, batch):
    return kl_term(outputs["log_probs"], batch["teacher_log_probs"], settings.loss_mode)


def distillation_loss(settings, outputs, batch):
    losses = estimator_losses(settings, outputs, batch)
    if settings.loss_max_clamp is not None:
        losses = losses.clamp(min=-settings.loss_max_clamp, max=settings.loss_max_clamp)
    mask = batch["response_mask"]
    return (losses * mask).sum() / mask.sum()


def policy_gradient_loss(settings, outputs, batch):
    losses = estimator_losses(settings, outputs, batch)
    if settings.loss_max_clamp is not None:
        losses = losses.clamp(min=-settings.loss_max_clamp, max=settings.loss_max_clamp)
    advantages = -losses.detach()
    mask = batch["response_mask"]
    return -(advantages * outputs["log_probs"] * mask).sum() / mask.sum()
