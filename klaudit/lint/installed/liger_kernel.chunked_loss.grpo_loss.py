"""klaudit's model of Liger-Kernel's fused GRPO loss (`liger_kernel.chunked_loss.grpo_loss`), as of liger-kernel 0.8.

Read by the lint, never imported or run (see verl.trainer.ppo.core_algos beside it). The loss projects the hidden
states through the language-model head itself, takes log pi of the chosen tokens, and per token adds to the clipped
policy-gradient term beta times k3 = exp(log ref - log pi) - (log ref - log pi) - 1, a term with a gradient through
log pi (k3 used as a loss, unless beta is 0). `loss_type` says how the token losses become one number: "grpo" (and
"sapo") average each sequence over its own tokens, then over the sequences; "bnpo" and "dapo" (the default) divide
the batch's sum by its token count; "dr_grpo" divides by batch size times `max_completion_length`.
"""

import torch


class LigerFusedLinearGRPOLoss(torch.nn.Module):
    """The clipped GRPO loss plus beta * k3, computed from hidden states and the head's weight."""

    def __init__(self, beta=0.04, loss_type="dapo", max_completion_length=None, temperature=1.0, **options):
        super().__init__()
        self.beta = beta
        self.loss_type = loss_type
        self.max_completion_length = max_completion_length
        self.temperature = temperature

    def forward(self, _input, lin_weight, selected_token_ids, attention_mask, advantages, bias=None,
                ref_per_token_logps=None, old_per_token_logps=None, ref_input=None, ref_weight=None, ref_bias=None,
                **options):
        """(loss, metrics): the token losses (clipped ratio times advantage, plus beta * k3) reduced as
        `loss_type` says."""
        logits = (_input @ lin_weight.t()) / self.temperature
        per_token_logps = logits.log_softmax(-1).gather(-1, selected_token_ids.unsqueeze(-1)).squeeze(-1)
        if ref_per_token_logps is None:
            with torch.no_grad():
                ref_logits = (ref_input @ ref_weight.t()) / self.temperature
                ref_per_token_logps = ref_logits.log_softmax(-1).gather(
                    -1, selected_token_ids.unsqueeze(-1)).squeeze(-1)
        if old_per_token_logps is None:
            old_per_token_logps = per_token_logps.detach()
        ratio = torch.exp(per_token_logps - old_per_token_logps)
        clipped = torch.clamp(ratio, 0.8, 1.2)
        per_token_loss = -torch.min(ratio * advantages.unsqueeze(1), clipped * advantages.unsqueeze(1))
        if self.beta != 0.0:
            delta = ref_per_token_logps - per_token_logps
            kl_div = torch.exp(delta) - delta - 1.0
            per_token_loss = per_token_loss + self.beta * kl_div
        if self.loss_type in ("grpo", "sapo"):
            per_sequence = (per_token_loss * attention_mask).sum(-1) / attention_mask.sum(-1).clamp(min=1.0)
            loss = per_sequence.mean()
        elif self.loss_type == "dr_grpo":
            loss = (per_token_loss * attention_mask).sum() / (attention_mask.shape[0] * self.max_completion_length)
        else:
            loss = (per_token_loss * attention_mask).sum() / attention_mask.sum().clamp(min=1.0)
        return loss, []
