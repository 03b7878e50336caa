"""Shapes of KL code met in the sixty-seventh and sixty-eighth fresh sets' reviews.

zhangsscc99/RLHF_GRPO keeps a dependency-free copy of a GRPO loss for smoke tests: every log-prob goes
through the builtin `float()` before verl's low-variance KL (k3) is formed with `math.exp`, so nothing of it
holds a gradient and nothing is trained (no row of kl-math.md section 8 applies). A Python number made of a
tensor, `float(kl)`, added to a tensor loss reaches it without its gradient (KL001), as `.item()` does.
"""

from __future__ import annotations

from snippets import module_codes

NUMBERS = """\
import math
import torch


def smoke_loss(samples, beta):
    rows = []
    for sample in samples:
        delta = float(sample.ref_logprob) - float(sample.new_logprob)
        kl = math.exp(delta) - delta - 1.0
        ratio = math.exp(float(sample.new_logprob) - float(sample.old_logprob))
        total = -ratio * sample.advantage + beta * kl
        rows.append(total)
    return rows


def train_loss(logprobs, ref_logprobs, advantages, beta):
    ratio = torch.exp(logprobs - logprobs.detach())
    kl = (logprobs - ref_logprobs).mean()
    loss = -(ratio * advantages).mean() + beta * float(kl)
    return loss
"""


def test_a_kl_of_python_numbers_trains_nothing_and_one_added_to_a_tensor_loss_has_no_gradient(tmp_path):
    assert module_codes(NUMBERS, tmp_path) == [(19, "KL001")]
    # the same smoke loss on tensors is a k3 loss (row 3), reported: the builtin float() is what ends it
    tensors = NUMBERS.replace("float(sample.ref_logprob)", "sample.ref_logprob").replace(
        "float(sample.new_logprob)", "sample.new_logprob").replace("math.exp", "torch.exp")
    assert "KL002" in {code for _, code in module_codes(tensors, tmp_path)}
