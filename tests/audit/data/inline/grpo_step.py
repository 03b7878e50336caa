"""A GRPO-style training step that computes its KL penalty inline, between model calls.

The KL term is k3 of the policy against the reference; with `kl_importance_correction` it is
multiplied by the (token or sequence) importance ratio exp(logp - old logp). Nothing here can be
called alone: check-grad cuts the KL statements out of `training_step`.
"""

import torch


class StepTrainer:
    def __init__(self, model, ref_model, config):
        self.model = model
        self.ref_model = ref_model
        self.config = config
        self.kl_coef = config.kl_coef
        self.ratio_level = config.ratio_level

    def training_step(self, model, batch):
        per_token_logps = model(batch["input_ids"]).log_softmax(-1)
        with torch.no_grad():
            ref_per_token_logps = self.ref_model(batch["input_ids"]).log_softmax(-1)
        response_mask = batch["response_mask"]
        old_per_token_logps = batch.get("old_per_token_logps")
        old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps

        log_ratio = per_token_logps - old_per_token_logps
        if self.ratio_level == "token":
            log_weights = log_ratio
        elif self.ratio_level == "sequence":
            log_weights = (log_ratio * response_mask).sum(-1, keepdim=True)
        else:
            raise ValueError(self.ratio_level)
        ratio = torch.exp(log_weights)

        if self.kl_coef > 0:
            token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
            if self.config.kl_importance_correction:
                token_kl = token_kl * ratio

        policy_loss = -ratio * batch["advantages"]
        if self.kl_coef > 0:
            policy_loss = policy_loss + self.kl_coef * token_kl
        loss = (policy_loss * response_mask).sum() / response_mask.sum()
        loss.backward()
        return loss
