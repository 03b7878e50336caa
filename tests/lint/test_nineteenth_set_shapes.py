"""Shapes of KL code met in the nineteenth review (the eighteenth fresh set).

Verdicts (kl-math.md section 8): the square of each token's log-ratio is k2 as a loss, row 2 (KL003); the
square of each sequence's summed log-ratio, D^2, differentiated is row 17 (the reverse KL's gradient, right).
"""

from __future__ import annotations

from snippets import module_codes

# A hand-written GRPO: the policy's and the reference's log-probs picked from the vocabulary by indexing with the
# token ids (a gather), then (logp - ref)^2 as the loss: k2 per token; summed over each sequence first, D^2.
PICKED = """\
import torch


def compute_logprobs(model, input_ids, start):
    log_probs = torch.log_softmax(model(input_ids).logits, dim=-1)
    return log_probs[0, torch.arange(start, input_ids.shape[1]), input_ids[0, start:]]


def train(model, ref_model, optim, input_ids, start, advantages, beta):
    logprobs_new = compute_logprobs(model, input_ids, start)
    with torch.no_grad():
        logprobs_ref = compute_logprobs(ref_model, input_ids, start)
    kl = logprobs_new - logprobs_ref
    loss = -(advantages * logprobs_new).mean() + beta * (kl ** 2).mean()
    optim.zero_grad()
    loss.backward()
    optim.step()
"""


def test_indexing_vocabulary_log_probs_by_the_token_ids_is_a_gather(tmp_path):
    assert module_codes(PICKED, tmp_path) == [(14, "KL003")]


def test_log_probs_picked_by_the_token_ids_and_summed_over_the_sequence_are_its_log_probability(tmp_path):
    summed = PICKED.replace("input_ids[0, start:]]", "input_ids[0, start:]].sum(-1)")
    assert module_codes(summed, tmp_path) == []
