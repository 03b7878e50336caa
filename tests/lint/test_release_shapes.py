"""Shapes of KL code met in released packages that no corpus tree holds (OpenPipe ART 0.5.18, Trinity-RFT 0.6.0).

- A coefficient read from a configuration with a numeric default (`config.get("kl_penalty_coef", 0.0)`, as ART's
  loss reads it) is a setting whose default is one of its values: a KL term it scales is judged, where taking the
  default as the value made the term vanish (0.0 times the KL) and the lint silent.
- A per-token estimate written into a zeros buffer at the response's positions and returned reshaped like the mask
  (`out[valid] = jsd; return out.reshape_as(mask)`, Trinity's chunked JSD advantage) keeps its meaning.

Verdicts (kl-math.md section 8): a detached k1 added to each token's own advantage, with no reward-to-go,
reaches only that token's score: the local gradient (PART, row 2), KL003. Its negation, teacher minus student
log-probs taken as the divergence and subtracted from the advantage (Trinity's `lambda_coef == 1` branch), is a
bonus for moving away from the teacher: KL011.
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


CHUNKED_JSD_ADVANTAGE = """\
    import torch


    class JSDAdvantage:
        def per_token(self, student_logprobs, teacher_logprobs, response_mask):
            flat_s = student_logprobs.reshape(-1)
            flat_t = teacher_logprobs.reshape(-1)
            valid = response_mask.reshape(-1) > 0
            if self.lambda_coef == 0:
                jsd_valid = flat_s[valid] - flat_t[valid]
            else:
                jsd_valid = flat_t[valid] - flat_s[valid]
            out = flat_s.new_zeros(flat_s.shape)
            out[valid] = jsd_valid
            return out.reshape_as(response_mask)

        def __call__(self, exps):
            old_log_probs = exps.batch["old_log_probs"]
            teacher_log_probs = exps.batch["teacher_logprobs"]
            response_mask = exps.batch["response_mask"]
            advantages = -self.kl_coef * self.per_token(old_log_probs, teacher_log_probs, response_mask)
            exps.batch["advantages"] = advantages * response_mask
            return exps
"""


def test_an_estimate_scattered_into_a_buffer_and_reshaped_like_the_mask_is_followed(tmp_path):
    assert module_codes(CHUNKED_JSD_ADVANTAGE, tmp_path) == [(21, "KL003"), (21, "KL011")]
