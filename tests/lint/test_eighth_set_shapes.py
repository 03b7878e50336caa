"""Shapes of KL code met in the eighth review (modelscope's twinkle): log-probs a loss reads from the model's
outputs with `.get`.

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
