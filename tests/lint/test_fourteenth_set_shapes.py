"""Shapes of KL code met in the fourteenth review (the twelfth fresh set).

Verdicts (kl-math.md section 8): k3 with the ratio reversed, exp(logp - ref) - 1 - (logp - ref), as a
loss follows neither KL (row 5b, KL009).
"""

from __future__ import annotations

from snippets import module_codes

# RWKV-LM-RLHF's GRPO: the reversed k3 with a stabilizer inside the log, `ratio - log(ratio + 1e-10) - 1`.
STABILIZED = """\
import torch


def grpo_loss(logp, ref_logp, mask, advantages, beta=0.04):
    ratio = torch.exp(logp - ref_logp)
    kl = ratio - torch.log(ratio + {epsilon}) - 1
    loss = (-advantages + beta * kl) * mask
    return loss.sum() / mask.sum()
"""


def test_a_stabilizer_inside_the_log_is_read_as_nothing(tmp_path):
    """log(r + 1e-10) is log r wherever r matters: the reversed k3 as a loss (row 5b, KL009)."""
    assert module_codes(STABILIZED.format(epsilon="1e-10"), tmp_path) == [(7, "KL009")]


def test_a_constant_too_large_to_be_a_stabilizer_is_no_log_ratio(tmp_path):
    """log(r + 1) is log(1 + r), which no estimator of the catalog holds: no verdict, only the note that a
    KL term's form was not read (KL100, off by default)."""
    assert module_codes(STABILIZED.format(epsilon="1.0"), tmp_path) == [(5, "KL100")]
