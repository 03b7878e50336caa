"""Shapes of KL code met in the eighth review (modelscope's twinkle, InternBootcamp): log-probs a loss reads
from the model's outputs with `.get`, and a switch read from a configuration with a default.

Verdicts (kl-math.md section 8): k3 differentiated as a loss follows the forward KL (row 3, KL002); averaged
per sequence it weights each by 1/L (row 21, KL007).
"""

from __future__ import annotations

import pytest
from snippets import module_codes

# twinkle's GRPOLoss.__call__: the policy's log-probs from the forward pass's outputs, the reference's passed in
LOSS_READING_THE_MODEL_OUTPUTS = """\
    import torch


    class GRPOLoss:
        def __call__(self, inputs, outputs, *, ref_logps=None, advantages=None):
            logps = {read}
            loss_mask = inputs["labels"] != -100
            ratio = torch.exp(logps - logps.detach())
            per_token_loss = -ratio * advantages
            if self.beta > 0.0 and ref_logps is not None:
                per_token_kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
                per_token_loss = per_token_loss + self.beta * per_token_kl
            return ((per_token_loss * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1.0)).mean()
    """


@pytest.mark.parametrize("read, codes", [
    ('outputs.get("logps")', [(12, "KL002"), (12, "KL007")]),  # the forward pass's: with gradient
    ('outputs["logps"]', [(12, "KL002"), (12, "KL007")]),  # read either way
])
def test_log_probs_read_from_the_model_outputs_carry_the_gradient(tmp_path, read, codes):
    assert module_codes(LOSS_READING_THE_MODEL_OUTPUTS.format(read=read), tmp_path) == codes


# InternBootcamp's xPuyu GRPO step: the estimator picked by `args.get("kl_type", "unbias")`
SWITCH_READ_WITH_A_DEFAULT = """\
    import torch


    def step(args, logprobs, ref_logprobs, loss_factor):
        kl_type = {read}
        if kl_type == "kl":
            kl_loss = (args.kl_coef * (logprobs - ref_logprobs)).sum() * loss_factor
        elif kl_type == "unbias":
            kl = ref_logprobs - logprobs
            kl_loss = (args.kl_coef * (torch.exp(kl) - kl - 1)).sum() * loss_factor
        else:
            kl_loss = (args.kl_coef * (ref_logprobs - logprobs).square() / 2).sum() * loss_factor
        return kl_loss
    """


@pytest.mark.parametrize("read", ['args.get("kl_type", "unbias")', "args.kl_type"])
def test_a_switch_read_with_a_default_keeps_every_branch(tmp_path, read):
    # the default is one value of the configuration, not the only one: k1 (row 1), k3 (row 3), k2 (row 2)
    codes = module_codes(SWITCH_READ_WITH_A_DEFAULT.format(read=read), tmp_path)
    assert codes == [(7, "KL001"), (10, "KL002"), (12, "KL003")]
