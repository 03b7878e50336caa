"""Shapes of KL code met in the sixty-ninth and seventieth fresh sets.

wuwowuyi/DPO-and-GRPO-implementation's GRPO forms k3 = r - 1 - log r per token and returns
`torch.maximum(kl, torch.zeros_like(kl))`, since rounding makes some values slightly negative. k3 is never negative
in exact arithmetic, so the larger of it and 0 is k3 itself: added to the loss it is row 3 of kl-math.md section 8
(KL002); so with k2, a per-token loss (row 2, KL003). The larger of 0 and a k1 log-ratio, which is negative on half the tokens, is a hinge, no estimator.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

CLAMPED_AT_ZERO = """\
import torch


class GRPO:
    def kl_divergence(self, logp, logp_ref):
        kl = torch.exp(logp_ref - logp) - (logp_ref - logp) - 1
        return torch.maximum(kl, torch.zeros_like(kl))

    def compute_loss(self, responses, rewards, logp_ref):
        logp = self.log_prob(responses)
        ratio = torch.exp(logp - logp.detach())
        kl = self.kl_divergence(logp, logp_ref)
        loss = self.config["kl_coef"] * kl - rewards * ratio
        mask = (responses != 0).int()
        return (loss * mask).sum() / mask.sum()
"""


@pytest.mark.parametrize("estimate, codes", [
    ("torch.exp(logp_ref - logp) - (logp_ref - logp) - 1", [(13, "KL002")]),  # k3: never negative, itself
    ("0.5 * (logp - logp_ref) ** 2", [(13, "KL003")]),  # k2: never negative, itself: a per-token loss (row 2)
    ("logp - logp_ref", []),  # k1: relu(k1) is a hinge, no estimator
])
def test_the_larger_of_a_never_negative_estimate_and_zero_is_the_estimate(tmp_path, estimate, codes):
    source = CLAMPED_AT_ZERO.replace("torch.exp(logp_ref - logp) - (logp_ref - logp) - 1", estimate)
    assert module_codes(source, tmp_path) == codes
