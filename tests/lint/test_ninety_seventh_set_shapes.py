"""Shapes of KL code met in the ninety-seventh fresh set.

ewijaya/gflownet-peptide writes k3 from the sampled tokens' probabilities with guards against zero:
`ratio = ref_p / (p + 1e-10)`, `ratio - log(ratio + 1e-10) - 1`. The guard in the log was read as nothing, the one in
the divisor was not, so the ratio was no ratio and its k3 loss (row 3, KL002) was silent.

Linxinrong8023/grpo-gspo-dapo_reproduce passes its losses a record, `batch.logprobs`, `batch.old_logprobs`,
`batch.ref_logprobs`. A field is read as a stored, detached value (a rollout's log-probs), so `batch.logprobs` had no
gradient and the k3 loss on it was a constant. The module takes `batch.logprobs - batch.old_logprobs`, the importance
log-ratio of a PPO loss: the field beside its behaviour-policy copy is the current policy's, with its gradient.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

PROBABILITIES = """\
import torch
import torch.nn.functional as F


def estimate_kl(ref_logits, logits, actions):
    ref_p = F.softmax(ref_logits, dim=-1).gather(-1, actions[..., None]).squeeze(-1)
    p = F.softmax(logits, dim=-1).gather(-1, actions[..., None]).squeeze(-1)
    ratio = ref_p / {divisor}
    return (ratio - torch.log(ratio + 1e-10) - 1.0).mean()


def compute_loss(model, ref_model, states, actions, adv):
    logits = model(states)
    with torch.no_grad():
        ref_logits = ref_model(states)
    logp = torch.log_softmax(logits, -1).gather(-1, actions[..., None]).squeeze(-1)
    kl_loss = 0.04 * estimate_kl(ref_logits, logits, actions)
    return -(logp.mean(1) * adv).mean() + kl_loss
"""


@pytest.mark.parametrize("divisor, codes", [
    ("(p + 1e-10)", [(17, "KL002")]),  # a guard against zero: the ratio of the probabilities still
    ("p", [(17, "KL002")]),
    ("(p + 0.5)", []),  # an offset that changes the value: no ratio the analysis knows
])
def test_a_probability_guarded_against_zero_in_a_divisor_still_makes_a_ratio(tmp_path, divisor, codes):
    assert module_codes(PROBABILITIES.format(divisor=divisor), tmp_path) == codes


RECORD_LOSS = """\
import torch


def compute_reference_kl(batch):
    log_ratio = batch.ref_logprobs - batch.logprobs
    return (torch.exp(log_ratio) - log_ratio - 1.0).mean()


def compute_loss(batch, beta=0.04):
    ratio = torch.exp({ratio})
    loss = -(ratio * batch.advantages).mean()
    return loss + beta * compute_reference_kl(batch)
"""


@pytest.mark.parametrize("ratio, codes", [
    ("batch.logprobs - batch.old_logprobs", [(12, "KL002"), (12, "KL008")]),  # k3 as a loss, off-policy (row 22)
    ("batch.logprobs - batch.old_log_probs", [(12, "KL002"), (12, "KL008")]),
    # no importance ratio to the field: a stored field, detached, as a rollout's log-probs are
    ("batch.logprobs", []),
    ("other.logprobs - batch.old_logprobs", []),  # another object's field says nothing of this one
])
def test_a_field_beside_its_behaviour_policy_copy_is_the_current_policys(tmp_path, ratio, codes):
    assert module_codes(RECORD_LOSS.format(ratio=ratio), tmp_path) == codes
