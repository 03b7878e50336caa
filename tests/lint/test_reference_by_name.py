"""A helper that scores under no_grad, run on a model the analysis cannot name, stored under the reference's name.

svijayakumar2/PMV (seventy-eighth set) scores each response with `compute_log_probs_batch`, whose forward pass runs
under `torch.no_grad()`, so the analysis takes what it returns for the behaviour policy's log-probs (a rollout's).
Called on `base_prover.model` and stored as `ref_lp`, it is the reference's: the penalty `(new_lp - ref_lp).mean()`
in the loss is k1 differentiated (kl-math.md section 8, rows 1 and 16: KL001), not a trust region to the old policy.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

TRAINER = """\
import torch
import torch.nn.functional as F


def sequence_logprobs(model, ids):
    with torch.no_grad():
        logits = model(ids).logits[:, :-1]
    return F.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).sum(-1)


def live_logprobs(model, ids):
    logits = model(ids).logits[:, :-1]
    return F.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).sum(-1)


def update(policy, base, ids, advantages, optimizer, beta=0.1):
    ref_lp = sequence_logprobs(base.model, ids).detach()
    new_lp = live_logprobs(policy.model, ids)
    penalty = (new_lp - ref_lp).mean()
    total = -(advantages * new_lp).mean() + beta * penalty
    total.backward()
    optimizer.step()
"""


def test_a_no_grad_helpers_result_under_a_reference_name_is_the_reference(tmp_path):
    assert module_codes(TRAINER, tmp_path) == [(21, "KL001")]


@pytest.mark.parametrize("target", ["old_lp", "rollout_lp"])
def test_under_another_name_it_stays_the_rollouts(tmp_path, target):
    source = TRAINER.replace("ref_lp", target)
    assert (21, "KL001") not in module_codes(source, tmp_path)
