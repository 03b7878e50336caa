"""Shapes of KL code met in the thirteenth review (the eleventh fresh set).

Verdicts (kl-math.md section 8): k3 differentiated as a loss follows the forward KL (row 3, KL002); a
per-sequence token-mean of it gives 1/L weights (row 21, KL007).
"""

from __future__ import annotations

from snippets import module_codes

# torchtune's GRPOWithChunkedOutputLoss (joecummings/r1-zero): the policy's log-probs of the sampled tokens
# written as minus the per-token cross-entropy of the logits, a name the lint has no role for.
CROSS_ENTROPY = """\
import torch
import torch.nn.functional as F


def grpo_loss(pi_logits, targets, ref_logprobs, advantages, mask, kl_coeff=0.1):
    pi_out = -F.cross_entropy(pi_logits.reshape(-1, pi_logits.size(-1)).float(), targets.reshape(-1), reduction="none")
    pi_out = pi_out.view_as(targets)
    per_token_kl = torch.exp(ref_logprobs - pi_out) - (ref_logprobs - pi_out) - 1
    per_token_loss = -(torch.exp(pi_out - pi_out.detach()) * advantages[:, None] - kl_coeff * per_token_kl)
    return ((per_token_loss * mask).sum(1) / mask.sum(1)).mean()
"""


def test_minus_the_per_token_cross_entropy_is_the_policys_log_prob(tmp_path):
    """-F.cross_entropy(logits, tokens, reduction="none") = log pi(token): the k3 built from it is a loss
    (row 3, KL002) averaged per sequence (row 21, KL007)."""
    assert module_codes(CROSS_ENTROPY, tmp_path) == [(9, "KL002"), (9, "KL007")]


def test_a_reduced_cross_entropy_is_no_per_token_log_prob(tmp_path):
    """The default reduction ("mean") is an SFT loss over the batch, not the tokens' log-probs: no KL here."""
    reduced = CROSS_ENTROPY.replace(', reduction="none"', "")
    assert module_codes(reduced, tmp_path) == []
