"""Shapes of KL code met in the hundred-and-second fresh set.

Mantissagithub/alphazero_llm_trainer encodes one trajectory's text at a time inside a loop (`inputs =
tokenizer(text, return_tensors="pt")`, a batch of one) and takes `F.kl_div(..., reduction="batchmean")` of its
[1, L, V] log-probs: divided by the batch dimension, 1, that is the sequence's token sum, not its token mean. The
batch of one was read only where the whole function encodes one text, so a loop that does gave a false KL007.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

LOOP_OVER_TEXTS = """\
import torch
import torch.nn.functional as F


def train_step(model, ref_model, tokenizer, optimizer, trajectories, advantages, kl_weight):
    total_loss = 0.0
    for traj, advantage in zip(trajectories, advantages):
        inputs = tokenizer(traj["text"], return_tensors="pt")
        logits = model(**inputs).logits[:, :-1, :]
        log_probs = F.log_softmax(logits, dim=-1)
        ids = inputs["input_ids"][:, 1:]
        pg_loss = -(log_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1).mean() * advantage)
        with torch.no_grad():
            ref_log_probs = F.log_softmax(ref_model(**inputs).logits[:, :-1, :], dim=-1)
        kl = F.kl_div(ref_log_probs, log_probs, reduction="{reduction}", log_target=True)
        total_loss = total_loss + pg_loss + kl_weight * kl
    total_loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("reduction, codes", [
    ("batchmean", [(16, "KL003")]),  # the exact KL as a loss (row 2), each text's [1, L, V] divided by 1: a token sum
    ("mean", [(16, "KL003"), (16, "KL007")]),  # divided by L * V: each text's token mean, 1/L (row 21)
])
def test_batchmean_of_a_text_a_loop_encodes_is_a_token_sum(tmp_path, reduction, codes):
    assert module_codes(LOOP_OVER_TEXTS.format(reduction=reduction), tmp_path) == codes
