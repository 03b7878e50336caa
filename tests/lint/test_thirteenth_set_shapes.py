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


# OpenRLHF 0.9's experience maker (richardodliu/OpenRLHF): the log-probs come back from Ray actors through
# object handles named after what they hold; `_ref` there means a Ray handle, not the reference model.
RAY_HANDLES = """\
import ray


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k2":
        log_ratio = log_ratio**2 / 2.0
    if kl_estimator == "k3":
        log_ratio = -log_ratio
        log_ratio = log_ratio.exp() - 1 - log_ratio
    return log_ratio


class Maker:
    def make(self, sequences, reward):
        action_log_probs_ref = self.actor.forward.remote(sequences)
        base_action_log_probs_ref = self.initial_model.forward.remote(sequences)
        action_log_probs = ray.get(action_log_probs_ref)
        base_action_log_probs = ray.get(base_action_log_probs_ref)
        kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=self.args.kl_estimator)
        rewards = reward - 0.1 * kl
        return rewards
"""


def test_what_a_ray_handle_holds_is_named_by_the_handle_without_its_ref(tmp_path):
    """ray.get(action_log_probs_ref) is the policy's log-probs, ray.get(base_action_log_probs_ref) the
    reference's: k2 and k3 in the reward (row 7, KL004, once per estimator)."""
    assert module_codes(RAY_HANDLES, tmp_path) == [(21, "KL004"), (21, "KL004")]
