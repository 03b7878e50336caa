"""A coefficient read from a configuration with a numeric default (`config.get("kl_penalty_coef", 0.0)`, as
OpenPipe ART 0.5's loss reads it) is a setting whose default is one of its values: a KL term it scales is
judged, where taking the default as the value made the term vanish (0.0 times the KL) and the lint silent.

Verdict (kl-math.md section 8, row 2): a detached k1 added to each token's own advantage, with no
reward-to-go, reaches only that token's score: the local gradient (PART), KL003.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

SAME_TOKEN_KL_ADVANTAGE = """\
    import torch


    def loss_fn(new_logprobs, old_logprobs, ref_logprobs, advantages, assistant_mask, experimental_config):
        prob_ratio = torch.exp(new_logprobs - old_logprobs)
        kl_penalty_coef = experimental_config.get("kl_penalty_coef", {default})
        if kl_penalty_coef > 0:
            kl_per_token = (new_logprobs - ref_logprobs).detach() * assistant_mask
            avg_kl = kl_per_token.sum() / (assistant_mask.sum() + 1e-6)
            advantages = advantages + kl_penalty_coef * (avg_kl - kl_per_token) * assistant_mask
        policy_loss = -(torch.clip(prob_ratio.detach(), 0.0, 4.0) * advantages * new_logprobs)
        return (policy_loss * assistant_mask).sum() / (assistant_mask.sum() + 1e-6)
"""


@pytest.mark.parametrize("default", ["0.0", "0", "0.1"])
def test_a_coefficient_read_with_a_numeric_default_keeps_the_kl_term(tmp_path, default):
    assert module_codes(SAME_TOKEN_KL_ADVANTAGE.format(default=default), tmp_path) == [(10, "KL003")]
