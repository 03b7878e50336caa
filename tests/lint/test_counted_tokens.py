"""A loss divided by `len(...)` of the tokens it sums: the count of one sequence's tokens is that sequence's length.

zhongruikang81-sudo/zppo-grpo-sandbox-pipeline (eighty-second set) trains one rollout at a time: it picks the
response's tokens with a mask (`active = per_token_logps[loss_mask]`), adds beta * k3 to the clipped surrogate per
token and divides the sum by `len(active) * G`. Each rollout's KL is averaged over its own length: the 1/L weights
of kl-math.md section 8 row 21 (KL007) beside the k3 loss (row 3, KL002). The group size G only scales it. Over
a whole batch picked by a mask the count is the batch's tokens, a token mean with no 1/L weight; `len` of a batch
of sequences is their number, no count of tokens.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

ONE_ROLLOUT_AT_A_TIME = """\
import torch


def train(model, ref_model, rollouts, advantages, optimizer, beta, G):
    for i, rollout in enumerate(rollouts):
        ids = rollout.unsqueeze(0)
        logps = model(ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            ref = ref_model(ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        mask = ids[0, 1:] != 0
        active = logps[mask]
        active_ref = ref[mask]
        kl = torch.exp(active_ref - active) - (active_ref - active) - 1
        token_loss = -active * advantages[i] + beta * kl
        loss = token_loss.sum() / DIVISOR
        loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("divisor, codes", [
    ("(len(active) * G)", [(14, "KL002"), (14, "KL007")]),  # each rollout's own length, times the group size
    ("len(active)", [(14, "KL002"), (14, "KL007")]),
    ("G", [(14, "KL002")]),  # a constant: a token sum
])
def test_a_rollout_divided_by_its_own_token_count(tmp_path, divisor, codes):
    assert module_codes(ONE_ROLLOUT_AT_A_TIME.replace("DIVISOR", divisor), tmp_path) == codes


BATCH = """\
import torch


def loss_fn(logps, ref, mask, advantages, beta):
    active = logps[mask]
    active_ref = ref[mask]
    kl = torch.exp(active_ref - active) - (active_ref - active) - 1
    token_loss = -active * advantages[mask] + beta * kl
    return token_loss.sum() / DIVISOR
"""


@pytest.mark.parametrize("divisor", ["len(active)", "len(logps)"])
def test_a_batch_count_is_no_sequence_length(tmp_path, divisor):
    # the batch's tokens picked into one row: their count is a token mean; len of the batch, its sequences
    assert module_codes(BATCH.replace("DIVISOR", divisor), tmp_path) == [(8, "KL002")]
